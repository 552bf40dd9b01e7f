"""OpenAI Chat Completions over the one chat request: a body in, a completion or chunks out.

Every `POST /v1/chat/completions` runs here, through the `ChatEngine`, as Messages, Responses and
Ollama's chats do: its messages under the same prompt rules, its tools rendered and its calls parsed
by the model's tool format, under a grammar for `tool_choice` `auto`, `required`, a named function
or `none`. The legacy `functions` and `function_call` offer tools too, and are answered as they
were: one `function_call`, finish reason `function_call`. A plain chat may hold its answer to a
`response_format` (JSON, to a schema or not: llama-cpp-python's `schema` or OpenAI's `json_schema`)
or to llama-cpp-python's `grammar`, one of them at a time.

Usage follows OpenAI's API: `prompt_tokens` counts the whole prompt, `prompt_tokens_details.cached_tokens`
the part restored. `seed`, the penalties, `min_p`, `typical_p`, `mirostat_*`, `logit_bias` (token ids,
or texts with `logit_bias_type` "tokens") and `min_tokens` sample as llama-cpp-python's server had
them; `n` above 1 and `logprobs` are 400s.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from snapcache.server.chat.chat_request import (
    ChatMessage,
    ChatRequest,
    NamedTool,
    Sampling,
    ToolChoice,
    normalized_messages,
)
from snapcache.server.chat.dialects.chat_completions.chat_completions_protocol import (
    ChatCompletionRequest,
    ContentPart,
    FunctionDefinition,
    Message,
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

__all__ = [
    "CompletionChunks",
    "chat_request",
    "completion_of",
    "error_event",
    "legacy_functions",
]

_log = logging.getLogger("snapcache")

_FINISH_REASONS = {"end": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


def error_event(failure: BadRequest) -> bytes:
    """An error that happened after the stream began, as its last event (the `openai` client raises
    it)."""
    return _sse(failure.document())


def chat_request(body: ChatCompletionRequest, scope: str) -> ChatRequest:
    """The chat request a Chat Completions request is; BadRequest for one the engine cannot serve."""
    _refuse_unserved(body)
    _refuse_two_grammars(body)
    places = ImagePlaces()
    messages = [_message_of(message, f"messages.{i}", places) for i, message in enumerate(body.messages)]
    tools, choice = _offered(body)
    stop = body.stop if isinstance(body.stop, list) else [body.stop] if body.stop else []
    limit = body.max_completion_tokens or body.max_tokens
    return ChatRequest(
        normalized_messages(messages),
        max_tokens=limit if limit is not None and limit > 0 else None,
        tools=tools,
        tool_choice=choice,
        # A legacy function call is one call: the answer has room for one.
        parallel_tool_calls=body.parallel_tool_calls is not False and not legacy_functions(body),
        sampling=Sampling.of(body),
        stop=tuple(stop),
        response_format=_response_format(body),
        grammar=body.grammar,
        min_tokens=body.min_tokens,
        stream=body.stream,
        scope=scope,
        **ChatRequest.images_of(places),
    )


def legacy_functions(body: ChatCompletionRequest) -> bool:
    """Whether the request offers its tools the legacy way (`functions`), to be answered so too."""
    return body.functions is not None


def _offered(body: ChatCompletionRequest) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
    """The tools a request offers and how it wants them chosen: `tools` and `tool_choice`, or the
    legacy `functions` and `function_call`, which win where both are given."""
    if body.functions is not None:
        tools = _specs(
            [(f"functions.{i}", function) for i, function in enumerate(body.functions)], "functions"
        )
        call = body.function_call
        choice: ToolChoice = (call or "auto") if isinstance(call, str | None) else NamedTool(call.name)
        where = "function_call"
    else:
        offered = []
        for i, tool in enumerate(body.tools or ()):
            if tool.type == "function" and tool.function is not None:
                offered.append((f"tools.{i}.function", tool.function))
            else:
                _log.info("/v1/chat/completions: a tool of type %r left out (functions only)", tool.type)
        tools = _specs(offered, "tools")
        given = body.tool_choice or "auto"
        choice = given if isinstance(given, str) else NamedTool(given.function.name)
        where = "tool_choice"
    if choice not in ("auto", "none") and not tools:
        named = choice.name if isinstance(choice, NamedTool) else choice
        raise BadRequest(f"{where}: {named!r} needs function tools", param=where)
    if isinstance(choice, NamedTool) and choice.name not in {tool.name for tool in tools}:
        raise BadRequest(f"{where}: no function named {choice.name!r} among the tools", param=where)
    return tools, choice


def _refuse_unserved(body: ChatCompletionRequest) -> None:
    if body.n is not None and body.n > 1:
        raise BadRequest("n: one choice per request (n = 1)", param="n")
    if body.logprobs:
        raise BadRequest(
            "logprobs is not supported: the server keeps no logits of earlier positions",
            param="logprobs",
            code="unsupported_parameter",
        )


def _response_format(body: ChatCompletionRequest) -> Mapping[str, Any] | None:
    """The request's response format as the engine takes it: None for text, else JSON, held to a
    schema where one is given (llama-cpp-python's `schema`, or OpenAI's `json_schema.schema`)."""
    given = body.response_format
    if given is None or given.type == "text":
        return None
    if given.type == "json_schema":
        where = "response_format.json_schema.schema"
        schema = given.json_schema.schema_ if given.json_schema is not None else None
        if schema is None:
            raise BadRequest(f"{where}: a json_schema response format needs its schema", param=where)
    else:
        where, schema = "response_format.schema", given.schema_
    if schema is None:
        return {"type": "json_object"}
    problem = schema_problem(schema)  # llama.cpp's grammar parser would crash on some
    if problem is not None:
        raise BadRequest(f"{where}: {problem}", param=where)
    return {"type": "json_object", "schema": schema}


def _refuse_two_grammars(body: ChatCompletionRequest) -> None:
    """BadRequest where two things would each hold the answer to a grammar (tools, of either kind
    and whatever the choice, count as one), or a minimum length would fight one."""
    held = [
        name
        for name, given in (
            ("tools", bool(body.tools) or bool(body.functions)),
            ("grammar", body.grammar is not None),
            ("response_format", body.response_format is not None and body.response_format.type != "text"),
        )
        if given
    ]
    if len(held) > 1:
        raise BadRequest(
            f"{held[1]}: the answer is held by {held[0]} already; give one of tools, grammar and "
            "response_format",
            param=held[1],
        )
    if held and body.min_tokens > 0:
        # llama-cpp-python holds the end of text back until min_tokens; where the grammar ends
        # before, no token is left that both allow and llama.cpp aborts the process.
        raise BadRequest(
            f"min_tokens cannot be combined with {held[0]}, whose grammar may end the answer sooner",
            param="min_tokens",
        )


def _message_of(message: Message, where: str, places: ImagePlaces) -> ChatMessage:
    text = _text(message.content, f"{where}.content", places if message.role == "user" else None)
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


def _text(content: str | list[ContentPart] | None, where: str, places: ImagePlaces | None) -> str:
    """The text of a message's content, its parts joined by newlines, an image's place its marker
    (`places`: None where the role sends no images)."""
    if content is None or isinstance(content, str):
        return content or ""
    pieces: list[str] = []
    for j, part in enumerate(content):
        if part.type == "image_url" and places is not None:
            pieces.append(places.place_data_url(part.image_url, f"{where}.{j}.image_url"))
            continue
        text = part.text if part.type == "text" else part.refusal if part.type == "refusal" else None
        if text is None:
            supported = "text or image_url" if places is not None else "text only"
            raise BadRequest(
                f"{where}.{j}: content of type {part.type!r} is not supported ({supported})", param=where
            )
        pieces.append(text)
    return "\n".join(pieces)


def _specs(functions: list[tuple[str, FunctionDefinition]], param: str) -> tuple[ToolSpec, ...]:
    """The tools of the functions offered (each with where it is in the body); BadRequest for two
    of one name or a schema llama.cpp cannot hold an answer to."""
    tools: list[ToolSpec] = []
    for where, function in functions:
        if any(known.name == function.name for known in tools):
            raise BadRequest(f"{param}: two functions are named {function.name!r}", param=param)
        parameters = function.parameters or {"type": "object"}
        problem = schema_problem(parameters)  # llama.cpp's grammar parser would crash on some
        if problem is not None:
            raise BadRequest(f"{where}.parameters: {problem}", param=f"{where}.parameters")
        tools.append(ToolSpec(function.name, function.description or "", parameters))
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
        self.legacy = legacy_functions(body)

    def add(self, event: ChatEvent) -> None:
        if isinstance(event, ToolCallCut):
            self.calls.append(event.call)  # as far as it went, as OpenAI leaves a call it cut
        elif isinstance(event, TextDelta | ToolCallDropped):
            self.text += event.text  # a dropped call's text in its place
        elif isinstance(event, ToolCalled):
            self.calls.append(event.call)
        elif isinstance(event, Finished):
            self.finished, self.usage = event, event.usage
        elif isinstance(event, Started):
            self.usage = event.usage

    @property
    def finish_reason(self) -> str:
        reason = _FINISH_REASONS[self.finished.reason] if self.finished is not None else "stop"
        return "function_call" if reason == "tool_calls" and self.legacy else reason

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
    if answer.calls and answer.legacy:
        message["function_call"] = _call(answer.calls[0])["function"]
    elif answer.calls:
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
        legacy = self._answer.legacy  # a `function_call` (one call), not `tool_calls`
        if index is None:
            index = self._indices[call_id] = len(self._indices)
            function = {"name": name, "arguments": ""}
            opened = {"index": index, "id": call_id, "type": "function", "function": function}
            chunks.append(self._chunk({"function_call": function} if legacy else {"tool_calls": [opened]}))
        if arguments:
            piece = {"arguments": arguments}
            delta = (
                {"function_call": piece} if legacy else {"tool_calls": [{"index": index, "function": piece}]}
            )
            chunks.append(self._chunk(delta))
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
