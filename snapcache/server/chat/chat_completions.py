"""OpenAI Chat Completions with tools over the one chat request: a body in, a completion or chunks out.

`POST /v1/chat/completions` stays llama-cpp-python's route for plain chats (its request model, its
checks and snapcache's usage and headers around it, as tested). A request that offers `tools` or
carries tool calls or tool results in its messages (`runs_on_engine`) is answered here instead,
through the `ChatEngine`, as Messages and Responses are: its tools rendered and its calls parsed by
the model's tool format, under a grammar for `tool_choice` `auto`, `required`, a named function or
`none`. The middleware marks such a request (`ON_ENGINE`) before it reaches the routes.

Usage follows OpenAI's API: `prompt_tokens` counts the whole prompt, `prompt_tokens_details.cached_tokens`
the part restored. `seed`, the penalties, `min_p` and `typical_p` sample as on the plain route;
`logit_bias` is accepted and ignored; `n` above 1, `logprobs` and a `response_format` other than
text are 400s.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from snapcache.server.chat.chat_completions_protocol import ChatCompletionRequest, ContentPart, Message
from snapcache.server.chat.engine import (
    ChatEvent,
    Finished,
    Started,
    TextDelta,
    ToolCallDelta,
    ToolCallDropped,
    ToolCalled,
    Usage,
)
from snapcache.server.chat.request import (
    ChatMessage,
    ChatRequest,
    NamedTool,
    Sampling,
    ToolChoice,
    normalized_messages,
)
from snapcache.server.chat.streaming import Final
from snapcache.server.checks import schema_problem
from snapcache.server.errors import BadRequest
from snapcache.server.tools import ToolCall, ToolSpec, arguments_json

__all__ = [
    "ON_ENGINE",
    "CompletionChunks",
    "chat_request",
    "completion_of",
    "error_event",
    "runs_on_engine",
]

_log = logging.getLogger("snapcache")

# The ASGI scope key that marks a Chat Completions request the engine answers.
ON_ENGINE = "snapcache.chat_engine"

_FINISH_REASONS = {"end": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


def runs_on_engine(document: Mapping[str, Any]) -> bool:
    """Whether a Chat Completions body is the engine's: it offers tools, or its messages hold tool
    calls or tool results."""
    tools = document.get("tools")
    if isinstance(tools, list) and tools:
        return True
    messages = document.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, Mapping) and (m.get("role") == "tool" or bool(m.get("tool_calls"))) for m in messages
    )


def error_event(failure: BadRequest) -> bytes:
    """An error that happened after the stream began, as its last event (the `openai` client raises
    it)."""
    return _sse(failure.document())


def chat_request(body: ChatCompletionRequest, scope: str) -> ChatRequest:
    """The chat request a Chat Completions request is; BadRequest for one the engine cannot serve."""
    _refuse_unserved(body)
    messages = [_message_of(message, f"messages.{i}") for i, message in enumerate(body.messages)]
    tools = _tools_of(body)
    given = body.tool_choice or "auto"
    choice: ToolChoice = given if isinstance(given, str) else NamedTool(given.function.name)
    if choice not in ("auto", "none") and not tools:
        named = choice.name if isinstance(choice, NamedTool) else choice
        raise BadRequest(f"tool_choice: {named!r} needs function tools", param="tool_choice")
    if isinstance(choice, NamedTool) and choice.name not in {tool.name for tool in tools}:
        raise BadRequest(
            f"tool_choice: no function named {choice.name!r} among the tools", param="tool_choice"
        )
    stop = body.stop if isinstance(body.stop, list) else [body.stop] if body.stop else []
    limit = body.max_completion_tokens or body.max_tokens
    return ChatRequest(
        normalized_messages(messages),
        max_tokens=limit if limit is not None and limit > 0 else None,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        sampling=Sampling.of(body),
        stop=tuple(stop),
        stream=body.stream,
        scope=scope,
    )


def _refuse_unserved(body: ChatCompletionRequest) -> None:
    if body.n is not None and body.n > 1:
        raise BadRequest("n: one choice per request (n = 1)", param="n")
    if body.logprobs:
        raise BadRequest(
            "logprobs is not supported: the server keeps no logits of earlier positions",
            param="logprobs",
            code="unsupported_parameter",
        )
    response_format = (body.model_extra or {}).get("response_format")
    kind = response_format.get("type") if isinstance(response_format, Mapping) else response_format
    if kind not in (None, "text"):
        raise BadRequest(
            "response_format: with tools the answer is held to a call or text by the tools' grammar; "
            "another format cannot be asked for as well",
            param="response_format",
        )


def _message_of(message: Message, where: str) -> ChatMessage:
    text = _text(message.content, f"{where}.content")
    if message.role in ("system", "developer"):
        return ChatMessage("system", text)
    if message.role == "user":
        return ChatMessage("user", text)
    if message.role == "assistant":
        calls = tuple(
            ToolCall(call.id, call.function.name, arguments_json(call.function.arguments))
            for call in message.tool_calls or ()
        )
        return ChatMessage("assistant", text, calls)
    if not message.tool_call_id:
        raise BadRequest(f"{where}: a tool message needs the tool_call_id it answers", param=where)
    return ChatMessage("tool", text, tool_call_id=message.tool_call_id, name=message.name)


def _text(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        text = part.text if part.type == "text" else part.refusal if part.type == "refusal" else None
        if text is None:
            raise BadRequest(
                f"{where}.{j}: content of type {part.type!r} is not supported (text only)", param=where
            )
        texts.append(text)
    return "\n".join(texts)


def _tools_of(body: ChatCompletionRequest) -> tuple[ToolSpec, ...]:
    tools: list[ToolSpec] = []
    left_out: list[str] = []
    for i, tool in enumerate(body.tools or ()):
        function = tool.function
        if tool.type != "function" or function is None:
            left_out.append(tool.type)
            continue
        if any(known.name == function.name for known in tools):
            raise BadRequest(f"tools: two functions are named {function.name!r}", param="tools")
        parameters = function.parameters or {"type": "object"}
        problem = schema_problem(parameters)  # llama.cpp's grammar parser would crash on some
        if problem is not None:
            where = f"tools.{i}.function.parameters"
            raise BadRequest(f"{where}: {problem}", param=where)
        tools.append(ToolSpec(function.name, function.description or "", parameters))
    if left_out:
        _log.info("/v1/chat/completions: tools other than functions left out: %s", ", ".join(left_out))
    return tuple(tools)


class _Answer:
    """A completion as its events build it."""

    def __init__(self, body: ChatCompletionRequest) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = body.model or ""
        self.text = ""
        self.calls: list[ToolCall] = []
        self.finished: Finished | None = None
        self.usage = Usage()

    def add(self, event: ChatEvent) -> None:
        if isinstance(event, TextDelta | ToolCallDropped):
            self.text += event.text  # a dropped call's text in its place
        elif isinstance(event, ToolCalled):
            self.calls.append(event.call)
        elif isinstance(event, Finished):
            self.finished, self.usage = event, event.usage
        elif isinstance(event, Started):
            self.usage = event.usage

    @property
    def finish_reason(self) -> str:
        return _FINISH_REASONS[self.finished.reason] if self.finished is not None else "stop"

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage_document(self) -> dict[str, Any]:
        usage = self.usage
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        }


def completion_of(events: list[ChatEvent], body: ChatCompletionRequest) -> dict[str, Any]:
    """The `chat.completion` object of a whole completion's events."""
    answer = _Answer(body)
    for event in events:
        answer.add(event)
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    if answer.calls:
        message["tool_calls"] = [_call(call) for call in answer.calls]
    else:
        message["content"] = answer.text
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}
    return {**answer.head("chat.completion"), "choices": [choice], "usage": answer.usage_document()}


