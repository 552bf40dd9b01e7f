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

from snapcache.server.chat.chat_request import (
    ChatMessage,
    ChatRequest,
    NamedTool,
    Sampling,
    ToolChoice,
    normalized_messages,
)
from snapcache.server.chat.dialects.anthropic.anthropic_protocol import (
    ConversationRequest,
    ImageBlock,
    MessageParam,
    MessagesRequest,
    NamedChoice,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from snapcache.server.chat.dialects.streaming import Final
from snapcache.server.chat.events import (
    ChatEvent,
    Finished,
    Started,
    TextDelta,
    ToolCallCut,
    ToolCallDelta,
    ToolCallDropped,
    ToolCalled,
    Usage,
)
from snapcache.server.chat.sent_images import ImagePlaces
from snapcache.server.checks import schema_problem
from snapcache.server.error_answers import BadRequest
from snapcache.server.tools import ToolCall, ToolSpec, arguments_json

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
    places = ImagePlaces()
    for i, message in enumerate(body.messages):
        messages.extend(_messages_of(message, f"messages.{i}.content", places))
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
            "sampling": Sampling.of(body),
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
        **ChatRequest.images_of(places),
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


def _messages_of(message: MessageParam, where: str, places: ImagePlaces) -> list[ChatMessage]:
    """One Messages message as chat messages: tool results become `tool` messages before the rest."""
    if isinstance(message.content, str):
        return [ChatMessage(message.role, message.content)]
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock):
            texts.append(_image(block, f"{where}.{j}", places))
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCall(block.id, block.name, arguments_json(block.input)))
        elif isinstance(block, ToolResultBlock):
            content = _result_text(block.content, f"{where}.{j}.content", places)
            if block.is_error:
                content = f"Error: {content}"
            results.append(ChatMessage("tool", content, tool_call_id=block.tool_use_id))
    chat = list(results)
    if texts or calls or not results:
        chat.append(ChatMessage(message.role, "\n".join(texts), tuple(calls)))
    return chat


def _result_text(content: str | list[TextBlock | ImageBlock] | None, where: str, places: ImagePlaces) -> str:
    """A tool result's text, its blocks joined by newlines, an image's place its marker."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(
        block.text if isinstance(block, TextBlock) else _image(block, f"{where}.{j}", places)
        for j, block in enumerate(content)
    )


def _image(block: ImageBlock, where: str, places: ImagePlaces) -> str:
    """The marker of an image block's image (BadRequest for one not sent as base64 bytes)."""
    source = block.source
    if source.type != "base64" or source.data is None:
        raise BadRequest(
            f"{where}.source: the server fetches nothing; send the image as base64 "
            f'(source.type "base64", not {source.type!r})',
            param=f"{where}.source",
        )
    return places.place_base64(source.data, f"{where}.source.data")


def message_of(events: list[ChatEvent], model: str) -> dict[str, Any]:
    """The Messages response of a whole completion's events."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta | ToolCallDropped))
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
    stream = _MessageStream(model)
    async for event in events:
        for chunk in stream.add(event):
            yield chunk


class _MessageStream:
    """The events of one streamed message: content blocks one after another, each started, filled
    and stopped.

    A call goes out as the engine gives it: whole (its `tool_use` block, its input in one
    `input_json_delta`), or with live calls as the model writes it, the block started when the
    tool's name is known and the input in pieces. A call announced and then not made ends where it
    was cut (the stop reason says why); its text is not sent again as text.
    """

    def __init__(self, model: str) -> None:
        self._model = model
        self._index = -1  # the block being written, or the last one
        self._open: str | None = None  # "text", a call's id, or None: no block open
        self._announced: set[str] = set()
        self._pinged = False

    def add(self, event: ChatEvent) -> list[bytes]:
        if isinstance(event, Started):
            return [self._started(event.usage)]
        if isinstance(event, TextDelta):
            return self._text(event.text)
        if isinstance(event, ToolCallDelta):
            return self._call_piece(event)
        if isinstance(event, ToolCalled):
            if event.call.id in self._announced:
                return self._closed(event.call.id)
            call = event.call
            opened = self._call_piece(ToolCallDelta(-1, call.id, call.name, ""))
            piece = self._call_piece(ToolCallDelta(-1, call.id, call.name, json.dumps(_tool_input(call))))
            return [*opened, *piece, *self._closed(call.id)]
        if isinstance(event, ToolCallDropped):
            return self._closed(event.id) if event.id in self._announced else self._text(event.text)
        if isinstance(event, ToolCallCut):
            return []  # a tool_use block's input is an object: a cut call is only its stop reason
        return self._finished(event)

    def _started(self, usage: Usage) -> bytes:
        message: dict[str, Any] = {
            "id": _message_id(),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**_usage(usage), "output_tokens": 0},
        }
        return _sse("message_start", {"type": "message_start", "message": message})

    def _text(self, text: str) -> list[bytes]:
        if not text:
            return []
        chunks = [] if self._open == "text" else self._opened("text", {"type": "text", "text": ""})
        return [*chunks, self._delta({"type": "text_delta", "text": text})]

    def _call_piece(self, piece: ToolCallDelta) -> list[bytes]:
        chunks: list[bytes] = []
        if piece.id not in self._announced:
            self._announced.add(piece.id)
            block = {"type": "tool_use", "id": _tool_use_id(piece.id), "name": piece.name, "input": {}}
            chunks = self._opened(piece.id, block)
        elif self._open != piece.id:
            return []  # a block already stopped takes no more
        if piece.arguments:
            chunks.append(self._delta({"type": "input_json_delta", "partial_json": piece.arguments}))
        return chunks

    def _opened(self, block_id: str, block: dict[str, Any]) -> list[bytes]:
        chunks = self._closed(self._open)
        self._index, self._open = self._index + 1, block_id
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        chunks.append(_sse("content_block_start", start))
        if not self._pinged:
            self._pinged = True
            chunks.append(_sse("ping", {"type": "ping"}))
        return chunks

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )

    def _closed(self, block_id: str | None) -> list[bytes]:
        if block_id is None or self._open != block_id:
            return []
        self._open = None
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _finished(self, event: Finished) -> list[bytes]:
        chunks = self._closed(self._open)
        if not self._pinged:
            chunks.append(_sse("ping", {"type": "ping"}))
        ending: dict[str, Any] = {
            "stop_reason": _STOP_REASONS[event.reason],
            "stop_sequence": event.stop_sequence,
        }
        chunks.append(
            _sse("message_delta", {"type": "message_delta", "delta": ending, "usage": _usage(event.usage)})
        )
        chunks.append(Final(_sse("message_stop", {"type": "message_stop"})))
        return chunks


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


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": _tool_input(call)}


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _tool_input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
