"""Ollama's routes: its chat and generate over the one chat engine (`OLLAMA_CHAT`, `OLLAMA_GENERATE`),
the model routes (`/api/tags`, `/api/show`, `/api/ps`, `/api/version`: see `ollama_models`), and
`GET /`, which Ollama's clients probe. A chat without messages, or a generate without a prompt,
asks only for the model to be loaded: it is, and the answer says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from snapcache.key import DEFAULT_SCOPE
from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.chat.dialects.dialect import Dialect
from snapcache.server.chat.dialects.ollama import ollama, ollama_models
from snapcache.server.chat.dialects.ollama.ollama_protocol import ChatBody, GenerateBody, ShowBody
from snapcache.server.chat.dialects.serving import ChatRunner, check_text, error_answers, failure, serve
from snapcache.server.chat.sent_images import without_projector
from snapcache.server.error_answers import BadRequest
from snapcache.server.served_model import ServedModel

__all__ = ["OLLAMA_CHAT", "OLLAMA_GENERATE", "OLLAMA_PATHS", "ollama_router"]

OLLAMA_CHAT_PATH = "/api/chat"
OLLAMA_GENERATE_PATH = "/api/generate"
OLLAMA_PATHS = frozenset(
    {OLLAMA_CHAT_PATH, OLLAMA_GENERATE_PATH, "/api/tags", "/api/show", "/api/ps", "/api/version"}
)
_ERRORS = error_answers(
    {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
)
_LINES = {"content": {ollama.NDJSON: {"schema": {"type": "string"}}}}
OllamaBody = TypeVar("OllamaBody", ChatBody, GenerateBody)


def _ollama(
    name: str, chat_request: Callable[[OllamaBody, str], ChatRequest], *, chat: bool
) -> Dialect[OllamaBody]:
    """Ollama's chat (`chat`) or generate: the same lines and errors around a message or a response."""
    return Dialect(
        name,
        ollama.NDJSON,
        chat_request,
        lambda body, events: ollama.Answer(body.model, chat=chat).lines(events),
        lambda body, events: ollama.Answer(body.model, chat=chat).of(events),
        ollama.error_body,
        ollama.error_line,
    )


OLLAMA_CHAT = _ollama("Ollama chat", ollama.chat_request, chat=True)
OLLAMA_GENERATE = _ollama("Ollama generate", ollama.generate_request, chat=False)


def ollama_router(engine: ChatRunner, model: ServedModel) -> APIRouter:
    """Ollama's routes over `engine`, describing `model`."""
    router = APIRouter(tags=["Ollama"])

    @router.post(OLLAMA_CHAT_PATH, summary="Ollama chat", responses={200: _LINES, **_ERRORS})
    async def chat(body: ChatBody, request: Request) -> Response:
        if not body.messages:
            return _loaded(OLLAMA_CHAT, body, model)
        return await serve(OLLAMA_CHAT, body, request, engine)

    @router.post(OLLAMA_GENERATE_PATH, summary="Ollama generate", responses={200: _LINES, **_ERRORS})
    async def generate(body: GenerateBody, request: Request) -> Response:
        if not body.prompt:
            return _loaded(OLLAMA_GENERATE, body, model)
        return await serve(OLLAMA_GENERATE, body, request, engine)

    @router.get("/api/tags", summary="Ollama: the models")
    async def tags() -> dict[str, Any]:
        return ollama_models.tags(model)

    @router.post("/api/show", summary="Ollama: a model's details", responses=_ERRORS)
    async def show(body: ShowBody) -> Response:
        try:
            check_text(body)
        except BadRequest as exc:
            return failure(OLLAMA_CHAT, exc)
        return JSONResponse(ollama_models.shown(model, body.model or body.name or ""))

    @router.get("/api/ps", summary="Ollama: the models loaded")
    async def running() -> dict[str, Any]:
        return ollama_models.running(model)

    @router.get("/api/version", summary="Ollama: the API version")
    async def version() -> dict[str, str]:
        return {"version": ollama_models.OLLAMA_API_VERSION}

    @router.api_route(
        "/", methods=["GET", "HEAD"], summary="Whether the server runs", response_class=PlainTextResponse
    )
    async def running_here() -> str:
        return "snapcache is running (Ollama's API is served at /api)"

    return router


def _loaded(dialect: Dialect[Any], body: ChatBody | GenerateBody, model: ServedModel) -> Response:
    """The answer to a request that only loads the model, once its body is checked (its images
    too, which a model served without its projector refuses)."""
    try:
        check_text(body)
        if isinstance(body, GenerateBody):
            images = ollama.generate_request(body, DEFAULT_SCOPE).images  # the body checked, images too
            if images and not model.reads_images:
                raise without_projector(images[0])
    except BadRequest as exc:
        return failure(dialect, exc)
    document = ollama.loaded(body)
    if not body.stream:
        return JSONResponse(document)
    return Response(json.dumps(document) + "\n", media_type=ollama.NDJSON)
