"""Batching never makes the cache forget (the scheduler's promise, docs/how-it-works/architecture.md).

Random agent workloads on the tiny sliding-window model (gemma2, a 48-token window): sessions grow a
main chat turn by turn, hand work to sub-agents (the same system prompt, a message of their own) and
come back to the main chat. The requests run in waves of concurrent requests on a `BatchedLlama`
of N sequences, and again one at a time, in the same order, on a single-sequence `CachedLlama` (what
`snapcache serve --parallel 1` runs). Every request restores at least as many prompt tokens batched
as one at a time, but for the tail past a prompt's stored end that the one context still holds when
the very next request continues it (`LIVE_TAIL`): the scheduler may have run that prompt earlier,
or be reading it still, and given its sequence to another request meanwhile. The tiny llama has no
window: a live prefix can always be cut back there, so it could not show a restore point that a
read skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_model import write_tiny_model

from snapcache.llama.batch import BatchedLlama, Scheduler
from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.stored.checkpoints import CHECKPOINT_ALIGN, FINAL_TAIL_TOKENS
from snapcache.store import SnapshotStore

pytestmark = [pytest.mark.model, pytest.mark.slow]

N_CTX = 4096
SYSTEMS = (
    "You are a coding agent. Read the task, plan the change, edit the files, run the tests. " * 3,
    "You are a research assistant. Cite your sources, keep answers short, never guess. " * 3,
)
# Greedy, a few tokens; no byte above 0x7F (the byte vocabulary's tokens 3 + byte): a random model's
# reply could otherwise end inside a UTF-8 character, which llama-cpp-python reads on to complete.
# What a context holds live past the prompt end its last request stored: the final tail, on a grid
# of up to 64 tokens (`checkpoints.FINAL_TAIL_TOKENS`).
LIVE_TAIL = FINAL_TAIL_TOKENS + CHECKPOINT_ALIGN - 1
OPTIONS: dict[str, Any] = {
    "temperature": 0.0,
    "max_tokens": 3,
    "logit_bias": {3 + byte: -100.0 for byte in range(0x80, 0x100)},
}


@dataclass
class Session:
    """One agent: its system prompt, its main chat so far, and how many sub-agents it ran."""

    system: str
    main: list[dict[str, str]] = field(default_factory=list)
    turns: int = 0
    subs: int = 0


def main_turn(session: Session, index: int) -> list[dict[str, str]]:
    """The session's main chat with one more user turn (the previous answer fixed, so that both runs
    send the same prompts whatever the model says)."""
    if session.turns:
        session.main.append({"role": "assistant", "content": f"Done with step {session.turns} of {index}."})
    session.turns += 1
    text = f"Session {index}, turn {session.turns}: " + "look at the failing test and fix it. " * 4
    session.main.append({"role": "user", "content": text})
    return [{"role": "system", "content": session.system}, *session.main]


def sub_agent(session: Session, index: int) -> list[dict[str, str]]:
    session.subs += 1
    text = f"Sub-agent {session.subs} of session {index}: " + f"search the code for item {session.subs}. " * 5
    return [{"role": "system", "content": session.system}, {"role": "user", "content": text}]


@st.composite
def workloads(draw: st.DrawFn) -> list[list[list[dict[str, str]]]]:
    """Waves of chats: each wave's requests run at once; a session's main turn waits for its last.
    Every session reads its main chat first and comes back to it last."""
    n_sessions = draw(st.integers(1, 3))
    sessions = [Session(draw(st.sampled_from(SYSTEMS))) for _ in range(n_sessions)]
    waves = [draw(st.permutations([main_turn(session, i) for i, session in enumerate(sessions)]))]
    for _ in range(draw(st.integers(1, 4))):
        mains = draw(st.sets(st.integers(0, n_sessions - 1), max_size=n_sessions))
        subs = draw(st.lists(st.integers(0, n_sessions - 1), max_size=3))
        wave = [main_turn(sessions[i], i) for i in sorted(mains)] + [sub_agent(sessions[i], i) for i in subs]
        if wave:
            waves.append(draw(st.permutations(wave)))
    waves.append([main_turn(session, i) for i, session in enumerate(sessions)])  # the return
    return waves


@pytest.fixture(scope="module")
def swa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("gemma2") / "tiny-gemma2.gguf", "gemma2")


@pytest.fixture(scope="module", params=[True, False], ids=["full-size window cache", "window-sized cache"])
def llamas(
    request: pytest.FixtureRequest, llama_factory: Any, swa_model: Path
) -> Iterator[tuple[llama_cpp.Llama, llama_cpp.Llama]]:
    """A Llama for the scheduler and one for the single-sequence run, with llama-cpp-python's
    full-size sliding-window cache or a window-sized one (`--swa-cache window`)."""
    pair = tuple(llama_factory(swa_model, n_ctx=N_CTX, swa_full=request.param) for _ in range(2))
    yield pair
    for llm in pair:
        llm.close()


def cached_tokens(response: dict[str, Any]) -> int:
    return int(response["usage"]["prompt_tokens_details"]["cached_tokens"])


def one_at_a_time(llm: llama_cpp.Llama, waves: list[list[list[dict[str, str]]]]) -> list[tuple[int, bool]]:
    """Per request: the prompt tokens it restored, and whether they were the context's own (live)."""
    llm.reset()
    restored: list[tuple[int, bool]] = []
    with SnapshotStore(None, ram_bytes=1 << 30) as store:
        cached = CachedLlama(llm, store, "agents")
        for chat in (chat for wave in waves for chat in wave):
            n_tokens = cached_tokens(cached.create_chat_completion(messages=chat, **OPTIONS))
            last = cached.last_restore
            restored.append((n_tokens, last is not None and last.source == "context"))
    return restored


def batched(llm: llama_cpp.Llama, waves: list[list[list[dict[str, str]]]], n_seq: int) -> list[int]:
    """Each wave's chats asked at once, submitted in their order (as the single-sequence run reads them)."""
    restored: list[int] = []
    with SnapshotStore(None, ram_bytes=1 << 30) as store, Scheduler(llm, store, n_seq=n_seq) as scheduler:
        model = BatchedLlama(scheduler, scope="agents")
        for wave in waves:
            got: list[int] = [0] * len(wave)

            def run(i: int, chat: list[dict[str, str]], got: list[int] = got) -> None:
                got[i] = cached_tokens(model.create_chat_completion(chat, **OPTIONS))

            threads = []
            for i, chat in enumerate(wave):
                before = model.last_request("agents")
                threads.append(threading.Thread(target=run, args=(i, chat)))
                threads[-1].start()
                while model.last_request("agents") is before:  # submitted: the next one comes after it
                    time.sleep(0.001)
            for thread in threads:
                thread.join(120)
            restored += got
    return restored


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(waves=workloads(), n_seq=st.sampled_from([2, 4]))
def test_every_request_restores_at_least_what_it_restores_one_at_a_time(
    llamas: tuple[llama_cpp.Llama, llama_cpp.Llama], waves: list[list[list[dict[str, str]]]], n_seq: int
) -> None:
    scheduled, single = llamas
    alone = one_at_a_time(single, waves)
    together = batched(scheduled, waves, n_seq)
    short = [
        (i, restored, alone_restored)
        for i, (restored, (alone_restored, live)) in enumerate(zip(together, alone, strict=True))
        if restored < alone_restored - (LIVE_TAIL if live else 0)
    ]
    assert not short, f"(request, restored batched, one at a time): {short}"
    # every return to a main chat restores its earlier turns
    assert all(restored > 0 for restored in together[-len(waves[-1]) :]), together
