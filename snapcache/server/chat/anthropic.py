"""Anthropic Messages over the one chat request: a `MessagesRequest` in, a message or its events out.

Usage follows Anthropic's API: `input_tokens` are the prompt tokens read afresh,
`cache_read_input_tokens` those restored from the cache, `output_tokens` those generated.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from snapcache.server.chat.anthropic_protocol import (
    ConversationRequest,
    MessageParam,
    MessagesRequest,
    NamedChoice,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from snapcache.server.chat.engine import ChatEvent, Finished, Started, TextDelta, ToolCalled, Usage
from snapcache.server.chat.request import (
    ChatMessage,
    ChatRequest,
    NamedTool,
    ToolCallRequest,
    ToolChoice,
    ToolSpec,
    arguments_text,
    normalized_messages,
    text_of,
)
from snapcache.server.checks import schema_problem
from snapcache.server.errors import BadRequest

__all__ = ["chat_request", "error_body", "error_event", "message_events", "message_of"]

_log = logging.getLogger("snapcache")
# Anthropic's tool_choice types, as the engine's modes
_CHOICE_MODES: dict[str, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}

_STOP_REASONS = {
    "end": "end_turn",
    "length": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_calls": "tool_use",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def error_body(failure: BadRequest) -> dict[str, Any]:
    """An error in the Anthropic API's shape (which names no parameter)."""
    kind = _ERROR_TYPES.get(failure.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": str(failure)}}


def chat_request(body: ConversationRequest, scope: str) -> ChatRequest:
    """The chat request a Messages request (or a count_tokens request) is."""
    system = body.system
    messages = [ChatMessage("system", system if isinstance(system, str) else _system_text(system or []))]
    for i, message in enumerate(body.messages):
        messages.extend(_messages_of(message, f"messages.{i}.content"))
    tools = tuple(
        ToolSpec(tool.name, tool.description or "", _checked(tool.input_schema, f"tools.{i}.input_schema"))
        for i, tool in enumerate(body.tools or ())
        if tool.input_schema is not None
    )
    left_out = [tool.name for tool in body.tools or () if tool.input_schema is None]
    if left_out:
        _log.info("/v1/messages: server tools left out of the prompt: %s", ", ".join(left_out))
    choice: ToolChoice = "auto"
    parallel = True
    given = body.tool_choice
    if given is not None:
        if isinstance(given, NamedChoice):
            choice = _named_tool(given.name, tools)
        else:
            choice = _CHOICE_MODES[given.type]
        parallel = not given.disable_parallel_tool_use
    extra: dict[str, Any] = {}
    if isinstance(body, MessagesRequest):
        extra = {
            "max_tokens": body.max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "stop": tuple(body.stop_sequences or ()),
            "stream": body.stream,
        }
    return ChatRequest(
        normalized_messages(messages),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        scope=scope,
        **extra,
    )


def _checked(schema: dict[str, Any], where: str) -> dict[str, Any]:
    problem = schema_problem(schema)
    if problem is not None:
        raise BadRequest(f"{where}: {problem}", param=where)
    return schema


def _system_text(blocks: list[TextBlock]) -> str:
    # Blocks emptied by a prompt rule (the billing header) leave no blank line behind.
    return "\n".join(block.text for block in blocks if block.text)


def _named_tool(name: str, tools: tuple[ToolSpec, ...]) -> NamedTool:
    if name not in {tool.name for tool in tools}:
        raise BadRequest(f"tool_choice: no tool named {name!r} among the tools", param="tool_choice")
    return NamedTool(name)


def _messages_of(message: MessageParam, where: str) -> list[ChatMessage]:
    """One Messages message as chat messages: tool results become `tool` messages before the rest."""
    if isinstance(message.content, str):
        return [ChatMessage(message.role, message.content)]
    texts: list[str] = []
    calls: list[ToolCallRequest] = []
    results: list[ChatMessage] = []
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCallRequest(block.id, block.name, arguments_text(block.input)))
        elif isinstance(block, ToolResultBlock):
            content = (
                block.content
                if isinstance(block.content, str)
                else text_of([part.text for part in block.content or ()], f"{where}.{j}.content")
            )
            if block.is_error:
                content = f"Error: {content}"
            results.append(ChatMessage("tool", content, tool_call_id=block.tool_use_id))
    chat = list(results)
    if texts or calls or not results:
        chat.append(ChatMessage(message.role, "\n".join(texts), tuple(calls)))
    return chat


def message_of(events: list[ChatEvent], model: str) -> dict[str, Any]:
    """The Messages response of a whole completion's events."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e.call for e in events if isinstance(e, ToolCalled)]
    finished = next(e for e in events if isinstance(e, Finished))
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
    content += [_tool_use(call) for call in calls]
    return {
        "id": _message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASONS[finished.reason],
        "stop_sequence": finished.stop_sequence,
        "usage": _usage(finished.usage),
    }


async def message_events(events: AsyncIterator[ChatEvent], model: str) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed Messages response, in Anthropic's order."""
    index, open_text, pinged = -1, False, False
    async for event in events:
        if isinstance(event, Started):
            message: dict[str, Any] = {
                "id": _message_id(),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**_usage(event.usage), "output_tokens": 0},
            }
            yield _sse("message_start", {"type": "message_start", "message": message})
        elif isinstance(event, TextDelta):
            if not open_text:
                index, open_text = index + 1, True
                empty = {"type": "text", "text": ""}
                yield _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": empty},
                )
            if not pinged:
                pinged = True
                yield _sse("ping", {"type": "ping"})
            delta = {"type": "text_delta", "text": event.text}
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        elif isinstance(event, ToolCalled):
            if open_text:
                open_text = False
                yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
            call = {**_tool_use(event.call), "input": {}}
            yield _sse(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": call}
            )
            if not pinged:
                pinged = True
                yield _sse("ping", {"type": "ping"})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(_tool_input(event.call))}
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        elif isinstance(event, Finished):
            if open_text:
                yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
            if not pinged:
                yield _sse("ping", {"type": "ping"})
            ending: dict[str, Any] = {
                "stop_reason": _STOP_REASONS[event.reason],
                "stop_sequence": event.stop_sequence,
            }
            yield _sse(
                "message_delta", {"type": "message_delta", "delta": ending, "usage": _usage(event.usage)}
            )
            yield _sse("message_stop", {"type": "message_stop"})


def error_event(failure: BadRequest) -> bytes:
    """An error that happened after the stream began, as its last event."""
    return _sse("error", error_body(failure))


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.read_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _tool_use(call: ToolCallRequest) -> dict[str, Any]:
    return {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": _tool_input(call)}


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _tool_input(call: ToolCallRequest) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
