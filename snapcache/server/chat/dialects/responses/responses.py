"""OpenAI Responses over the one chat request: a `ResponsesRequest` in as a `ChatRequest` (the answer
out: `responses_output`).

Answers are stateless: nothing is stored (`store` is accepted either way), and a request that names a
`previous_response_id` is refused with a 400 that says so.
"""

from __future__ import annotations

import logging
from typing import Any

from snapcache.server.chat.chat_request import (
    ChatMessage,
    ChatRequest,
    NamedTool,
    Sampling,
    ToolChoice,
    normalized_messages,
)
from snapcache.server.chat.dialects.responses.responses_output import sse
from snapcache.server.chat.dialects.responses.responses_protocol import (
    TEXT_PARTS,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    InputMessage,
    ResponsesRequest,
)
from snapcache.server.chat.sent_images import ImagePlaces
from snapcache.server.checks import schema_problem
from snapcache.server.error_answers import BadRequest
from snapcache.server.tools import ToolCall, ToolSpec

__all__ = ["chat_request", "error_event"]

_log = logging.getLogger("snapcache")


def error_event(failure: BadRequest) -> bytes:
    """An error that happened after the stream began, as its last event."""
    error = {"type": "error", "code": failure.code, "message": str(failure), "param": failure.param}
    return sse("error", error)


def chat_request(body: ResponsesRequest, scope: str) -> ChatRequest:
    """The chat request a Responses request is."""
    if (body.model_extra or {}).get("previous_response_id") is not None:
        raise BadRequest(
            "previous_response_id: this server keeps no responses (every answer is stateless); send the "
            "whole conversation in input",
            param="previous_response_id",
        )
    messages = [ChatMessage("system", body.instructions or "")]
    places = ImagePlaces()
    if isinstance(body.input, str):
        messages.append(ChatMessage("user", body.input))
    else:
        for i, item in enumerate(body.input):
            messages.extend(_messages_of(item, f"input.{i}", places))
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
        sampling=Sampling.of(body),
        stream=body.stream,
        scope=scope,
        **ChatRequest.images_of(places),
    )


def _checked(schema: dict[str, Any] | None, where: str) -> dict[str, Any]:
    if not schema:
        return {"type": "object"}
    problem = schema_problem(schema)
    if problem is not None:
        raise BadRequest(f"{where}: {problem}", param=where)
    return schema


def _messages_of(item: Any, where: str, places: ImagePlaces) -> list[ChatMessage]:
    if isinstance(item, InputMessage):
        role = "system" if item.role == "developer" else item.role
        images = places if role == "user" else None
        return [ChatMessage(role, _text(item.content, f"{where}.content", images))]
    if isinstance(item, FunctionCallItem):
        return [ChatMessage("assistant", "", (ToolCall(item.call_id, item.name, item.arguments),))]
    if isinstance(item, FunctionCallOutputItem):
        output = _text(item.output, f"{where}.output", places)
        return [ChatMessage("tool", output, tool_call_id=item.call_id)]
    return []


def _text(content: str | list[ContentPart], where: str, places: ImagePlaces | None) -> str:
    """The text of an item's content, its parts joined by newlines, an image's place its marker
    (`places`: None where the role sends no images)."""
    if isinstance(content, str):
        return content
    pieces = []
    for j, part in enumerate(content):
        if part.type == "input_image" and places is not None:
            if part.image_url is None:
                raise BadRequest(
                    f"{where}.{j}: an input_image needs its image_url, a data URL (file_id is not served)",
                    param=f"{where}.{j}",
                )
            pieces.append(places.place_data_url(part.image_url, f"{where}.{j}.image_url"))
            continue
        if part.type not in TEXT_PARTS or part.text is None:
            supported = "text or input_image" if places is not None else "text only"
            raise BadRequest(
                f"{where}.{j}: content of type {part.type!r} is not supported ({supported})", param=where
            )
        pieces.append(part.text)
    return "\n".join(pieces)


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
