"""An agent's return to its main chat after its sub-agents ran, on `snapcache serve --parallel N`.

Real server processes on loopback ports, the real `openai` client, Gemma-3-270M (a sliding-window
model: a restore point exists only where a read stopped and stored it). Two sessions read their main
chats at once, then two sub-agent chats (the same system prompt) at once, then each main chat comes
back with one more turn. Each return restores at least what it restores on a `--parallel 1` server.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_process import ServerProcess, running_server

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.model, pytest.mark.gemma, pytest.mark.slow]

SYSTEM = "You are a coding agent working in a large repository. Keep answers short."
WORK = "Read the module, list its public functions, then explain which one the failing test calls. "
Chat = list[dict[str, str]]


def main_chats() -> tuple[Chat, Chat]:
    """Session A's chat (about 950 Gemma tokens) and session B's (about 360)."""
    return (
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Session A. " + WORK * 40}],
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Session B. " + WORK * 15}],
    )


def sub_agents() -> tuple[Chat, Chat]:
    return tuple(  # type: ignore[return-value]
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Sub-agent {i}. " + WORK * 9}]
        for i in (1, 2)
    )


def returning(chat: Chat) -> Chat:
    return [*chat, {"role": "assistant", "content": "I read it."}, {"role": "user", "content": "Now fix it."}]


def cached_tokens(server: ServerProcess, chat: Chat) -> int:
    api = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
    result = api.chat.completions.create(model="m", messages=chat, temperature=0, max_tokens=4)
    assert result.usage is not None
    details = result.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def at_once(server: ServerProcess, chats: tuple[Chat, ...]) -> list[int]:
    with ThreadPoolExecutor(len(chats)) as pool:
        return list(pool.map(lambda chat: cached_tokens(server, chat), chats))


def returns(model: Path, folder: Path, parallel: int) -> list[int]:
    """What each session's return to its main chat restores (A, B) on a fresh `--parallel` server."""
    with running_server(
        model, folder / f"cache-{parallel}", folder / f"serve-{parallel}.log", "--parallel", str(parallel)
    ) as server:
        mains = main_chats()
        at_once(server, mains)
        at_once(server, sub_agents())
        return at_once(server, tuple(returning(chat) for chat in mains))


def test_each_return_to_a_main_chat_restores_what_it_restores_one_at_a_time(
    gemma_model_path: Path, tmp_path: Path
) -> None:
    alone = returns(gemma_model_path, tmp_path, 1)
    # the turns before were stored
    assert alone[0] > 512, alone
    assert alone[1] >= 256, alone
    for parallel in (2, 4):
        batched = returns(gemma_model_path, tmp_path, parallel)
        assert all(b >= a for a, b in zip(alone, batched, strict=True)), (parallel, batched, alone)