class CompletionChunks:
    """The server-sent `chat.completion.chunk` events of a streamed completion, then `[DONE]`.

    The first chunk (the assistant's role) goes out once the prompt is read. A call goes out as the
    engine gives it: its index, id, type and name, then its arguments, whole or (with live calls)
    in pieces as the model writes them. A call announced and then not made stays as far as it went
    (the finish reason says why); its text is not sent as content.
    """

    def __init__(self, body: ChatCompletionRequest) -> None:
        self._answer = _Answer(body)
        options = body.stream_options
        self._usage = options is not None and bool(options.include_usage)
        self._indices: dict[str, int] = {}  # the index of each call sent, by id

    async def events(self, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        answer = self._answer
        async for event in events:
            answer.add(event)
            if isinstance(event, Started):
                yield self._chunk({"role": "assistant", "content": ""})
            elif isinstance(event, TextDelta):
                yield self._chunk({"content": event.text})
            elif isinstance(event, ToolCallDelta):
                for chunk in self._call_piece(event.id, event.name, event.arguments):
                    yield chunk
            elif isinstance(event, ToolCalled):
                call = event.call
                if call.id not in self._indices:
                    for chunk in self._call_piece(call.id, call.name, call.arguments):
                        yield chunk
            elif isinstance(event, ToolCallDropped):
                if event.id not in self._indices and event.text:
                    yield self._chunk({"content": event.text})
            elif isinstance(event, Finished):
                yield self._chunk({}, answer.finish_reason)
                if self._usage:
                    usage = answer.usage_document()
                    yield _sse({**answer.head("chat.completion.chunk"), "choices": [], "usage": usage})
                yield Final(b"data: [DONE]\n\n")

    def _call_piece(self, call_id: str, name: str, arguments: str) -> list[bytes]:
        """The chunks of a call's next piece: it named first, if not yet sent, then `arguments`."""
        chunks = []
        index = self._indices.get(call_id)
        if index is None:
            index = self._indices[call_id] = len(self._indices)
            function = {"name": name, "arguments": ""}
            opened = {"index": index, "id": call_id, "type": "function", "function": function}
            chunks.append(self._chunk({"tool_calls": [opened]}))
        if arguments:
            chunks.append(
                self._chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
            )
        return chunks

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk: dict[str, Any] = {**self._answer.head("chat.completion.chunk"), "choices": [choice]}
        if self._usage:
            chunk["usage"] = None  # as OpenAI sends: the usage comes in a last chunk of its own
        return _sse(chunk)


def _call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
