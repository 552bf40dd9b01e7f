"""Tool calls in the model's own format, for a chat template that writes calls its own way.

Where the template a model renders with (its GGUF's) places the tools itself and teaches a call
format `snapcache.server.tools` reads (Hermes/Qwen `<tool_call>`, Llama 3.x JSON, Mistral
`[TOOL_CALLS]`, FunctionGemma, Gemma 4, Qwen3-Coder's XML), the template does the work: the tools go
to it as `tools` (it decides where they go), earlier calls as `tool_calls` and results in the `tool`
role (`render_messages` maps what it does not know). The answer is read with its special tokens kept
as text, since call markers such as `[TOOL_CALLS]` are special tokens, and parsed as it streams;
visible text never shows a marker, whole or in part.

`tool_choice`: "required" or a tool's name holds the answer to calls under a grammar that starts with
the format's marker token (one call where `parallel_tool_calls` is off, and always on Llama 3.x,
whose templates take one call a turn); "auto" leaves the model free to answer or call, and where the
requests are batched (`--parallel` above 1) the same grammar holds a call from its marker token on
(llama.cpp's lazy grammar: its calls are well formed and fit the tools' schemas; Llama 3.x, whose
calls have no marker, stays free); "none" leaves the tools out of the prompt and reads the answer as
text. Without `parallel_tool_calls`, an unconstrained answer's calls after its first are dropped.
"""

from __future__ import annotations

from typing import Any

from snapcache.llama.batch import LazyGrammar
from snapcache.server.chat.chat_request import ChatRequest, NamedTool
from snapcache.server.chat.engine.tool_channel import PlainReader, ReplyReader, chat_template, checked_grammar
from snapcache.server.tools import (
    StreamItem,
    ToolCall,
    ToolCallDelta,
    ToolCallDropped,
    ToolCallStream,
    ToolSpec,
    render_messages,
)
from snapcache.server.tools import ToolFormat as CallFormat
from snapcache.server.tools import tool_format_for as call_format_for

__all__ = ["NativeTools"]


class NativeTools:
    """The call format of one model's chat template (see the module docstring)."""

    def __init__(self, form: CallFormat, template: str, llm: Any, *, lazy_grammars: bool = False) -> None:
        self.format = form
        self._template = template
        self._llm = llm
        self._lazy_grammars = lazy_grammars

    @classmethod
    def for_model(cls, llm: Any, *, lazy_grammars: bool = False) -> NativeTools | None:
        """The model's own format, or None where its template has none it places tools for;
        `lazy_grammars`: the model's sampler takes a `LazyGrammar` (the batched path's does)."""
        template = chat_template(llm)
        if template is None:
            return None
        form = call_format_for(template)
        if not (form.native and form.renders_tools):
            return None
        return cls(form, template, llm, lazy_grammars=lazy_grammars)

    def messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        merged: list[dict[str, Any]] = []
        for message in (m.as_openai() for m in request.messages):
            previous = merged[-1] if merged else None
            if previous is not None and previous["role"] == message["role"] and _plain(previous, message):
                previous["content"] = f"{previous['content']}\n\n{message['content']}"  # templates want turns
            else:
                merged.append(message)
        return render_messages(merged, self._template)

    def options(self, request: ChatRequest) -> dict[str, Any]:
        return {"tools": [_openai(tool) for tool in request.tools]} if request.uses_tools else {}

    def stop(self, request: ChatRequest) -> tuple[str, ...]:
        return self.format.stop if request.uses_tools else ()

    def special_text(self, request: ChatRequest) -> bool:
        return request.uses_tools

    def grammar(self, request: ChatRequest) -> Any | None:
        if not request.uses_tools:
            return None
        trigger = self._lazy_trigger() if request.tool_choice == "auto" else None
        if request.tool_choice == "auto" and trigger is None:
            return None  # the answer is free
        tools = request.tools
        if isinstance(request.tool_choice, NamedTool):
            tools = tuple(tool for tool in tools if tool.name == request.tool_choice.name) or tools
        gbnf = self.format.grammar(tools, parallel=request.parallel_tool_calls, token_of=self._token_of)
        if gbnf is None:
            return None
        checked = checked_grammar(gbnf, self._llm._model.vocab)
        if checked is None or trigger is None:
            return checked
        return LazyGrammar(gbnf, (trigger,))

    def _lazy_trigger(self) -> int | None:
        """The token that starts the calls' grammar under `auto`: the format's marker, where it is
        one token and the model's sampler takes a lazy grammar; else None."""
        syntax, marker = self.format.syntax, self.format.call_marker
        if not self._lazy_grammars or syntax is None or syntax.opens_with_json:
            return None
        return self._token_of(marker) if marker else None

    def reader(self, request: ChatRequest) -> ReplyReader:
        if not request.uses_tools:
            return PlainReader()
        return _NativeReader(self.format.stream(request.tools), parallel=request.parallel_tool_calls)

    def _token_of(self, text: str) -> int | None:
        """The id of the one token `text` is in the model's vocabulary, else None."""
        tokens = self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        return int(tokens[0]) if len(tokens) == 1 else None


class _NativeReader:
    """A reply in the model's format, read as it streams; without `parallel`, finished at its first
    call (the deltas and calls of any other dropped)."""

    def __init__(self, stream: ToolCallStream, *, parallel: bool) -> None:
        self._stream = stream
        self._parallel = parallel
        self._calls = 0

    @property
    def finished(self) -> bool:
        return not self._parallel and self._calls > 0

    def feed(self, text: str) -> list[StreamItem]:
        return self._kept(self._stream.feed(text))

    def finish(self) -> list[StreamItem]:
        return self._kept(self._stream.finish())

    def _kept(self, items: list[StreamItem]) -> list[StreamItem]:
        if self._parallel:
            return items
        kept: list[StreamItem] = []
        for item in items:
            if isinstance(item, ToolCall):
                self._calls += 1
                if self._calls > 1:
                    continue
            elif isinstance(item, ToolCallDelta) and item.index > 0:
                continue
            elif isinstance(item, ToolCallDropped) and item.index > 0:
                item = item.text  # never announced: its deltas were dropped
            kept.append(item)
        return [item for item in kept if item != ""]


def _plain(*messages: dict[str, Any]) -> bool:
    """Whether these are user messages, or assistant texts without calls."""
    return all(m["role"] in ("user", "assistant") and not m.get("tool_calls") for m in messages)


def _openai(tool: ToolSpec) -> dict[str, Any]:
    """A tool as OpenAI describes a function, the shape templates iterate."""
    function = {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}
    return {"type": "function", "function": function}
