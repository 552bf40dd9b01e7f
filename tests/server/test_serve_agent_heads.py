"""An agent's head — its system prompt and its tools — is kept for every new conversation (issue 54).

Random sequences of conversations, interleaved turn by turn, against real `snapcache serve` processes
driven by the real `openai` and `anthropic` clients: each conversation speaks one dialect (Chat
Completions, Responses or Messages), has one of two system prompts and none, one or two function
tools, and takes one to four turns; a later turn sends back a tool call and its result, or an answer
and another question. Every request whose head (dialect, system prompt, tools) an earlier request
of its scope already read restores at least that head: as much as a second conversation restores
right after a first one (measured once per head, in a scope of its own), or, where the prompt ends
too close past that point for a restore to start there, or every earlier prompt of the head did
for a read to stop and store it (fewer tokens than the shortest piece a batch is read in:
`ReadGrid`), the last checkpoint before it that leaves them; on a grid finer than the blocks, less
a piece of a batch (where a head's second point lies). Before the fix, a
conversation's second turn superseded the only record at the head's end (where the head and the
first prompt's end fell on one point), and the next new conversation read its head cold.

On the tiny sliding-window model (gemma2, a 48-token window: a state restores only where a read
stored it) with the generic tool format, on a tiny llama whose template places the tools itself
(Qwen's: the model's own format), and on Gemma-3-270M; at `--parallel 1` and 4.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from server_process import ServerProcess, running_server
from tiny_model import write_tiny_model
from tool_models import QWEN_SPECIALS, write_template_model

from snapcache.llama.stored.checkpoints import CHECKPOINT_ALIGN
from snapcache.llama.stored.read_grid import MIN_PIECE_TOKENS

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

pytestmark = [pytest.mark.model, pytest.mark.slow]

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
SYSTEMS = (
    "You are a desktop agent. You search the user's files, open them and summarize what they hold. "
    "Answer briefly and name the files you used. " * 5,
    "You are a research assistant. Cite the documents you read, keep answers short, never guess. " * 5,
    "",  # none: a head of tools alone (rendered before the first user turn by a template that places them)
)
TOOLS = (
    {
        "name": "search_files",
        "description": "Search the user's files for a phrase.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
    {
        "name": "open_file",
        "description": "Open one file by its path.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
)
TOOL_SETS = ((), TOOLS[:1], TOOLS)
DIALECTS = ("chat", "responses", "messages")
MAX_TOKENS = 3
# Each example is a dozen requests to a server: a failing one is reported as drawn, not shrunk.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)


@dataclass
class Conversation:
    """One conversation of an agent: its head, and its turns so far as (kind, text) pieces."""

    dialect: str
    system: int
    tools: int
    turns: int
    number: int
    question: int = 40  # its first question's length in characters
    pieces: list[tuple[str, str]] = field(default_factory=list)

    @property
    def head(self) -> tuple[str, int, int]:
        return self.dialect, self.system, self.tools

    def next_turn(self, with_call: bool) -> None:
        """Add the next turn: the first question, or the last turn's answer (a tool call and its
        result, where the conversation has tools and `with_call`) and another question."""
        n = sum(kind == "user" for kind, _ in self.pieces)
        if n and with_call and self.tools:
            tool = TOOL_SETS[self.tools][n % self.tools]["name"]
            self.pieces += [("call", tool), ("result", f"Found 3 files for call {n} of {self.number}.")]
        elif n:
            self.pieces += [("assistant", f"Done with step {n}."), ("user", f"Now step {n + 1}, please.")]
        else:
            asked = f"{self.number}: where did I save the invoice from the plumber, and when did I pay it?"
            self.pieces.append(("user", asked[: self.question]))


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[Conversation, bool]]:
    """Conversations, and the order their turns go in (each turn: its conversation, with a call).
    The conversations share one or two heads, as an agent's sessions and sub-agents do."""
    head = st.tuples(
        st.sampled_from(DIALECTS), st.integers(0, len(SYSTEMS) - 1), st.integers(0, len(TOOL_SETS) - 1)
    )
    heads = draw(st.lists(head, min_size=1, max_size=2, unique=True))
    conversations = [
        Conversation(
            *draw(st.sampled_from(heads)),
            turns=draw(st.integers(1, 4)),
            number=number,
            # A short question puts the prompt's end point where the head's is, on a coarse grid.
            question=draw(st.one_of(st.integers(1, 12), st.integers(1, 80))),
        )
        for number in range(draw(st.integers(2, 6)))
    ]
    left = {id(c): c.turns for c in conversations}
    order: list[tuple[Conversation, bool]] = []
    while any(left.values()):
        conversation = draw(st.sampled_from([c for c in conversations if left[id(c)]]))
        left[id(conversation)] -= 1
        order.append((conversation, draw(st.booleans())))
    return order


