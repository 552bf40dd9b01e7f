"""The model's own tool format as the chat engine uses it (`NativeTools`), on GGUFs that carry a real
template and its special tokens: which models get it, what their template is given, the grammar of a
required call, how an answer is read, and the engine's events for a call on a real Llama."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import llama_cpp
import pytest
from tool_models import MISTRAL_SPECIALS, QWEN_SPECIALS, write_template_model

from snapcache.server.chat.chat_request import ChatMessage, ChatRequest, NamedTool, Sampling
from snapcache.server.chat.engine.chat_engine import ChatEngine, tool_channel_for
from snapcache.server.chat.engine.generic_tools import GenericTools
from snapcache.server.chat.engine.native_tools import NativeTools
from snapcache.server.chat.engine.prompt_rules import PromptRules
from snapcache.server.chat.events import Finished, Started, TextDelta, ToolCalled
from snapcache.server.model_engine import EngineOptions, ModelEngine
from snapcache.server.tools import ToolCall, ToolCallDelta, ToolSpec
from snapcache.store import SnapshotStore

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat_templates"
WEATHER = ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = ToolSpec("get_time", "Time.", {"type": "object", "properties": {"city": {"type": "string"}}})


def vocabulary(path: Path) -> Iterator[llama_cpp.Llama]:
    llm = llama_cpp.Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[llama_cpp.Llama]:
    template = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
    path = write_template_model(
        tmp_path_factory.mktemp("m") / "qwen.gguf", template, QWEN_SPECIALS, "<|im_end|>"
    )
    yield from vocabulary(path)


@pytest.fixture(scope="module")
def functiongemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[llama_cpp.Llama]:
    template = (TEMPLATES / "functiongemma.jinja").read_text()
    path = write_template_model(tmp_path_factory.mktemp("m") / "fg.gguf", template, {"<escape>": 3})
    yield from vocabulary(path)


def chat(*messages: ChatMessage, choice: str = "auto", parallel: bool = True) -> ChatRequest:
    """A chat offering both tools; `choice` a mode, or else a tool's name."""
    named = choice if choice in ("auto", "none", "required") else NamedTool(choice)
    return ChatRequest(messages, tools=(WEATHER, TIME), tool_choice=named, parallel_tool_calls=parallel)  # type: ignore[arg-type]


def read(tools: NativeTools, request: ChatRequest, reply: str, size: int = 3) -> tuple[list[object], bool]:
    reader = tools.reader(request)
    items: list[object] = []
    for at in range(0, len(reply), size):
        items.extend(reader.feed(reply[at : at + size]))
    finished = reader.finished
    return [*items, *reader.finish()], finished


@pytest.mark.model
def test_a_template_with_its_own_format_gets_it_and_others_the_generic_one(qwen, tiny_llama) -> None:
    request = chat(ChatMessage("user", "Hi"))
    native = tool_channel_for(request, qwen)
    assert isinstance(native, NativeTools)
    assert native.format.name == "hermes"
    assert isinstance(tool_channel_for(request, tiny_llama), GenericTools)  # its template knows no tools


