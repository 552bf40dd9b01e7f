"""Anthropic Messages' routes: `/v1/messages` and `/v1/messages/count_tokens`, over the chat engine."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from snapcache.server.chat.dialects.anthropic import anthropic_messages as anthropic
from snapcache.server.chat.dialects.anthropic.anthropic_protocol import CountTokensRequest, MessagesRequest
from snapcache.server.chat.dialects.dialect import EVENT_STREAM, Dialect
from snapcache.server.chat.dialects.serving import (
    EVENTS_ANSWER,
    ChatRunner,
    check_text,
    error_answers,
    failure,
    request_scope,
    serve,
)

__all__ = ["MESSAGES", "MESSAGES_PATHS", "messages_router"]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
MESSAGES_PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH})

MESSAGES: Dialect[MessagesRequest] = Dialect(
    "Anthropic Messages",
    EVENT_STREAM,
    anthropic.chat_request,
    lambda body, events: anthropic.message_events(events, body.model),
    lambda body, events: anthropic.message_of(events, body.model),
    anthropic.error_body,
    anthropic.error_event,
)

_ERROR_SCHEMA: dict[str, Any] = {
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
_ERRORS = error_answers(_ERROR_SCHEMA)


def messages_router(engine: ChatRunner) -> APIRouter:
    router = APIRouter(tags=["Anthropic Messages"])

    @router.post(MESSAGES_PATH, summary="Anthropic Messages", responses={200: EVENTS_ANSWER, **_ERRORS})
    async def messages(body: MessagesRequest, request: Request) -> Response:
        return await serve(MESSAGES, body, request, engine)

    @router.post(COUNT_TOKENS_PATH, summary="Anthropic Messages: count tokens", responses=_ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
        try:
            chat = anthropic.chat_request(body, request_scope(request))
            check_text(body)
            count = await run_in_threadpool(engine.count_prompt_tokens, chat)
        except Exception as exc:
            return failure(MESSAGES, exc)
        return JSONResponse({"input_tokens": count})

    return router