def cached_tokens(
    server: ServerProcess, scope: str, conversation: Conversation, system: str | None = None
) -> tuple[int, int]:
    """Send the conversation so far in its dialect (with another `system` prompt where given);
    (prompt tokens, restored tokens) of the answer."""
    headers = {"X-Snapcache-Scope": scope}
    system = SYSTEMS[conversation.system] if system is None else system
    tools = TOOL_SETS[conversation.tools]
    if conversation.dialect == "messages":
        claude = anthropic.Anthropic(
            base_url=server.base_url, api_key="unused", max_retries=0, default_headers=headers
        )
        message = claude.messages.create(
            model="m",
            **({"system": system} if system else {}),
            messages=_as_messages(conversation.pieces),
            max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},
            **({"tools": [_anthropic_tool(t) for t in tools]} if tools else {}),
        )
        read = message.usage.input_tokens
        restored = message.usage.cache_read_input_tokens or 0
        return read + restored, restored
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, default_headers=headers)
    if conversation.dialect == "responses":
        response = client.responses.create(
            model="m",
            **({"instructions": system} if system else {}),
            input=_as_responses_input(conversation.pieces),
            max_output_tokens=MAX_TOKENS,
            temperature=0,
            **({"tools": [{"type": "function", **t} for t in tools]} if tools else {}),
        )
        assert response.usage is not None
        return response.usage.input_tokens, response.usage.input_tokens_details.cached_tokens
    result = client.chat.completions.create(
        model="m",
        messages=[
            *([{"role": "system", "content": system}] if system else []),
            *_as_chat(conversation.pieces),
        ],
        max_tokens=MAX_TOKENS,
        temperature=0,
        **({"tools": [{"type": "function", "function": t} for t in tools]} if tools else {}),
    )
    assert result.usage is not None
    details = result.usage.prompt_tokens_details
    return result.usage.prompt_tokens, int(details.cached_tokens or 0) if details is not None else 0


def _call_ids() -> Iterator[str]:
    return (f"call_{i}" for i in itertools.count())


def _as_chat(pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
    ids, messages = _call_ids(), []
    call_id = ""
    for kind, text in pieces:
        if kind == "call":
            call_id = next(ids)
            function = {"name": text, "arguments": json.dumps({"query": "invoice"})}
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": call_id, "type": "function", "function": function}],
                }
            )
        elif kind == "result":
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            messages.append({"role": kind, "content": text})
    return messages


