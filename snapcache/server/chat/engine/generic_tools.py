"""Tool calls for any chat template: tools described in the system text, calls as a JSON object.

For a template that knows nothing of tools (Gemma 3's), as llama-server's generic format does: the
tools go at the end of the system message (so they belong to the prefix every turn shares), the
model is asked to answer with one JSON object, `{"tool_calls": [{"name": ..., "arguments": {...}},
...]}` (`{"tool_call": {...}}` where `parallel_tool_calls` is off) or `{"response": "..."}`, and
earlier calls and results are rendered as that JSON and as user text. A grammar holds the answer to
that shape: calls of any tool (`required`), of one (a tool's name), or calls or text (`auto`). The
answer streams: its text as it grows, each call's arguments as they are written
(`snapcache.server.tools.GenericCallStream`). Without tools in play the messages are only mapped to
plain roles.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

from llama_cpp.llama_grammar import LlamaGrammar

from snapcache.server.chat.chat_request import ChatMessage, ChatRequest, NamedTool
from snapcache.server.chat.engine.tool_channel import PlainReader, ReplyReader, checked_grammar
from snapcache.server.tools import (
    GenericCallStream,
    ToolCall,
    ToolSpec,
    arguments_object,
    parse_generic,
    schema_gbnf,
)

__all__ = ["GenericTools"]

_log = logging.getLogger("snapcache")

_INSTRUCTIONS = (
    "# Tools\n\n"
    "You can call the tools below. Each is a JSON object: its name, what it does, and a JSON schema "
    "of its arguments.\n\n{tools}\n\n"
    "Answer with exactly one JSON object and nothing else. {calls}\n"
    "To answer in text:\n"
    '{{"response": "<your answer>"}}\n'
    "{results}"
)
_PARALLEL = (
    "To call tools (one or more; they run in the order given):\n"
    '{"tool_calls": [{"name": "<the tool\'s name>", "arguments": {<the arguments>}}]}',
    "After calls, their results come back in the next user message.",
)
_SINGLE = (
    'To call a tool:\n{"tool_call": {"name": "<the tool\'s name>", "arguments": {<the arguments>}}}',
    "After a call, its result comes back in the next user message.",
)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


class GenericTools:
    """The generic format on one model (whose vocabulary checks the grammars)."""

    def __init__(self, vocab: Any) -> None:
        self._vocab = vocab

    @classmethod
    def for_model(cls, llm: Any) -> GenericTools:
        model = getattr(llm, "_model", None)
        return cls(getattr(model, "vocab", None))

    def messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        names = {call.id: call.name for m in request.messages for call in m.tool_calls}
        rendered: list[dict[str, Any]] = []
        for message in request.messages:
            role, text = _as_plain(message, names, request.parallel_tool_calls)
            if rendered and rendered[-1]["role"] == role and role != "system":
                rendered[-1]["content"] = f"{rendered[-1]['content']}\n\n{text}"  # templates want turns
            else:
                rendered.append({"role": role, "content": text})
        if request.uses_tools:
            calls, results = _PARALLEL if request.parallel_tool_calls else _SINGLE
            described = _INSTRUCTIONS.format(
                tools="\n".join(_describe(tool) for tool in request.tools), calls=calls, results=results
            )
            if rendered and rendered[0]["role"] == "system":
                rendered[0]["content"] = f"{rendered[0]['content']}\n\n{described}"
            else:
                rendered.insert(0, {"role": "system", "content": described})
        return rendered

    def options(self, request: ChatRequest) -> dict[str, Any]:
        return {}

    def stop(self, request: ChatRequest) -> tuple[str, ...]:
        return ()

    def special_text(self, request: ChatRequest) -> bool:
        return False

    def grammar(self, request: ChatRequest) -> Any | None:
        if not request.uses_tools:
            return None
        tools = request.tools
        if isinstance(request.tool_choice, NamedTool):
            tools = tuple(tool for tool in tools if tool.name == request.tool_choice.name) or tools
        # Agents send the same tools every turn: their grammar is made once.
        listed = json.dumps([[tool.name, dict(tool.parameters)] for tool in tools])
        gbnf = _answer_grammar(
            listed, text=request.tool_choice == "auto", parallel=request.parallel_tool_calls
        )
        return None if gbnf is None else checked_grammar(gbnf, self._vocab)

    def reader(self, request: ChatRequest) -> ReplyReader:
        if not request.uses_tools:
            return PlainReader()
        names = [tool.name for tool in request.tools]
        return GenericCallStream(names, parallel=request.parallel_tool_calls)

    def parse(self, text: str, request: ChatRequest) -> tuple[str, list[ToolCall]]:
        """A whole answer's text and calls."""
        if not request.uses_tools:
            return text, []
        reply = parse_generic(
            text, [tool.name for tool in request.tools], parallel=request.parallel_tool_calls
        )
        return reply.content, list(reply.calls)


def _as_plain(message: ChatMessage, names: Mapping[str, str], parallel: bool) -> tuple[str, str]:
    """A message as a role every template knows and its text."""
    if message.role == "tool":
        name = names.get(message.tool_call_id or "", message.name or "a tool")
        return "user", f"Result of {name} (call {message.tool_call_id}):\n{message.content}"
    if message.role == "assistant" and message.tool_calls:
        made = [
            {"name": call.name, "arguments": arguments_object(call.arguments)} for call in message.tool_calls
        ]
        if parallel:
            calls = [json.dumps({"tool_calls": made})]
        else:
            calls = [json.dumps({"tool_call": call}) for call in made]
        return "assistant", "\n".join([message.content, *calls] if message.content else calls)
    return message.role, message.content


def _describe(tool: ToolSpec) -> str:
    described = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return json.dumps(described, ensure_ascii=False)


@functools.lru_cache(maxsize=32)
def _answer_grammar(tools: str, *, text: bool, parallel: bool) -> str | None:
    """The GBNF of an answer to these tools (`[[name, parameters], ...]` as JSON); None, logged, where
    llama-cpp-python cannot make one."""
    listed = [ToolSpec(name, "", parameters) for name, parameters in json.loads(tools)]
    schema = _answer_schema(listed, text=text, parallel=parallel)
    try:
        # Keys in their order (not sorted): the model writes the tool's name before its arguments.
        return schema_gbnf(schema)
    except Exception as exc:
        _log.warning("tool calls: no grammar for these tools (%s); the answer is read as it comes", exc)
        return None


def _answer_schema(tools: list[ToolSpec], *, text: bool, parallel: bool) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": _arguments_schema(tool)},
            "required": ["name", "arguments"],
        }
        for tool in tools
    ]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        answer = {
            "type": "object",
            "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
            "required": ["tool_calls"],
        }
    else:
        answer = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
    if not text:
        return answer
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    return {"anyOf": [answer, response]}


def _arguments_schema(tool: ToolSpec) -> Mapping[str, Any]:
    """The tool's schema where llama-cpp-python can turn it into a grammar, else any object."""
    try:
        LlamaGrammar.from_json_schema(json.dumps(tool.parameters), verbose=False)
    except Exception as exc:
        _log.info(
            "tool %r: its argument schema cannot be a grammar (%s); any object is accepted", tool.name, exc
        )
        return _ANY_OBJECT
    return tool.parameters