@pytest.mark.model
def test_the_template_gets_the_tools_and_the_history_in_its_own_shape(qwen) -> None:
    tools = NativeTools.for_model(qwen)
    assert tools is not None
    call = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    request = chat(
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather?"),
        ChatMessage("user", "In Oslo."),
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "Sunny", tool_call_id="call_1"),
    )
    messages = tools.messages(request)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[1]["content"] == "Weather?\n\nIn Oslo."  # user turns in a row become one
    assert messages[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert messages[3]["name"] == "get_weather"
    assert [t["function"]["name"] for t in tools.options(request)["tools"]] == ["get_weather", "get_time"]
    assert tools.special_text(request)
    none = chat(ChatMessage("user", "Hi"), choice="none")
    assert tools.options(none) == {}
    assert not tools.special_text(none)
    assert tools.grammar(none) is None


@pytest.mark.model
def test_a_required_call_is_held_from_the_marker_token_on(qwen) -> None:
    tools = NativeTools.for_model(qwen)
    assert tools is not None
    assert tools.grammar(chat(ChatMessage("user", "Hi"))) is None  # auto: the model chooses
    (marker,) = qwen.tokenize(b"<tool_call>", add_bos=False, special=True)
    grammar = tools.grammar(chat(ChatMessage("user", "Hi"), choice="get_time", parallel=False))._grammar
    assert f"tool-call ::= <[{marker}]>" in grammar
    assert "get_time" in grammar
    assert "get_weather" not in grammar
    assert "tool-call (" not in grammar  # one call: parallel calls are off
    required = tools.grammar(chat(ChatMessage("user", "Hi"), choice="required"))._grammar
    assert "get_weather" in required
    assert "get_time" in required


@pytest.mark.model
def test_without_parallel_calls_the_answer_is_finished_at_its_first_call(qwen) -> None:
    tools = NativeTools.for_model(qwen)
    assert tools is not None
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    second = '\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    items, finished = read(tools, chat(ChatMessage("user", "Hi"), parallel=False), first + second)
    assert finished
    assert [item.name for item in items if isinstance(item, ToolCall)] == ["get_weather"]
    assert {item.index for item in items if isinstance(item, ToolCallDelta)} == {0}
    items, finished = read(tools, chat(ChatMessage("user", "Hi")), "Let me look. " + first + second)
    assert not finished
    assert [item.name for item in items if isinstance(item, ToolCall)] == ["get_weather", "get_time"]
    assert "".join(item for item in items if isinstance(item, str)) == "Let me look."
    deltas = [item for item in items if isinstance(item, ToolCallDelta) and item.index == 1]
    assert json.loads("".join(delta.arguments for delta in deltas)) == {"city": "Oslo"}


@pytest.mark.model
def test_functiongemma_stops_where_it_would_write_a_result_itself(functiongemma) -> None:
    tools = NativeTools.for_model(functiongemma)
    assert tools is not None
    assert tools.format.name == "functiongemma"
    assert tools.stop(chat(ChatMessage("user", "Hi"))) == ("<start_function_response>",)
    assert tools.stop(chat(ChatMessage("user", "Hi"), choice="none")) == ()
    reply = "<start_function_call>call:get_time{city:<escape>Oslo<escape>}<end_function_call>"
    items, _ = read(tools, chat(ChatMessage("user", "Hi")), reply)
    assert [(i.name, json.loads(i.arguments)) for i in items if isinstance(i, ToolCall)] == [
        ("get_time", {"city": "Oslo"})
    ]


def engine_events(llm: llama_cpp.Llama, request: ChatRequest, *, live: bool = False) -> list[object]:
    """The events of `request` from a ChatEngine serving `llm` (one request at a time, a cache in RAM)."""
    model = ModelEngine(llm, SnapshotStore(), options=EngineOptions(parallel=1))
    engine = ChatEngine(model, PromptRules(), max_tokens_default=None, live_tool_calls=live)

    async def collect() -> list[object]:
        return [event async for event in engine.events(request)]

    return anyio.run(collect)


@pytest.mark.model
@pytest.mark.parametrize("template", ["qwen2.5-7b-instruct.jinja", "mistral-nemo-instruct-2407.jinja"])
def test_the_engine_reads_calls_from_the_special_tokens_of_its_answer(
    template: str, make_llama, tmp_path: Path
) -> None:
    """The engine on a real Llama: a required call, written by the model under the format's grammar,
    comes back as events; Mistral's marker is a control token that only text with special tokens
    holds, which the engine asks for this request alone."""
    qwen = template.startswith("qwen")
    specials, eos = (QWEN_SPECIALS, "<|im_end|>") if qwen else (MISTRAL_SPECIALS, "</s>")
    path = write_template_model(tmp_path / "model.gguf", (TEMPLATES / template).read_text(), specials, eos)
    llm = make_llama(path, n_ctx=2048)
    city = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]}
    request = ChatRequest(
        (ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Oslo?")),
        max_tokens=120,
        tools=(ToolSpec("get_weather", "Weather.", city),),
        tool_choice="required",
        parallel_tool_calls=False,
        sampling=Sampling(temperature=0.0),
    )
    whole = engine_events(llm, request)
    events = engine_events(llm, request, live=True)
    # By default a call comes whole: the same calls, none of their deltas.
    assert not [event for event in whole if isinstance(event, ToolCallDelta)]
    assert [(e.call.name, e.call.arguments) for e in whole if isinstance(e, ToolCalled)] == [
        (e.call.name, e.call.arguments) for e in events if isinstance(e, ToolCalled)
    ]
    assert isinstance(events[0], Started)
    called = [event.call for event in events if isinstance(event, ToolCalled)]
    assert [(call.name, json.loads(call.arguments)["city"] in ("Oslo", "Rome")) for call in called] == [
        ("get_weather", True)
    ]
    assert not [event for event in events if isinstance(event, TextDelta)]
    assert events[-1] == Finished("tool_calls", events[-1].usage)
    deltas = [event for event in events if isinstance(event, ToolCallDelta)]
    if qwen:  # Hermes names the tool first: the arguments stream before the call is whole
        assert deltas[0].name == "get_weather"
        assert deltas[0].arguments == ""
        assert {delta.id for delta in deltas} == {called[0].id}
        assert json.loads("".join(delta.arguments for delta in deltas)) == json.loads(called[0].arguments)
        assert events.index(deltas[-1]) < events.index(next(e for e in events if isinstance(e, ToolCalled)))
    else:  # a JSON list of calls comes whole; the control token is no text outside the request
        (marker,) = llm.tokenize(b"[TOOL_CALLS]", add_bos=False, special=True)
        assert llm.detokenize([marker]) == b""
        assert len(called[0].id) == 9


@pytest.mark.model
def test_auto_holds_a_call_from_its_marker_token_where_requests_are_batched(
    make_llama, store, tmp_path: Path
) -> None:
    """Under `auto` a batched server's model writes freely until it samples the format's marker token,
    and from it on follows the calls' grammar (llama.cpp's lazy grammar); the one-at-a-time Llama,
    whose sampler takes no lazy grammar, is left free."""
    from snapcache.llama.batch import BatchedLlama, LazyGrammar, Scheduler

    template = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
    path = write_template_model(tmp_path / "qwen.gguf", template, QWEN_SPECIALS, "<|im_end|>")
    llm = make_llama(path, n_ctx=2048)
    city = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]}
    auto = ChatRequest(
        (ChatMessage("user", "Weather in Oslo?"),),
        tools=(ToolSpec("get_weather", "Weather.", city),),
        parallel_tool_calls=False,
    )
    assert NativeTools.for_model(llm).grammar(auto) is None  # type: ignore[union-attr]
    (marker,) = llm.tokenize(b"<tool_call>", add_bos=False, special=True)
    with Scheduler(llm, store, n_seq=2) as scheduler:
        model = BatchedLlama(scheduler)
        tools = NativeTools.for_model(llm, lazy_grammars=True)
        assert tools is not None
        lazy = tools.grammar(auto)
        assert isinstance(lazy, LazyGrammar)
        assert lazy.trigger_tokens == (marker,)
        assert lazy.gbnf.count(f"<[{marker}]>") == 1
        options = {"temperature": 0.0, "max_tokens": 200}
        free = model.create_completion("Hi", **options)["choices"][0]["text"]
        held = model.create_completion("Hi", grammar=lazy, **options)["choices"][0]["text"]
        # Ended before its marker, the answer is the free one, token for token.
        short = {"temperature": 0.0, "max_tokens": 8}
        unheld = model.create_completion("Hi", **short)
        cut = model.create_completion("Hi", grammar=lazy, **short)
        assert cut["choices"] == unheld["choices"]
        assert cut["usage"]["completion_tokens"] == unheld["usage"]["completion_tokens"] == 8
    # The premise: this random model writes the marker, and after it no call the format reads.
    before = free[: free.index("<tool_call>")]
    assert not tools.format.parse(free, auto.tools).calls
    # Free up to the marker; from it on, a well-formed call of the tool.
    assert held.startswith(before + "<tool_call>")
    [call] = tools.format.parse(held, auto.tools).calls
    assert call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Oslo", "Rome")


@pytest.mark.model
@pytest.mark.parametrize("parallel", [2, 1])
def test_the_server_holds_an_auto_call_from_its_marker_only_where_requests_are_batched(
    make_llama, tmp_path: Path, parallel: int
) -> None:
    """The chat engine's tool channel takes a lazy grammar for `auto` exactly where its model engine
    batches requests (the batched sampler takes one; the Llama's own does not)."""
    from snapcache.llama.batch import LazyGrammar

    template = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
    path = write_template_model(tmp_path / "qwen.gguf", template, QWEN_SPECIALS, "<|im_end|>")
    llm = make_llama(path, n_ctx=1024)
    city = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]}
    auto = ChatRequest(
        (ChatMessage("user", "Weather in Oslo?"),),
        tools=(ToolSpec("get_weather", "Weather.", city),),
        parallel_tool_calls=False,
    )
    model = ModelEngine(llm, SnapshotStore(), options=EngineOptions(parallel=parallel))
    try:
        grammar = ChatEngine(model, PromptRules(), max_tokens_default=None).tool_channel(auto).grammar(auto)
    finally:
        model.close()
    assert isinstance(grammar, LazyGrammar) == (parallel > 1)
    if parallel == 1:
        assert grammar is None
