"""OpenAI Responses over the one chat request: a `ResponsesRequest` in, a response or its events out.

Answers are stateless: nothing is stored (`store` is accepted either way), and a request that names a
`previous_response_id` is refused with a 400 that says so. Usage follows OpenAI's API:
`input_tokens` counts the whole prompt, `input_tokens_details.cached_tokens` the part restored.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from snapcache.server.chat.engine import ChatEvent, Finished, Started, TextDelta, ToolCalled, Usage
from snapcache.server.chat.request import (
    ChatMessage,
    ChatRequest,
    NamedTool,
    ToolCallRequest,
    ToolChoice,
    ToolSpec,
    normalized_messages,
)
from snapcache.server.chat.responses_protocol import (
    TEXT_PARTS,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    InputMessage,
    ResponsesRequest,
)
from snapcache.server.checks import schema_problem
from snapcache.server.errors import BadRequest

__all__ = ["ResponseEvents", "chat_request", "error_event", "response_of"]

_log = logging.getLogger("snapcache")


def error_event(failure: BadRequest) -> bytes:
    """An error that happened after the stream began, as its last event."""
    error = {"type": "error", "code": failure.code, "message": str(failure), "param": failure.param}
    return _sse("error", error)


def chat_request(body: ResponsesRequest, scope: str) -> ChatRequest:
    """The chat request a Responses request is."""
    if (body.model_extra or {}).get("previous_response_id") is not None:
        raise BadRequest(
            "previous_response_id: this server keeps no responses (every answer is stateless); send the "
            "whole conversation in input",
            param="previous_response_id",
        )
    messages = [ChatMessage("system", body.instructions or "")]
    if isinstance(body.input, str):
        messages.append(ChatMessage("user", body.input))
    else:
        for i, item in enumerate(body.input):
            messages.extend(_messages_of(item, f"input.{i}"))
    tools = tuple(
        ToolSpec(tool.name, tool.description or "", _checked(tool.parameters, f"tools.{i}.parameters"))
        for i, tool in enumerate(body.tools or ())
        if tool.type == "function" and tool.name
    )
    left_out = [
        tool.name or tool.type for tool in body.tools or () if tool.type != "function" or not tool.name
    ]
    if left_out:
        _log.info("/v1/responses: tools other than functions left out of the prompt: %s", ", ".join(left_out))
    given = body.tool_choice or "auto"
    choice: ToolChoice = given if isinstance(given, str) else NamedTool(given.name)
    if isinstance(given, FunctionChoice) and given.name not in {tool.name for tool in tools}:
        raise BadRequest(
            f"tool_choice: no function named {given.name!r} among the tools", param="tool_choice"
        )
    return ChatRequest(
        normalized_messages(_merged_calls(messages)),
        max_tokens=body.max_output_tokens,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        temperature=body.temperature,
        top_p=body.top_p,
        stream=body.stream,
        scope=scope,
    )


def _checked(schema: dict[str, Any] | None, where: str) -> dict[str, Any]:
    if not schema:
        return {"type": "object"}
    problem = schema_problem(schema)
    if problem is not None:
        raise BadRequest(f"{where}: {problem}", param=where)
    return schema


def _messages_of(item: Any, where: str) -> list[ChatMessage]:
    if isinstance(item, InputMessage):
        role = "system" if item.role == "developer" else item.role
        return [ChatMessage(role, _text(item.content, f"{where}.content"))]
    if isinstance(item, FunctionCallItem):
        return [ChatMessage("assistant", "", (ToolCallRequest(item.call_id, item.name, item.arguments),))]
    if isinstance(item, FunctionCallOutputItem):
        return [ChatMessage("tool", _text(item.output, f"{where}.output"), tool_call_id=item.call_id)]
    return []


def _text(content: str | list[ContentPart], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in TEXT_PARTS or part.text is None:
            raise BadRequest(
                f"{where}.{j}: content of type {part.type!r} is not supported (text only)", param=where
            )
        texts.append(part.text)
    return "\n".join(texts)


def _merged_calls(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Function calls in a row (and the assistant text just before them) as one assistant turn."""
    merged: list[ChatMessage] = []
    for message in messages:
        last = merged[-1] if merged else None
        if message.tool_calls and last is not None and last.role == "assistant":
            merged[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, *message.tool_calls))
        else:
            merged.append(message)
    return merged


