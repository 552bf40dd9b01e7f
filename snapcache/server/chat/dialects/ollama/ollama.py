"""Ollama's API over the one chat request: `/api/chat` and `/api/generate` bodies in, NDJSON or a
whole answer out.

A chat's messages, tools and `options` become a `ChatRequest`; `/api/generate` is a chat of its
`system` text and its `prompt`, rendered by the model's template as Ollama renders it (a `raw`
prompt, a `suffix`, a `template` of the request's own or the deprecated `context` are 400s: they
would bypass the template every prefix is cached under). Streamed (Ollama's default), every piece of
text is one JSON line, a call is one line with its whole `tool_calls` entry, and the last line says
`done` with the counts and durations Ollama reports: `prompt_eval_count` is the prompt tokens read
afresh (a restored prefix is not read again, as in Ollama's own cache), `eval_count` those
generated, durations in nanoseconds. A request with no messages (or an empty prompt) asks for the
model to be loaded: it is, and the answer says so (`done_reason` "load").

Ollama's calls carry no id in older clients: a call given without one gets `call_<message>_<call>`,
its place in the conversation (the same every turn, so the rendered prompt stays a prefix), and a
tool result names its call by `tool_call_id`, else by `tool_name`, else by order among the
assistant turn's calls not yet answered.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timezone
from typing import Any

from snapcache.server.chat.chat_request import ChatMessage, ChatRequest, Sampling, normalized_messages
from snapcache.server.chat.dialects.ollama.ollama_protocol import (
    ChatBody,
    GenerateBody,
    Message,
    Options,
    Tool,
)
from snapcache.server.chat.dialects.streaming import Final
from snapcache.server.chat.events import (
    ChatEvent,
    Finished,
    Started,
    TextDelta,
    ToolCallDropped,
    ToolCalled,
)
from snapcache.server.chat.sent_images import ImagePlaces
from snapcache.server.checks import schema_problem
from snapcache.server.error_answers import BadRequest
from snapcache.server.tools import ToolCall, ToolSpec, arguments_json, arguments_object

__all__ = [
    "NDJSON",
    "Answer",
    "chat_request",
    "check_generate",
    "error_body",
    "error_line",
    "generate_request",
    "loaded",
]

NDJSON = "application/x-ndjson"
_ZERO_DURATION = re.compile(r"0+[smh]?")
_DONE_REASONS = {"end": "stop", "stop_sequence": "stop", "tool_calls": "stop", "length": "length"}


def error_body(failure: BadRequest) -> dict[str, Any]:
    """Ollama's error document: `{"error": message}`."""
    return {"error": str(failure)}


def error_line(failure: BadRequest) -> bytes:
    """An error once the stream began: its last line (the `ollama` client raises it)."""
    return _line(error_body(failure))


def chat_request(body: ChatBody, scope: str) -> ChatRequest:
    """The chat request of an `/api/chat` body; BadRequest for one that cannot be served."""
    places = ImagePlaces()
    messages = _messages_of(body.messages, places)
    tools = _tools_of(body.tools or ())
    return _request(body, normalized_messages(messages), tools, scope, places)


def generate_request(body: GenerateBody, scope: str) -> ChatRequest:
    """The chat request of an `/api/generate` body: its system text, then its prompt as the user's."""
    check_generate(body)
    system = (ChatMessage("system", body.system),) if body.system else ()
    places = ImagePlaces()
    prompt = _with_images(body.prompt, body.images, "images", places)
    return _request(body, (*system, ChatMessage("user", prompt)), (), scope, places)


def check_generate(body: GenerateBody) -> None:
    """BadRequest for an `/api/generate` body that asks for what is not served (see the module
    docstring), whether or not it holds a prompt."""
    for name in ("suffix", "template"):
        if getattr(body, name):
            raise BadRequest(
                f"{name} is not supported: prompts are rendered by the model's template", param=name
            )
    if body.raw:
        raise BadRequest("raw prompts are not supported here: send them to /v1/completions", param="raw")
    if body.context:
        raise BadRequest(
            "context is not supported: send the conversation as messages to /api/chat", param="context"
        )


