"""The dialect routes: Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`), OpenAI
Responses (`/v1/responses`) and OpenAI Chat Completions with tools (`/v1/chat/completions`), each a
translation over `ChatEngine`.

The Chat Completions route shares its path with llama-cpp-python's, which keeps plain chats: it sits
before that route and matches only the requests the middleware marked as the engine's (see
`chat_completions`). Bad bodies get a 400 in the route's own error shape (FastAPI's validation
errors included); with an API key set, clients send it as `x-api-key` (Anthropic's clients) or as a
bearer token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.params import Depends as Dependency
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Scope

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, validate_scope
from snapcache.server.chat import anthropic, chat_completions, responses, responses_output
from snapcache.server.chat.anthropic_protocol import CountTokensRequest, MessagesRequest
from snapcache.server.chat.chat_completions_protocol import parsed
from snapcache.server.chat.engine import ChatEngine, ChatEvent
from snapcache.server.chat.prompt_size import PromptCounter
from snapcache.server.chat.responses_protocol import ResponsesRequest
from snapcache.server.chat.streaming import EventStream, as_failure, until_disconnect
from snapcache.server.checks import CHAT_PATH, parse_body
from snapcache.server.errors import BadRequest

__all__ = ["MESSAGES_PATHS", "RESPONSES_PATH", "install_dialects"]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
MESSAGES_PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH})
RESPONSES_PATH = "/v1/responses"
_SCOPE_HEADER = "x-snapcache-scope"

_API_KEY = Security(APIKeyHeader(name="x-api-key", auto_error=False, description="Anthropic clients' key"))
_BEARER = Security(HTTPBearer(auto_error=False))


class Unauthorized(Exception):
    """A request without the server's API key."""


def _anthropic_failure(exc: BaseException) -> JSONResponse:
    failure = as_failure(exc)
    return JSONResponse(anthropic.error_body(failure), status_code=failure.status)


def _openai_failure(exc: BaseException) -> JSONResponse:
    failure = as_failure(exc)
    return JSONResponse(failure.document(), status_code=failure.status)


def _anthropic_error(status: int, message: str) -> JSONResponse:
    return _anthropic_failure(BadRequest(message, status=status))


def _openai_error(status: int, message: str) -> JSONResponse:
    return _openai_failure(BadRequest(message, status=status))


async def _answered(
    request: Request,
    events: AsyncIterator[ChatEvent],
    answer: Callable[[list[ChatEvent]], dict[str, Any]],
    failed: Callable[[BaseException], JSONResponse],
) -> Response:
    """A whole (not streamed) answer: `answer` of the events, or `failed` of what went wrong; the
    model's work stops if the client goes first (nobody reads what would be answered then)."""
    collected: list[ChatEvent] = []
    failure: Exception | None = None
    async with until_disconnect(request.receive, events) as watch:
        try:
            collected = [event async for event in events]
        except Exception as exc:  # caught here: out of the watch it would come as an ExceptionGroup
            failure = exc
    if watch.gone:
        return Response(status_code=499)  # nobody reads it
    return failed(failure) if failure is not None else JSONResponse(answer(collected))


_ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ANTHROPIC_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": _ANTHROPIC_ERROR_SCHEMA}}}
    for status, text in (
        (400, "The request cannot be served; the message says why"),
        (401, "The API key is missing or wrong"),
        (500, "The request failed"),
    )
}
_OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDocument"}}},
    }
    for status, text in (
        (400, "The request cannot be served; the message says why"),
        (401, "The API key is missing or wrong"),
        (500, "The request failed"),
    )
}
_EVENTS = {"content": {"text/event-stream": {"schema": {"type": "string"}}}}


def install_dialects(app: FastAPI, engine: ChatEngine, api_key: str | None) -> None:
    """Add the dialect routes to `app`, and the handlers that answer their errors in their shapes."""

    async def authenticate(
        key: str | None = _API_KEY,
        bearer: HTTPAuthorizationCredentials | None = _BEARER,
    ) -> None:
        if api_key is None or key == api_key or (bearer is not None and bearer.credentials == api_key):
            return
        raise Unauthorized("invalid API key: send it as the x-api-key header or as a bearer token")

    # Without a key the routes take no credentials, and their schema says so.
    guard = [Depends(authenticate)] if api_key is not None else []
    app.include_router(_messages_router(engine, PromptCounter(engine)), dependencies=guard)
    app.include_router(_responses_router(engine), dependencies=guard)
    _install_chat_completions(app, engine, guard)
    error_bodies: dict[frozenset[str], Callable[[int, str], JSONResponse]] = {
        MESSAGES_PATHS: _anthropic_error,
        frozenset({RESPONSES_PATH}): _openai_error,
    }

    def dialect_error(request: Request) -> Callable[[int, str], JSONResponse] | None:
        for paths, answer in error_bodies.items():
            if request.url.path in paths:
                return answer
        return None

    async def on_invalid(request: Request, exc: Exception) -> Response:
        answer = dialect_error(request)
        if answer is None or not isinstance(exc, RequestValidationError):
            return await request_validation_exception_handler(request, exc)  # type: ignore[arg-type]
        return answer(400, _validation_message(exc))

    async def on_unauthorized(request: Request, exc: Exception) -> Response:
        answer = dialect_error(request) or _openai_error  # Chat Completions with tools
        return answer(401, str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's own, such as a body it cannot parse.
        answer = dialect_error(request)
        if answer is None or not isinstance(exc, HTTPException):
            return await http_exception_handler(request, exc)  # type: ignore[arg-type]
        answered = answer(exc.status_code, str(exc.detail))
        answered.headers.update(exc.headers or {})  # a 405's Allow
        return answered

    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Unauthorized, on_unauthorized)