def response_of(events: list[ChatEvent], body: ResponsesRequest) -> dict[str, Any]:
    """The Responses object of a whole completion's events."""
    answer = _Answer(body)
    for event in events:
        answer.add(event)
    return answer.document("completed")


class _Answer:
    """A response as its events build it."""

    def __init__(self, body: ResponsesRequest) -> None:
        self.body = body
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.text = ""
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.calls: list[ToolCallRequest] = []
        self.finished: Finished | None = None
        self.usage = Usage()

    def add(self, event: ChatEvent) -> None:
        if isinstance(event, TextDelta):
            self.text += event.text
        elif isinstance(event, ToolCalled):
            self.calls.append(event.call)
        elif isinstance(event, Finished):
            self.finished, self.usage = event, event.usage
        elif isinstance(event, Started):
            self.usage = event.usage

    def message(self, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": self.text, "annotations": []}
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [part] if status == "completed" else [],
        }

    def output(self) -> list[dict[str, Any]]:
        items = [self.message("completed")] if self.text or not self.calls else []
        return items + [_call_item(call, "completed") for call in self.calls]

    def document(self, status: str) -> dict[str, Any]:
        body, usage, done = self.body, self.usage, self.finished
        incomplete = done is not None and done.reason == "length"
        if status == "completed" and incomplete:
            status = "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": body.model or "",
            "output": self.output() if done is not None else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": False,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": _dumped(body.tool_choice) or "auto",
            "tools": [_dumped(tool) for tool in body.tools or ()],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "metadata": {},
            "usage": {
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            }
            if done is not None
            else None,
        }


class ResponseEvents:
    """The server-sent events of a streamed response, each with its `sequence_number`."""

    def __init__(self, body: ResponsesRequest) -> None:
        self._answer = _Answer(body)
        self._sequence = 0

    async def events(self, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        answer = self._answer
        text_open = False
        async for event in events:
            answer.add(event)
            if isinstance(event, Started):
                yield self._event("response.created", response=answer.document("in_progress"))
                yield self._event("response.in_progress", response=answer.document("in_progress"))
            elif isinstance(event, TextDelta):
                if not text_open:
                    text_open = True
                    for chunk in self._text_opened():
                        yield chunk
                yield self._event(
                    "response.output_text.delta", **self._text_at(), delta=event.text, logprobs=[]
                )
            elif isinstance(event, ToolCalled):
                if text_open:
                    text_open = False
                    for chunk in self._text_closed():
                        yield chunk
                for chunk in self._call(event.call):
                    yield chunk
            elif isinstance(event, Finished):
                if text_open:
                    for chunk in self._text_closed():
                        yield chunk
                # Always `response.completed`, its status saying whether max_output_tokens cut it:
                # agents such as Codex fail a turn on `response.incomplete`, and a capped answer
                # is still an answer.
                yield self._event("response.completed", response=answer.document("completed"))

    def _text_at(self) -> dict[str, Any]:
        return {"item_id": self._answer.message_id, "output_index": 0, "content_index": 0}

    def _text_opened(self) -> list[bytes]:
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event(
                "response.output_item.added", output_index=0, item=self._answer.message("in_progress")
            ),
            self._event("response.content_part.added", **self._text_at(), part=part),
        ]

    def _text_closed(self) -> list[bytes]:
        text = self._answer.text
        part = {"type": "output_text", "text": text, "annotations": []}
        return [
            self._event("response.output_text.done", **self._text_at(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._text_at(), part=part),
            self._event("response.output_item.done", output_index=0, item=self._answer.message("completed")),
        ]

    def _call(self, call: ToolCallRequest) -> list[bytes]:
        answer = self._answer
        index = len(answer.calls) - 1 + (1 if answer.text else 0)
        item = _call_item(call, "in_progress")
        at = {"item_id": item["id"], "output_index": index}
        return [
            self._event("response.output_item.added", output_index=index, item={**item, "arguments": ""}),
            self._event("response.function_call_arguments.delta", **at, delta=call.arguments),
            self._event(
                "response.function_call_arguments.done", **at, name=call.name, arguments=call.arguments
            ),
            self._event("response.output_item.done", output_index=index, item=_call_item(call, "completed")),
        ]

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return _sse(kind, data)


def _call_item(call: ToolCallRequest, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def _dumped(value: Any) -> Any:
    return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