def loaded(body: ChatBody | GenerateBody) -> dict[str, Any]:
    """The answer to a request that only asks for the model to be loaded (or, `keep_alive` 0,
    unloaded: the one served model stays, and the answer says what was asked)."""
    document: dict[str, Any] = {"model": body.model, "created_at": _now()}
    if isinstance(body, ChatBody):
        document["message"] = {"role": "assistant", "content": ""}
    else:
        document["response"] = ""
    return {**document, "done": True, "done_reason": "unload" if _unloads(body.keep_alive) else "load"}


def _unloads(keep_alive: float | str | None) -> bool:
    """Whether `keep_alive` is zero: 0, or a duration of none ("0", "0s", "0m", "0h")."""
    if isinstance(keep_alive, str):
        return _ZERO_DURATION.fullmatch(keep_alive) is not None
    return keep_alive == 0


def _request(
    body: ChatBody | GenerateBody,
    messages: tuple[ChatMessage, ...],
    tools: tuple[ToolSpec, ...],
    scope: str,
    places: ImagePlaces,
) -> ChatRequest:
    options = body.options or Options()
    stop = [options.stop] if isinstance(options.stop, str) else options.stop or []
    limit = options.num_predict  # -1 (no limit) and -2 (fill the context): the server's cap
    return ChatRequest(
        messages,
        max_tokens=limit if limit is not None and limit > 0 else None,
        tools=tools,
        sampling=Sampling.of(options),
        stop=tuple(stop),
        response_format=_response_format(body.format, bool(tools)),
        stream=body.stream,
        scope=scope,
        **ChatRequest.images_of(places),
    )


def _response_format(given: str | dict[str, Any] | None, tools: bool) -> dict[str, Any] | None:
    if not given:
        return None
    if tools:
        raise BadRequest(
            "format: with tools the answer is held to a call or text by the tools' grammar; another "
            "format cannot be asked for as well",
            param="format",
        )
    if given == "json":
        return {"type": "json_object"}
    problem = schema_problem(given)  # llama.cpp's grammar parser would crash on some
    if problem is not None:
        raise BadRequest(f"format: {problem}", param="format")
    return {"type": "json_object", "schema": given}


def _messages_of(messages: Sequence[Message], places: ImagePlaces) -> list[ChatMessage]:
    chat: list[ChatMessage] = []
    made: list[ToolCall] = []  # every call so far
    unanswered: list[ToolCall] = []  # the latest assistant turn's calls without a result yet
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if message.images and message.role not in ("user", "tool"):
            raise BadRequest(
                f"{where}.images: images are read in user and tool messages, not in a {message.role}'s",
                param=f"{where}.images",
            )
        text = _with_images(message.content or "", message.images, f"{where}.images", places)
        if message.role == "assistant":
            calls = tuple(
                ToolCall(
                    call.id or f"call_{i}_{j}", call.function.name, arguments_json(call.function.arguments)
                )
                for j, call in enumerate(message.tool_calls or ())
            )
            unanswered = list(calls)
            made.extend(calls)
            chat.append(ChatMessage("assistant", text, calls))
        elif message.role == "tool":
            call_id, name = _answered(message, unanswered, made, where)
            chat.append(ChatMessage("tool", text, tool_call_id=call_id, name=name))
        else:
            chat.append(ChatMessage(message.role, text))
    return chat


def _with_images(text: str, images: Sequence[Any] | None, where: str, places: ImagePlaces) -> str:
    """`text` after the markers of `images` (base64 texts), each on a line of its own, as Ollama
    places a message's images before its text."""
    markers = []
    for k, image in enumerate(images or ()):
        if not isinstance(image, str):
            raise BadRequest(f"{where}.{k}: an image is base64 text, not {type(image).__name__}", param=where)
        markers.append(places.place_base64(image, f"{where}.{k}"))
    return "\n".join([*markers, text]) if markers else text