def _messages_router(engine: ChatEngine, counter: PromptCounter) -> APIRouter:
    router = APIRouter(tags=["Anthropic Messages"])

    @router.post(
        MESSAGES_PATH,
        summary="Anthropic Messages",
        responses={200: _EVENTS, **_ANTHROPIC_ERRORS},
    )
    async def messages(body: MessagesRequest, request: Request) -> Response:
        try:
            chat = anthropic.chat_request(body, _scope(request))
            _check_text(body)
        except BadRequest as exc:
            return _anthropic_failure(exc)
        if chat.stream:
            events = anthropic.message_events(engine.events(chat), body.model)
            return EventStream(events, anthropic.error_body, anthropic.error_event)
        return await _answered(
            request,
            engine.events(chat),
            lambda events: anthropic.message_of(events, body.model),
            _anthropic_failure,
        )

    @router.post(COUNT_TOKENS_PATH, summary="Anthropic Messages: count tokens", responses=_ANTHROPIC_ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
        try:
            chat = anthropic.chat_request(body, _scope(request))
            _check_text(body)
            count = await run_in_threadpool(counter.count, chat)
        except Exception as exc:
            return _anthropic_failure(exc)
        return JSONResponse({"input_tokens": count})

    return router


def _responses_router(engine: ChatEngine) -> APIRouter:
    router = APIRouter(tags=["OpenAI Responses"])

    @router.post(RESPONSES_PATH, summary="OpenAI Responses", responses={200: _EVENTS, **_OPENAI_ERRORS})
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        try:
            chat = responses.chat_request(body, _scope(request))
            _check_text(body)
        except BadRequest as exc:
            return _openai_failure(exc)
        if chat.stream:
            events = responses_output.ResponseEvents(body).events(engine.events(chat))
            return EventStream(events, BadRequest.document, responses.error_event)
        return await _answered(
            request,
            engine.events(chat),
            lambda events: responses_output.response_of(events, body),
            _openai_failure,
        )

    return router


class _EngineChatCompletions(APIRoute):
    """A route that matches only the requests the middleware marked as the engine's."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if not scope.get(chat_completions.ON_ENGINE):
            return Match.NONE, {}
        return super().matches(scope)


def _install_chat_completions(app: FastAPI, engine: ChatEngine, guard: list[Dependency]) -> None:
    """Add the engine's `/v1/chat/completions` before llama-cpp-python's route of that path.

    It takes its body as bytes and checks it itself, so that its errors are OpenAI's 400s; it is
    left out of the schema, which documents the path by llama-cpp-python's request model.
    """

    async def create_chat_completion(request: Request) -> Response:
        try:
            body = parsed(parse_body(await request.body()))
            chat = chat_completions.chat_request(body, _scope(request))
        except BadRequest as exc:
            return _openai_failure(exc)
        if chat.stream:
            events = chat_completions.CompletionChunks(body).events(engine.events(chat))
            return EventStream(events, BadRequest.document, chat_completions.error_event)
        return await _answered(
            request,
            engine.events(chat),
            lambda events: chat_completions.completion_of(events, body),
            _openai_failure,
        )

    app.router.add_api_route(
        CHAT_PATH,
        create_chat_completion,
        methods=["POST"],
        dependencies=guard,
        include_in_schema=False,
        route_class_override=_EngineChatCompletions,
    )
    routes = app.router.routes
    routes.insert(0, routes.pop())  # routes match in order: first, or llama-cpp-python's takes it


def _scope(request: Request) -> str:
    value = request.headers.get(_SCOPE_HEADER)
    if value is None:
        return DEFAULT_SCOPE
    try:
        return validate_scope(value.strip())
    except InvalidArgument as exc:
        raise BadRequest(f"invalid {_SCOPE_HEADER} header: {exc}") from None


def _check_text(body: Any) -> None:
    """BadRequest for text that is not text: a lone UTF-16 surrogate, which no tokenizer takes."""
    try:
        json.dumps(body.model_dump(), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            "the request holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
        ) from None


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "the request body is not valid"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid value')}{more}"
