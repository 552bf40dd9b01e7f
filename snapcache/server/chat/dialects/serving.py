"""The skeleton every dialect route shares: a body in, the engine's events out in the dialect's shape.

`serve` turns a body into the engine's request (in the scope its `X-Snapcache-Scope` header names),
runs it, and answers as the dialect streams or as its whole answer, with the headers that say what
it reused (`X-Snapcache-Restored-Tokens`, `X-Snapcache-Source`); a request that cannot be served
gets the dialect's error shape (`failure`), before or after the stream began. `error_answers` is the
OpenAPI description of a dialect's 400, 401 and 500 in its error shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, validate_scope
from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.chat.dialects.dialect import Body, Dialect
from snapcache.server.chat.dialects.streaming import EventStream, as_failure, until_disconnect
from snapcache.server.chat.events import ChatEvent
from snapcache.server.error_answers import BadRequest
from snapcache.server.request_record import RequestRecord

__all__ = [
    "EVENTS_ANSWER",
    "OPENAI_ERRORS",
    "ChatRunner",
    "check_text",
    "error_answers",
    "failure",
    "request_scope",
    "serve",
]

_SCOPE_HEADER = "x-snapcache-scope"
# The OpenAPI description of a streamed answer.
EVENTS_ANSWER: dict[str, Any] = {"content": {"text/event-stream": {"schema": {"type": "string"}}}}


class ChatRunner(Protocol):
    """What the dialects ask of the chat engine (`snapcache.server.chat.engine`), which they do not
    import: the events of a request, its reuse written into `record`; and a request's prompt size."""

    def events(
        self, request: ChatRequest, record: RequestRecord | None = None
    ) -> AsyncIterator[ChatEvent]: ...

    def count_prompt_tokens(self, request: ChatRequest) -> int: ...


def failure(dialect: Dialect[Any], exc: BaseException) -> JSONResponse:
    """What went wrong, in `dialect`'s error shape."""
    failed = as_failure(exc)
    return JSONResponse(dialect.error_body(failed), status_code=failed.status)


async def serve(dialect: Dialect[Body], body: Body, request: Request, engine: ChatRunner) -> Response:
    """Every dialect route: `body` becomes the engine's request, which runs; its events become the
    dialect's answer, streamed or whole, or its error when it cannot be served."""
    try:
        chat = dialect.chat_request(body, request_scope(request))
        check_text(body)
    except BadRequest as exc:
        return failure(dialect, exc)
    record = RequestRecord(scope=chat.scope)
    if chat.stream:
        events = dialect.stream(body, engine.events(chat, record))
        return EventStream(
            events, dialect.error_body, dialect.error_event, dialect.stream_type, record.reuse_headers
        )
    answered = await _whole(
        request,
        engine.events(chat, record),
        lambda events: dialect.whole(body, events),
        lambda exc: failure(dialect, exc),
    )
    answered.headers.update({name.decode(): value.decode() for name, value in record.reuse_headers()})
    return answered


async def _whole(
    request: Request,
    events: AsyncIterator[ChatEvent],
    answer: Callable[[list[ChatEvent]], dict[str, Any]],
    failed: Callable[[BaseException], JSONResponse],
) -> Response:
    """A whole (not streamed) answer: `answer` of the events, or `failed` of what went wrong; the
    model's work stops if the client goes first (nobody reads what would be answered then)."""
    collected: list[ChatEvent] = []
    problem: Exception | None = None
    async with until_disconnect(request.receive, events) as watch:
        try:
            collected = [event async for event in events]
        except Exception as exc:  # caught here: out of the watch it would come as an ExceptionGroup
            problem = exc
    if watch.gone:
        return Response(status_code=499)  # nobody reads it
    return failed(problem) if problem is not None else JSONResponse(answer(collected))


def request_scope(request: Request) -> str:
    """The scope the request's `X-Snapcache-Scope` header names (the default without one)."""
    value = request.headers.get(_SCOPE_HEADER)
    if value is None:
        return DEFAULT_SCOPE
    try:
        return validate_scope(value.strip())
    except InvalidArgument as exc:
        raise BadRequest(f"invalid {_SCOPE_HEADER} header: {exc}") from None


def check_text(body: Any) -> None:
    """BadRequest for text that is not text: a lone UTF-16 surrogate, which no tokenizer takes."""
    try:
        json.dumps(body.model_dump(), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            "the request holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
        ) from None


def error_answers(schema: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answers of a dialect's errors, each a JSON document of `schema`."""
    return {
        status: {"description": text, "content": {"application/json": {"schema": schema}}}
        for status, text in (
            (400, "The request cannot be served; the message says why"),
            (401, "The API key is missing or wrong"),
            (500, "The request failed"),
        )
    }


OPENAI_ERRORS = error_answers({"$ref": "#/components/schemas/ErrorDocument"})
