"""The Responses object and its server-sent events, as a completion's events build them.

Output items come in the order the answer writes them: text as a message item, a call as a
`function_call` item. Usage follows OpenAI's API: `input_tokens` counts the whole prompt,
`input_tokens_details.cached_tokens` the part restored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from snapcache.server.chat.dialects.responses.responses_protocol import ResponsesRequest
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

__all__ = ["ResponseEvents", "response_of", "sse"]


def response_of(events: list[ChatEvent], body: ResponsesRequest) -> dict[str, Any]:
    """The Responses object of a whole completion's events."""
    answer = _Answer(body, streamed=False)
    for event in events:
        answer.add(event)
    return answer.document("completed")


@dataclass(slots=True)
class _Message:
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    text: str = ""

    def item(self, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": self.text, "annotations": []}
        content = [part] if status == "completed" else []
        return {"type": "message", "id": self.id, "status": status, "role": "assistant", "content": content}


@dataclass(slots=True)
class _FunctionCall:
    call_id: str
    name: str
    arguments: str = ""
    status: str = "in_progress"

    @property
    def id(self) -> str:
        return "fc_" + self.call_id.removeprefix("call_")

    def item(self) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": self.id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
            "status": self.status,
        }


_Item = _Message | _FunctionCall


class _Answer:
    """A response as its events build it: its output items in order.

    Calls are items from their first delta. A call dropped after it was announced is, in a stream
    (`streamed`), an item left `incomplete`, its arguments as far as they were written; in a whole
    response its text takes its place, as text. A call the token limit cut short is an `incomplete`
    item in a whole response (`ToolCallCut`), and in a stream where live deltas announced it.
    """

    def __init__(self, body: ResponsesRequest, *, streamed: bool) -> None:
        self.body = body
        self.streamed = streamed
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.items: list[_Item] = []
        self.finished: Finished | None = None
        self.usage = Usage()

    def add(self, event: ChatEvent) -> _Item | None:
        """Take the next event; return the output item it added to, if any."""
        if isinstance(event, TextDelta):
            return self._text(event.text)
        if isinstance(event, ToolCallDelta):
            call = self._call(event.id, event.name)
            call.arguments += event.arguments
            return call
        if isinstance(event, ToolCalled):
            call = self._call(event.call.id, event.call.name)
            call.arguments, call.status = event.call.arguments, "completed"
            return call
        if isinstance(event, ToolCallCut):
            if self.streamed:  # a stream shows a cut call only as its live deltas sent it
                return None
            call = self._call(event.call.id, event.call.name)
            call.arguments, call.status = event.call.arguments, "incomplete"
            return call
        if isinstance(event, ToolCallDropped):
            return self._dropped(event)
        if isinstance(event, Finished):
            self.finished, self.usage = event, event.usage
        else:
            self.usage = event.usage
        return None

    def _text(self, text: str) -> _Message | None:
        if not text:
            return None
        last = self.items[-1] if self.items else None
        if not isinstance(last, _Message):
            last = _Message()
            self.items.append(last)
        last.text += text
        return last

    def _call(self, call_id: str, name: str) -> _FunctionCall:
        for item in self.items:
            if isinstance(item, _FunctionCall) and item.call_id == call_id:
                return item
        call = _FunctionCall(call_id, name)
        self.items.append(call)
        return call

    def _dropped(self, event: ToolCallDropped) -> _Item | None:
        call = next((i for i in self.items if isinstance(i, _FunctionCall) and i.call_id == event.id), None)
        if call is None:
            return self._text(event.text)
        if self.streamed or event.cut:
            call.status = "incomplete"
            return call
        self.items.remove(call)
        return self._text(event.text)

    def output(self) -> list[dict[str, Any]]:
        items = self.items or [_Message()]
        return [item.item("completed") if isinstance(item, _Message) else item.item() for item in items]

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
    """The server-sent events of a streamed response, each with its `sequence_number`.

    Output items come in the order the answer writes them: text as a message item, a call as a
    `function_call` item, its arguments whole or (with live calls, the item added once the tool's
    name is known) in pieces as written. A call announced and then not made is done as
    `incomplete`, its arguments as far as they went.
    """

    def __init__(self, body: ResponsesRequest) -> None:
        self._answer = _Answer(body, streamed=True)
        self._sequence = 0
        self._open: _Message | None = None  # the message item text goes to

    async def events(self, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        async for event in events:
            for chunk in self._chunks(event):
                yield chunk

    def _chunks(self, event: ChatEvent) -> list[bytes]:
        answer = self._answer
        count = len(answer.items)
        item = answer.add(event)
        new = len(answer.items) > count  # a stream's items are only ever added
        if isinstance(event, Started):
            return [
                self._event("response.created", response=answer.document("in_progress")),
                self._event("response.in_progress", response=answer.document("in_progress")),
            ]
        if isinstance(event, Finished):
            # Always `response.completed`, its status saying whether max_output_tokens cut it: agents
            # such as Codex fail a turn on `response.incomplete`, and a capped answer is an answer.
            done = self._message_done()
            return [*done, Final(self._event("response.completed", response=answer.document("completed")))]
        if isinstance(item, _Message):
            chunks = self._message_opened(item) if self._open is not item else []
            text = event.text if isinstance(event, TextDelta | ToolCallDropped) else ""
            return [
                *chunks,
                self._event("response.output_text.delta", **self._at(item), delta=text, logprobs=[]),
            ]
        if not isinstance(item, _FunctionCall):
            return []
        chunks = self._message_done()
        if new:
            added = {**item.item(), "arguments": "", "status": "in_progress"}
            chunks.append(
                self._event("response.output_item.added", output_index=self._index(item), item=added)
            )
        if isinstance(event, ToolCallDelta) and event.arguments:
            delta = event.arguments
        elif isinstance(event, ToolCalled) and new:
            delta = item.arguments
        else:
            delta = ""
        if delta:
            chunks.append(
                self._event("response.function_call_arguments.delta", **self._at(item), delta=delta)
            )
        if isinstance(event, ToolCalled | ToolCallDropped):
            at = self._at(item)
            chunks.append(
                self._event(
                    "response.function_call_arguments.done", **at, name=item.name, arguments=item.arguments
                )
            )
            chunks.append(
                self._event("response.output_item.done", output_index=at["output_index"], item=item.item())
            )
        return chunks

    def _index(self, item: _Item) -> int:
        return next(i for i, known in enumerate(self._answer.items) if known is item)

    def _at(self, item: _Item) -> dict[str, Any]:
        at: dict[str, Any] = {"item_id": item.id, "output_index": self._index(item)}
        if isinstance(item, _Message):
            at["content_index"] = 0
        return at

    def _message_opened(self, message: _Message) -> list[bytes]:
        chunks = self._message_done()
        self._open = message
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            *chunks,
            self._event(
                "response.output_item.added",
                output_index=self._index(message),
                item=message.item("in_progress"),
            ),
            self._event("response.content_part.added", **self._at(message), part=part),
        ]

    def _message_done(self) -> list[bytes]:
        message, self._open = self._open, None
        if message is None:
            return []
        part = {"type": "output_text", "text": message.text, "annotations": []}
        at = self._at(message)
        return [
            self._event("response.output_text.done", **at, text=message.text, logprobs=[]),
            self._event("response.content_part.done", **at, part=part),
            self._event(
                "response.output_item.done", output_index=at["output_index"], item=message.item("completed")
            ),
        ]

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(kind, data)


def _dumped(value: Any) -> Any:
    return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
