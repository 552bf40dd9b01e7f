"""Tool calls for any chat template: tools described in the system text, calls as a JSON object.

For a template that knows nothing of tools (Gemma 3's), as llama-server's generic format does: the
tools go at the end of the system message (so they belong to the prefix every turn shares), the
model is asked to answer with one JSON object, `{"tool_call": {"name": ..., "arguments": {...}}}`
or `{"response": "..."}`, and earlier calls and results are rendered as that JSON and as user text.
A grammar holds the answer to that shape: a call of any tool (`required`), of one (a tool's name),
or a call or text (`auto`). Without tools in play the messages are only mapped to plain roles.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import LlamaGrammar

from snapcache.server.chat.request import ChatMessage, ChatRequest, ToolCallRequest, ToolSpec

__all__ = ["GenericTools"]

_log = logging.getLogger("snapcache")

_INSTRUCTIONS = (
    "# Tools\n\n"
    "You can call the tools below. Each is a JSON object: its name, what it does, and a JSON schema "
    "of its arguments.\n\n{tools}\n\n"
    "Answer with exactly one JSON object and nothing else. To call a tool:\n"
    '{{"tool_call": {{"name": "<the tool\'s name>", "arguments": {{<the arguments>}}}}}}\n'
    "To answer in text:\n"
    '{{"response": "<your answer>"}}\n'
    "After a call, its result comes back in the next user message."
)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_TEXT_ANSWER = re.compile(r'\s*\{\s*"response"\s*:\s*"')


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
            role, text = _as_plain(message, names)
            if rendered and rendered[-1]["role"] == role and role != "system":
                rendered[-1]["content"] = f"{rendered[-1]['content']}\n\n{text}"  # templates want turns
            else:
                rendered.append({"role": role, "content": text})
        if request.uses_tools:
            described = _INSTRUCTIONS.format(tools="\n".join(_describe(tool) for tool in request.tools))
            if rendered and rendered[0]["role"] == "system":
                rendered[0]["content"] = f"{rendered[0]['content']}\n\n{described}"
            else:
                rendered.insert(0, {"role": "system", "content": described})
        return rendered

    def grammar(self, request: ChatRequest) -> Any | None:
        if not request.uses_tools:
            return None
        tools = request.tools
        if request.tool_choice not in ("auto", "required"):
            tools = tuple(tool for tool in tools if tool.name == request.tool_choice)
        schema = _answer_schema(tools, text=request.tool_choice == "auto")
        # Keys in their order (not sorted): the model writes the tool's name before its arguments.
        return _grammar(json.dumps(schema), self._vocab)

    def visible_text(self, partial: str, request: ChatRequest) -> str:
        return _streamed_text(partial) if request.uses_tools else partial

    def parse(self, text: str, request: ChatRequest) -> tuple[str, list[ToolCallRequest]]:
        if not request.uses_tools:
            return text, []
        answer = _json_object(text)
        if answer is None:
            return text, []
        known = {tool.name for tool in request.tools}
        calls = []
        wanted = answer.get("tool_calls")
        for call in ([answer.get("tool_call")] if wanted is None else wanted) or ():
            if isinstance(call, Mapping) and call.get("name") in known:
                arguments = call.get("arguments", {})
                arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
                calls.append(ToolCallRequest(f"call_{uuid.uuid4().hex[:24]}", str(call["name"]), arguments))
        if not request.parallel_tool_calls:
            calls = calls[:1]
        response = answer.get("response")
        if calls:
            return (response if isinstance(response, str) else ""), calls
        if isinstance(response, str):
            return response, []
        return text, []


def _streamed_text(partial: str) -> str:
    """The text of a `{"response": "..."}` answer so far ("" until it is clearly one)."""
    opened = _TEXT_ANSWER.match(partial)
    if opened is None:
        return ""
    rest, end, i = partial[opened.end() :], 0, 0
    while i < len(rest) and rest[i] != '"':
        if rest[i] != "\\":
            i += 1
        elif rest[i + 1 : i + 2] == "u":
            if len(rest) < i + 6 or (0xD800 <= _hex(rest[i + 2 : i + 6]) < 0xDC00 and len(rest) < i + 12):
                break  # an escape, or a surrogate pair, not whole yet
            i += 12 if 0xD800 <= _hex(rest[i + 2 : i + 6]) < 0xDC00 else 6
        else:
            if len(rest) < i + 2:
                break
            i += 2
        end = i
    try:
        return str(json.loads(f'"{rest[:end]}"', strict=False))
    except ValueError:
        return ""


def _hex(digits: str) -> int:
    try:
        return int(digits, 16)
    except ValueError:
        return -1


def _as_plain(message: ChatMessage, names: Mapping[str, str]) -> tuple[str, str]:
    """A message as a role every template knows and its text."""
    if message.role == "tool":
        name = names.get(message.tool_call_id or "", message.name or "a tool")
        return "user", f"Result of {name} (call {message.tool_call_id}):\n{message.content}"
    if message.role == "assistant" and message.tool_calls:
        calls = [
            json.dumps({"tool_call": {"name": call.name, "arguments": _loaded(call.arguments)}})
            for call in message.tool_calls
        ]
        return "assistant", "\n".join([message.content, *calls] if message.content else calls)
    return message.role, message.content


def _loaded(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _describe(tool: ToolSpec) -> str:
    described = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return json.dumps(described, ensure_ascii=False)


def _answer_schema(tools: tuple[ToolSpec, ...], *, text: bool) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {
                "tool_call": {
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, "arguments": _arguments_schema(tool)},
                    "required": ["name", "arguments"],
                }
            },
            "required": ["tool_call"],
        }
        for tool in tools
    ]
    if text:
        calls.append(
            {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
        )
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


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


@functools.lru_cache(maxsize=32)
def _grammar(schema: str, vocab: Any) -> Any | None:
    """The grammar of a JSON schema, checked by llama.cpp (None, logged, where it refuses it)."""
    try:
        grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
    except Exception as exc:
        _log.warning("tool calls: no grammar for these tools (%s); the answer is parsed as it comes", exc)
        return None
    if vocab is not None:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar._grammar.encode("utf-8"), b"root")
        if not sampler:
            _log.warning(
                "tool calls: llama.cpp refused the grammar of these tools; the answer is parsed as it comes"
            )
            return None
        llama_cpp.llama_sampler_free(sampler)
    return grammar


def _json_object(text: str) -> Mapping[str, Any] | None:
    """The JSON object `text` holds (around it, at most spaces or a code fence), or None."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        found = json.loads(text[start : end + 1])
    except ValueError:
        return None
    return found if isinstance(found, Mapping) else None
