"""OpenAI Chat Completions' route: `/v1/chat/completions`, over the chat engine.

It takes its body as bytes and checks it itself, so that its errors are OpenAI's 400s (the schema
documents the body: see `snapcache.server.openapi`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from snapcache.server.chat.dialects.chat_completions import chat_completions
from snapcache.server.chat.dialects.chat_completions.chat_completions_protocol import (
    ChatCompletionRequest,
    parsed,
)
from snapcache.server.chat.dialects.dialect import EVENT_STREAM, Dialect, openai_error_body
from snapcache.server.chat.dialects.serving import EVENTS_ANSWER, OPENAI_ERRORS, ChatRunner, failure, serve
from snapcache.server.checks import CHAT_PATH, parse_body
from snapcache.server.error_answers import BadRequest

__all__ = ["CHAT_COMPLETIONS", "chat_completions_router"]

CHAT_COMPLETIONS: Dialect[ChatCompletionRequest] = Dialect(
    "OpenAI Chat Completions",
    EVENT_STREAM,
    chat_completions.chat_request,
    lambda body, events: chat_completions.CompletionChunks(body).events(events),
    lambda body, events: chat_completions.completion_of(events, body),
    openai_error_body,
    chat_completions.error_event,
)


def chat_completions_router(engine: ChatRunner) -> APIRouter:
    router = APIRouter(tags=["OpenAI V1"])
    answers = {200: {"content": {"application/json": {}, **EVENTS_ANSWER["content"]}}, **OPENAI_ERRORS}

    @router.post(CHAT_PATH, summary="Chat", responses=answers)
    async def create_chat_completion(request: Request) -> Response:
        try:
            body = parsed(parse_body(await request.body()))
        except BadRequest as exc:
            return failure(CHAT_COMPLETIONS, exc)
        return await serve(CHAT_COMPLETIONS, body, request, engine)

    return router