def _as_responses_input(pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
    ids, items = _call_ids(), []
    call_id = ""
    for kind, text in pieces:
        if kind == "call":
            call_id = next(ids)
            arguments = json.dumps({"query": "invoice"})
            items.append({"type": "function_call", "call_id": call_id, "name": text, "arguments": arguments})
        elif kind == "result":
            items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        else:
            items.append({"role": kind, "content": text})
    return items


def _as_messages(pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
    ids, messages = _call_ids(), []
    call_id = ""
    for kind, text in pieces:
        if kind == "call":
            call_id = next(ids)
            use = {"type": "tool_use", "id": call_id, "name": text, "input": {"query": "invoice"}}
            messages.append({"role": "assistant", "content": [use]})
        elif kind == "result":
            result = {"type": "tool_result", "tool_use_id": call_id, "content": text}
            messages.append({"role": "user", "content": [result]})
        else:
            messages.append({"role": kind, "content": text})
    return messages


def _anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}


class HeadRestores:
    """How many tokens a new conversation restores from the store alone once another with the same
    head was read, on a `--parallel 1` server of its own (each head measured once, in a scope of its
    own): a first conversation, then one of another system prompt (so that the context holds nothing
    of the head), then a second conversation, whose question parts from the first one's at its first
    character."""

    def __init__(self, server: ServerProcess, min_piece: int) -> None:
        self._server = server
        self._min_piece = min_piece  # the model's shortest piece of a batch (`ReadGrid.min_piece`)
        self._measured: dict[tuple[str, int, int], int] = {}

    def kept(self, head: tuple[str, int, int], prompt: int, longest_before: int) -> int:
        """What a prompt of `prompt` tokens with this head restores at least, where the longest
        earlier prompt with it in the scope had `longest_before` tokens: the head's restore, or where
        either prompt ends too close past it for a read to stop there (`ReadGrid`: the earlier
        one's read could not store it) or a restore to start there (this one), the last checkpoint
        that both leave the shortest piece after."""
        # On a grid finer than the blocks (Gemma's 4 tokens), the head point of one prompt may lie a
        # step or two past another's (the head's last tokens merge with what follows them in some
        # prompts), and the point a piece before the head is the one a short question restores: a
        # piece is the margin.
        point = self[head] - (self._min_piece if self._min_piece > 1 else 0)
        if min(prompt, longest_before) - point >= self._min_piece:
            return point
        last = min(prompt, longest_before) - self._min_piece
        return min(point, last // CHECKPOINT_ALIGN * CHECKPOINT_ALIGN)

    def __getitem__(self, head: tuple[str, int, int]) -> int:
        if head not in self._measured:
            scope = f"head-{uuid.uuid4().hex[:12]}"
            first, second = Conversation(*head, turns=1, number=-1), Conversation(*head, turns=1, number=-2)
            # Long enough that its prompt-end point lies past what the two share (on a fine grid
            # it could fall a few tokens past the head point, where the second reads on from it).
            first.pieces.append(
                ("user", "Which files did I open yesterday, and which of them did I change again?")
            )
            second.pieces.append(("user", "Please list my invoices."))
            other = Conversation(head[0], 0, 0, turns=1, number=-3)
            other.pieces.append(("user", "Hello."))
            cached_tokens(self._server, scope, first)
            cached_tokens(self._server, scope, other, system="Answer in one word.")
            self._measured[head] = cached_tokens(self._server, scope, second)[1]
        return self._measured[head]


def check_heads_kept(
    server: ServerProcess, heads: HeadRestores, order: list[tuple[Conversation, bool]]
) -> None:
    scope = f"agents-{uuid.uuid4().hex[:12]}"
    seen: dict[tuple[str, int, int], int] = {}  # each head's longest prompt so far
    sent: list[str] = []  # what went before, for the failure's message
    for conversation, with_call in order:
        conversation.next_turn(with_call)
        prompt, restored = cached_tokens(server, scope, conversation)
        sent.append(f"{conversation.head} #{conversation.number}: {restored} of {prompt} restored")
        if conversation.head in seen and (SYSTEMS[conversation.system] or conversation.tools):
            assert heads[conversation.head] >= 64, conversation.head  # the head is worth a restore point
            expected = heads.kept(conversation.head, prompt, seen[conversation.head])
            assert restored >= expected, "\n".join([*sent, f"its head restores {expected}"])
        seen[conversation.head] = max(prompt, seen.get(conversation.head, 0))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("heads")
    qwen = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
    return {
        "gemma2-generic": write_tiny_model(folder / "tiny-gemma2.gguf", "gemma2", ascii_text=True),
        "qwen-native": write_template_model(
            folder / "qwen.gguf", qwen, QWEN_SPECIALS, eos="<|im_end|>", ascii_text=True
        ),
    }


@pytest.fixture(scope="module")
def tiny_heads(
    models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, HeadRestores]]:
    """Each tiny model's head restores, measured on a `--parallel 1` server of its own."""
    folder = tmp_path_factory.mktemp("tiny-heads")
    with contextlib.ExitStack() as servers:
        yield {
            # f32 weights: a piece of any length reads as the cold batch does.
            name: HeadRestores(servers.enter_context(serving(path, folder / name, parallel=1, n_ctx=8192)), 1)
            for name, path in models.items()
        }


@pytest.fixture(
    scope="module",
    params=[
        ("gemma2-generic", 1),
        ("gemma2-generic", 4),
        ("qwen-native", 1),
        ("qwen-native", 4),
    ],
    ids=lambda p: f"{p[0]}-parallel-{p[1]}",
)
def tiny_server(
    request: pytest.FixtureRequest,
    models: dict[str, Path],
    tiny_heads: dict[str, HeadRestores],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, HeadRestores]]:
    name, parallel = request.param
    folder = tmp_path_factory.mktemp(f"{name}-{parallel}")
    with serving(models[name], folder, parallel=parallel, n_ctx=8192) as server:
        yield server, tiny_heads[name]


@settings(max_examples=12, deadline=None, phases=PHASES, suppress_health_check=[HealthCheck.too_slow])
@given(order=schedules())
def test_a_new_conversation_restores_its_agents_head_on_tiny_models(
    tiny_server: tuple[ServerProcess, HeadRestores], order: list[tuple[Conversation, bool]]
) -> None:
    check_heads_kept(*tiny_server, order)


@pytest.fixture(scope="module")
def gemma_heads(gemma_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadRestores]:
    folder = tmp_path_factory.mktemp("gemma-heads")
    with serving(gemma_model_path, folder, parallel=1, n_ctx=4096) as server:
        yield HeadRestores(server, MIN_PIECE_TOKENS)


@pytest.fixture(scope="module", params=[1, 4], ids=lambda p: f"parallel-{p}")
def gemma_server(
    request: pytest.FixtureRequest,
    gemma_model_path: Path,
    gemma_heads: HeadRestores,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, HeadRestores]]:
    folder = tmp_path_factory.mktemp(f"gemma-{request.param}")
    with serving(gemma_model_path, folder, parallel=request.param, n_ctx=4096) as server:
        yield server, gemma_heads


@pytest.mark.gemma
@settings(max_examples=3, deadline=None, phases=PHASES, suppress_health_check=[HealthCheck.too_slow])
@given(order=schedules())
def test_a_new_conversation_restores_its_agents_head_on_gemma(
    gemma_server: tuple[ServerProcess, HeadRestores], order: list[tuple[Conversation, bool]]
) -> None:
    check_heads_kept(*gemma_server, order)


def serving(
    model: Path, folder: Path, *, parallel: int, n_ctx: int
) -> contextlib.AbstractContextManager[ServerProcess]:
    folder.mkdir(parents=True, exist_ok=True)
    return running_server(  # type: ignore[no-any-return]
        model, folder / "cache", folder / "serve.log", "--parallel", str(parallel), n_ctx=n_ctx
    )
