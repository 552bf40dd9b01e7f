"""OpenAI Responses' route: `/v1/responses`, over the chat engine."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from snapcache.server.chat.dialects.dialect import EVENT_STREAM, Dialect, openai_error_body
from snapcache.server.chat.dialects.responses import responses, responses_output
from snapcache.server.chat.dialects.responses.responses_protocol import ResponsesRequest
from snapcache.server.chat.dialects.serving import EVENTS_ANSWER, OPENAI_ERRORS, ChatRunner, serve

__all__ = ["RESPONSES", "RESPONSES_PATH", "responses_router"]

RESPONSES_PATH = "/v1/responses"

RESPONSES: Dialect[ResponsesRequest] = Dialect(
    "OpenAI Responses",
    EVENT_STREAM,
    responses.chat_request,
    lambda body, events: responses_output.ResponseEvents(body).events(events),
    lambda body, events: responses_output.response_of(events, body),
    openai_error_body,
    responses.error_event,
)


def responses_router(engine: ChatRunner) -> APIRouter:
    router = APIRouter(tags=["OpenAI Responses"])

    @router.post(RESPONSES_PATH, summary="OpenAI Responses", responses={200: EVENTS_ANSWER, **OPENAI_ERRORS})
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        return await serve(RESPONSES, body, request, engine)

    return router
