"""The dialect routes, installed together: Anthropic Messages (`/v1/messages`,
`/v1/messages/count_tokens`), OpenAI Responses (`/v1/responses`), OpenAI Chat Completions
(`/v1/chat/completions`, in place of llama-cpp-python's route) and Ollama's (`ollama_routes`), each
a `Dialect` over `ChatEngine` served by one skeleton (`serving.serve`).
Bad bodies get a 400 in the route's own error shape (FastAPI's validation errors included); with an
API key set, clients send it as `x-api-key` (Anthropic's clients) or as a bearer token.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from snapcache.server.chat import anthropic
from snapcache.server.chat.anthropic_protocol import CountTokensRequest, MessagesRequest
from snapcache.server.chat.chat_completions_protocol import parsed
from snapcache.server.chat.dialect import (
    CHAT_COMPLETIONS,
    MESSAGES,
    OLLAMA_CHAT,
    RESPONSES,
    Dialect,
)
from snapcache.server.chat.engine import ChatEngine
from snapcache.server.chat.ollama_routes import OLLAMA_PATHS, ollama_router
from snapcache.server.chat.prompt_size import PromptCounter
from snapcache.server.chat.responses_protocol import ResponsesRequest
from snapcache.server.chat.serving import check_text, error_answers, failure, request_scope, serve
from snapcache.server.checks import CHAT_PATH, parse_body
from snapcache.server.error_answers import BadRequest
from snapcache.server.served_model import ServedModel

__all__ = ["MESSAGES_PATHS", "RESPONSES_PATH", "install_dialects"]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
MESSAGES_PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH})
RESPONSES_PATH = "/v1/responses"

_API_KEY = Security(APIKeyHeader(name="x-api-key", auto_error=False, description="Anthropic clients' key"))
_BEARER = Security(HTTPBearer(auto_error=False))


class Unauthorized(Exception):
    """A request without the server's API key."""


def _error(dialect: Dialect[Any], status: int, message: str) -> JSONResponse:
    return failure(dialect, BadRequest(message, status=status))


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
_ANTHROPIC_ERRORS = error_answers(_ANTHROPIC_ERROR_SCHEMA)
_OPENAI_ERRORS = error_answers({"$ref": "#/components/schemas/ErrorDocument"})
_EVENTS = {"content": {"text/event-stream": {"schema": {"type": "string"}}}}


def install_dialects(app: FastAPI, engine: ChatEngine, model: ServedModel, api_key: str | None) -> None:
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
    app.include_router(ollama_router(engine, model), dependencies=guard)
    app.include_router(_chat_completions_router(engine), dependencies=guard)
    # The paths whose errors FastAPI raises before a route runs (a body it cannot parse or
    # validate) get their dialect's shape; the engine's Chat Completions path answers its own.
    dialects: dict[frozenset[str], Dialect[Any]] = {
        MESSAGES_PATHS: MESSAGES,
        frozenset({RESPONSES_PATH}): RESPONSES,
        OLLAMA_PATHS: OLLAMA_CHAT,  # one error shape for all of Ollama's routes
    }

    def dialect_of(request: Request) -> Dialect[Any] | None:
        for paths, dialect in dialects.items():
            if request.url.path in paths:
                return dialect
        return None

    async def on_invalid(request: Request, exc: Exception) -> Response:
        dialect = dialect_of(request)
        if dialect is None or not isinstance(exc, RequestValidationError):
            return await request_validation_exception_handler(request, exc)  # type: ignore[arg-type]
        return _error(dialect, 400, _validation_message(exc))

    async def on_unauthorized(request: Request, exc: Exception) -> Response:
        return _error(dialect_of(request) or CHAT_COMPLETIONS, 401, str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's own, such as a body it cannot parse.
        dialect = dialect_of(request)
        if dialect is None or not isinstance(exc, HTTPException):
            return await http_exception_handler(request, exc)  # type: ignore[arg-type]
        answered = _error(dialect, exc.status_code, str(exc.detail))
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
        return await serve(MESSAGES, body, request, engine)

    @router.post(COUNT_TOKENS_PATH, summary="Anthropic Messages: count tokens", responses=_ANTHROPIC_ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
        try:
            chat = anthropic.chat_request(body, request_scope(request))
            check_text(body)
            count = await run_in_threadpool(counter.count, chat)
        except Exception as exc:
            return failure(MESSAGES, exc)
        return JSONResponse({"input_tokens": count})

    return router


def _responses_router(engine: ChatEngine) -> APIRouter:
    router = APIRouter(tags=["OpenAI Responses"])

    @router.post(RESPONSES_PATH, summary="OpenAI Responses", responses={200: _EVENTS, **_OPENAI_ERRORS})
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        return await serve(RESPONSES, body, request, engine)

    return router


def _chat_completions_router(engine: ChatEngine) -> APIRouter:
    """`/v1/chat/completions`. It takes its body as bytes and checks it itself, so that its errors
    are OpenAI's 400s (the schema documents the body: see `snapcache.server.openapi`)."""
    router = APIRouter(tags=["OpenAI V1"])
    answers = {200: {"content": {"application/json": {}, **_EVENTS["content"]}}, **_OPENAI_ERRORS}

    @router.post(CHAT_PATH, summary="Chat", responses=answers)
    async def create_chat_completion(request: Request) -> Response:
        try:
            body = parsed(parse_body(await request.body()))
        except BadRequest as exc:
            return failure(CHAT_COMPLETIONS, exc)
        return await serve(CHAT_COMPLETIONS, body, request, engine)

    return router


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "the request body is not valid"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid value')}{more}"
