"""The dialect routes, installed together over one chat engine: Anthropic Messages (`/v1/messages`,
`/v1/messages/count_tokens`), OpenAI Responses (`/v1/responses`), OpenAI Chat Completions
(`/v1/chat/completions`) and Ollama's, each a folder of `dialects` with its own `Dialect` and routes,
served by one skeleton (`dialects.serving`). Adding a dialect is a line here.
Bad bodies get a 400 in the route's own error shape (FastAPI's validation errors included); with an
API key set, clients send it as `x-api-key` (Anthropic's clients) or as a bearer token.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request, Security
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from snapcache.server.chat.dialects.anthropic.anthropic_routes import (
    MESSAGES,
    MESSAGES_PATHS,
    messages_router,
)
from snapcache.server.chat.dialects.chat_completions.chat_completions_routes import (
    CHAT_COMPLETIONS,
    chat_completions_router,
)
from snapcache.server.chat.dialects.dialect import Dialect
from snapcache.server.chat.dialects.ollama.ollama_routes import OLLAMA_CHAT, OLLAMA_PATHS, ollama_router
from snapcache.server.chat.dialects.responses.responses_routes import (
    RESPONSES,
    RESPONSES_PATH,
    responses_router,
)
from snapcache.server.chat.dialects.serving import failure
from snapcache.server.chat.engine.chat_engine import ChatEngine
from snapcache.server.error_answers import BadRequest
from snapcache.server.served_model import ServedModel

__all__ = ["MESSAGES_PATHS", "RESPONSES_PATH", "install_dialects"]

_API_KEY = Security(APIKeyHeader(name="x-api-key", auto_error=False, description="Anthropic clients' key"))
_BEARER = Security(HTTPBearer(auto_error=False))


class Unauthorized(Exception):
    """A request without the server's API key."""


def _error(dialect: Dialect[Any], status: int, message: str) -> JSONResponse:
    return failure(dialect, BadRequest(message, status=status))


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
    app.include_router(messages_router(engine), dependencies=guard)
    app.include_router(responses_router(engine), dependencies=guard)
    app.include_router(ollama_router(engine, model), dependencies=guard)
    app.include_router(chat_completions_router(engine), dependencies=guard)
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


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "the request body is not valid"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid value')}{more}"
