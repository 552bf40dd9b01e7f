"""Chat messages mapped to what a given chat template knows how to render.

Requests arrive in OpenAI's chat shape (from any dialect); templates differ in what they accept:
roles they do not know, content-part lists, call arguments as JSON text where they expect an object,
one call per message, Mistral's 9-character call ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from snapcache.server.tools._values import ToolCall, arguments_json, arguments_object

# Renders an assistant's calls as plain text, for a template that has no place for calls.
CallsAsText = Callable[[Sequence[ToolCall]], str]

_TEXT_PARTS = {"text", "input_text", "output_text"}
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True, slots=True)
class _Traits:
    tool_role: bool
    tool_calls: bool
    developer_role: bool
    single_call: bool
    nine_char_ids: bool

    @classmethod
    def of(cls, template: str | None) -> _Traits:
        text = template or ""
        return cls(
            tool_role=re.search(r"""["']tool["']""", text) is not None,
            tool_calls="tool_calls" in text,
            developer_role=re.search(r"""["']developer["']""", text) is not None,
            single_call="single tool-call" in text,
            nine_char_ids="length != 9" in text,
        )


class UnsupportedContent(ValueError):
    """Content that is not text: a part of another kind, or neither a string nor a list of parts."""


def content_text(content: object, *, separator: str = "", strict: bool = False) -> str:
    """The text of a message's content: a string, None, or a list of content parts, `separator`
    between them. Text parts are strings and `text`, `input_text` or `output_text` parts; others are
    left out, or, `strict`, refused (UnsupportedContent), as is content that is no string or list
    (else given as JSON or as its string)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif _text_part(part, strict):
                texts.append(str(part.get("text", "")))
            elif strict:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise UnsupportedContent(f"content of type {kind!r} is not supported (text only)")
        return separator.join(texts)
    if strict:
        raise UnsupportedContent("content must be a string or a list of text parts")
    return json.dumps(content, ensure_ascii=False) if isinstance(content, Mapping) else str(content)


def _text_part(part: object, strict: bool) -> TypeGuard[Mapping[str, Any]]:
    if not isinstance(part, Mapping) or part.get("type", "text") not in _TEXT_PARTS:
        return False
    return isinstance(part.get("text"), str) or not strict


def default_calls_as_text(calls: Sequence[ToolCall]) -> str:
    """`{"tool_calls": [{"name": ..., "arguments": {...}}]}`, the generic JSON form llama-server uses."""
    listed = [{"name": call.name, "arguments": arguments_object(call.arguments)} for call in calls]
    return json.dumps({"tool_calls": listed}, ensure_ascii=False)


def _call(raw: Any) -> ToolCall:
    """A call from an OpenAI `tool_calls` entry or an object with `id`, `name` and `arguments`."""
    if not isinstance(raw, Mapping):
        return ToolCall(str(raw.id), str(raw.name), arguments_json(raw.arguments))
    function = raw.get("function") or {}
    return ToolCall(
        str(raw.get("id") or ""),
        str(function.get("name", "")),
        arguments_json(function.get("arguments", "{}")),
    )


def _nine(call_id: str) -> str:
    """A 9-character alphanumeric id for Mistral's templates, the same for the same id every turn."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=8).digest(), "big")
    return "".join(_BASE62[(number // 62**i) % 62] for i in range(9))


def render_messages(
    messages: Sequence[Mapping[str, Any]],
    template: str | None,
    *,
    calls_as_text: CallsAsText | None = None,
) -> list[dict[str, Any]]:
    """OpenAI-shaped chat messages mapped for `template`, ready to pass to it as `messages`.

    Content-part lists become text; `developer` becomes `system` where the template does not know
    it, and leading system messages become one; assistant `tool_calls` (OpenAI dicts, or objects
    like ToolCall) carry their arguments as objects; a `tool` message carries its call's `name`.
    Where the template has no tool role, a result becomes user text in a `<tool_response name=...
    id=...>` wrapper, and where it has no calls, an assistant's calls become text (`calls_as_text`,
    by default `default_calls_as_text`). Where the template takes one call per message (Llama 3.x),
    parallel calls are split, each followed by its result. Ids become 9 alphanumeric characters for
    Mistral's templates (the same id the same characters every turn, so the prompt stays a prefix).
    """
    traits = _Traits.of(template)
    names = {
        call.id: call.name for message in messages for call in map(_call, message.get("tool_calls") or ())
    }
    mapped: list[dict[str, Any]] = []
    for message in messages:
        mapped.append(_map_one(message, traits, names, calls_as_text or default_calls_as_text))
    mapped = _merge_leading_systems(mapped)
    if traits.single_call:
        mapped = _one_call_each(mapped)
    if not traits.tool_role:
        mapped = _merge_user_runs(mapped)
    return mapped


def _map_one(
    message: Mapping[str, Any], traits: _Traits, names: Mapping[str, str], calls_as_text: CallsAsText
) -> dict[str, Any]:
    role = str(message.get("role", "user"))
    text = content_text(message.get("content"))
    ids: Callable[[str], str] = _nine if traits.nine_char_ids else str
    if role == "developer" and not traits.developer_role:
        role = "system"
    if role in ("tool", "function"):
        call_id = str(message.get("tool_call_id") or "")
        name = str(message.get("name") or names.get(call_id, ""))
        if traits.tool_role:
            return {"role": "tool", "content": text, "tool_call_id": ids(call_id), "name": name}
        wrapped = f'<tool_response name="{name}" id="{call_id}">\n{text}\n</tool_response>'
        return {"role": "user", "content": wrapped, "_from_tool": True}
    mapped: dict[str, Any] = {"role": role, "content": text}
    if isinstance(message.get("reasoning_content"), str):
        mapped["reasoning_content"] = message["reasoning_content"]
    calls = [_call(raw) for raw in message.get("tool_calls") or ()]
    if role == "assistant" and calls:
        if traits.tool_calls:
            mapped["tool_calls"] = [
                {
                    "id": ids(call.id),
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_object(call.arguments)},
                }
                for call in calls
            ]
        else:
            mapped["content"] = "\n".join(part for part in (text, calls_as_text(calls)) if part)
    return mapped


def _merge_leading_systems(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    count = 0
    while count < len(messages) and messages[count]["role"] == "system":
        count += 1
    if count < 2:
        return messages
    merged = "\n\n".join(m["content"] for m in messages[:count] if m["content"])
    return [{"role": "system", "content": merged}, *messages[count:]]


def _one_call_each(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split assistant messages with several calls; each call is followed by its own result."""
    result: list[dict[str, Any]] = []
    placed: set[int] = set()  # results already put after their call
    for message in messages:
        if id(message) in placed:
            continue
        calls = message.get("tool_calls") or []
        if message["role"] != "assistant" or len(calls) < 2:
            result.append(message)
            continue
        answers = _results_after(messages, message, {call["id"] for call in calls})
        for index, call in enumerate(calls):
            result.append(
                {**message, "content": message["content"] if index == 0 else "", "tool_calls": [call]}
            )
            if call["id"] in answers:
                result.append(answers[call["id"]])
                placed.add(id(answers[call["id"]]))
    return result


def _results_after(
    messages: list[dict[str, Any]], call_message: dict[str, Any], ids: set[str]
) -> dict[str, dict[str, Any]]:
    start = next(i for i, m in enumerate(messages) if m is call_message) + 1
    answers: dict[str, dict[str, Any]] = {}
    for message in messages[start:]:
        if message["role"] != "tool":
            break
        if message["tool_call_id"] in ids:
            answers.setdefault(message["tool_call_id"], message)
    return answers


def _merge_user_runs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join a tool result turned user text with the user messages next to it (roles must alternate)."""
    result: list[dict[str, Any]] = []
    for message in messages:
        previous = result[-1] if result else None
        tool_text = message.pop("_from_tool", False)
        if (
            previous is not None
            and previous["role"] == message["role"] == "user"
            and (tool_text or previous.get("_merged"))
        ):
            previous["content"] = previous["content"] + "\n\n" + message["content"]
            continue
        if tool_text:
            message["_merged"] = True
        result.append(message)
    for message in result:
        message.pop("_merged", None)
    return result