def _answered(
    message: Message, unanswered: list[ToolCall], made: list[ToolCall], where: str
) -> tuple[str, str | None]:
    """The id and name of the call a tool result answers, as Ollama renders a conversation: the
    unanswered call of its id, else of its tool's name, else the first unanswered one (taken off
    `unanswered`); with none left, the last call made of its id or name, or the last call made.
    Only a result with no call at all before it is a BadRequest."""
    wanted_id, wanted_name = message.tool_call_id, message.tool_name
    for pool in (unanswered, made[::-1]):
        call = next((c for c in pool if wanted_id and c.id == wanted_id), None)
        call = call or next((c for c in pool if wanted_name and c.name == wanted_name), None)
        call = call or (pool[0] if pool else None)
        if call is not None:
            if pool is unanswered:
                unanswered.remove(call)
            return call.id, call.name
    raise BadRequest(
        f"{where}: a tool result answers no call: no assistant message before it made one", param=where
    )


def _tools_of(tools: Sequence[Tool]) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        function = tool.function
        if tool.type != "function" or function is None:
            continue
        if any(known.name == function.name for known in specs):
            raise BadRequest(f"tools: two functions are named {function.name!r}", param="tools")
        parameters = function.parameters or {"type": "object", "properties": {}}
        problem = schema_problem(parameters)
        if problem is not None:
            where = f"tools.{i}.function.parameters"
            raise BadRequest(f"{where}: {problem}", param=where)
        specs.append(ToolSpec(function.name, function.description or "", parameters))
    return tuple(specs)


class Answer:
    """An `/api/chat` (`chat`) or `/api/generate` answer to `model`, as its events build it:
    whole (`of`) or as NDJSON lines (`lines`)."""

    def __init__(self, model: str, *, chat: bool) -> None:
        self._model = model
        self._chat = chat
        self._read_ns = 0

    def of(self, events: list[ChatEvent]) -> dict[str, Any]:
        """The whole answer of a request's events."""
        text, calls, finished = "", [], None
        for event in events:
            if isinstance(event, TextDelta | ToolCallDropped):
                text += event.text  # a dropped call's text in its place
            elif isinstance(event, ToolCalled):
                calls.append(event.call)
            elif isinstance(event, Started):
                self._read_ns = event.elapsed_ns
            elif isinstance(event, Finished):
                finished = event
        return self._done(text, calls, finished)

    async def lines(self, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        """The streamed answer: a line per piece of text and per call, then the `done` line."""
        calls = 0
        async for event in events:
            if isinstance(event, Started):
                self._read_ns = event.elapsed_ns
            elif isinstance(event, TextDelta | ToolCallDropped) and event.text:
                yield _line(self._piece(event.text))
            elif isinstance(event, ToolCalled):
                yield _line(self._piece("", [_call(event.call, calls)]))
                calls += 1
            elif isinstance(event, Finished):
                yield Final(_line(self._done("", [], event)))

    def _piece(self, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        document: dict[str, Any] = {"model": self._model, "created_at": _now()}
        if not self._chat:
            return {**document, "response": text, "done": False}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return {**document, "message": message, "done": False}

    def _done(self, text: str, calls: list[ToolCall], finished: Finished | None) -> dict[str, Any]:
        document = self._piece(text, [_call(call, i) for i, call in enumerate(calls)])
        reason = _DONE_REASONS[finished.reason] if finished is not None else "stop"
        usage = finished.usage if finished is not None else None
        total = finished.elapsed_ns if finished is not None else 0
        return {
            **document,
            "done": True,
            "done_reason": reason,
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_count": usage.read_tokens if usage is not None else 0,
            "prompt_eval_duration": self._read_ns,
            "eval_count": usage.completion_tokens if usage is not None else 0,
            "eval_duration": max(0, total - self._read_ns),
        }


def _call(call: ToolCall, index: int) -> dict[str, Any]:
    function = {"index": index, "name": call.name, "arguments": arguments_object(call.arguments)}
    return {"id": call.id, "function": function}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _line(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
