"""OpenAI's text completions and the model's vocabulary, answered by the model engine.

`/v1/completions` (and the Copilot path for it), `/v1/models`, `/v1/embeddings`, and the tokenizer
routes `/extras/tokenize`, `/extras/tokenize/count` and `/extras/detokenize`. They take
llama-cpp-python's request and response models, so clients and the schema see the routes that
server has, and call the `ModelEngine` with the request's record (see `request_record`). Their
bodies were checked by the middleware before they got here (see `checks`); it also adds what a
completion reused to its answer.

A streamed completion's first chunk is made before the answer starts, so that a completion that
cannot run (a prompt longer than the context) fails with a JSON error and a proper status rather
than a broken stream. Its chunks are made in worker threads; a client gone ends the stream there,
and the stream is closed before the request ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import llama_cpp
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from llama_cpp.llama_grammar import LlamaGrammar
from llama_cpp.server.types import (
    CreateCompletionRequest,
    CreateEmbeddingRequest,
    DetokenizeInputRequest,
    DetokenizeInputResponse,
    ModelList,
    TokenizeInputCountResponse,
    TokenizeInputRequest,
    TokenizeInputResponse,
)
from starlette.concurrency import run_in_threadpool

from snapcache.server.checks import DETOKENIZE_PATH, EMBEDDINGS_PATH
from snapcache.server.model_engine import ModelEngine
from snapcache.server.request_record import record_of

__all__ = ["completion_router"]

_OPENAI = "OpenAI V1"
_EXTRAS = "Extras"
_END = object()
# What `Llama.create_completion` does not take of the request (as llama-cpp-python's server leaves them).
_NOT_FOR_THE_MODEL = frozenset({"n", "best_of", "logit_bias_type", "user", "min_tokens", "model"})
_STREAM_EXAMPLE = "data: {... see CreateCompletionResponse ...} \\n\\n data: ... \\n\\n ... data: [DONE]"
_STREAMED = {
    "description": "Successful Response",
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [{"$ref": "#/components/schemas/CreateCompletionResponse"}],
                "title": "Completion response, when stream=False",
            }
        },
        "text/event-stream": {
            "schema": {
                "type": "string",
                "title": "Server Side Streaming response, when stream=True",
                "example": _STREAM_EXAMPLE,
            }
        },
    },
}


def completion_router(engine: ModelEngine, alias: str, authenticate: Callable[..., Any]) -> APIRouter:
    """The routes, for `engine`'s model served as `alias`, behind `authenticate`."""
    router = APIRouter(dependencies=[Depends(authenticate)])

    @router.post(
        "/v1/completions",
        summary="Completion",
        response_model=llama_cpp.CreateCompletionResponse | str,
        responses={"200": _STREAMED},
        tags=[_OPENAI],
    )
    @router.post("/v1/engines/copilot-codex/completions", include_in_schema=False, tags=[_OPENAI])
    async def create_completion(request: Request, body: CreateCompletionRequest) -> Any:
        prompt = body.prompt if isinstance(body.prompt, str) else (body.prompt[0] if body.prompt else "")
        kwargs = _model_arguments(engine, body)
        record = record_of(request)
        answer = await run_in_threadpool(lambda: engine.complete(prompt, record, **kwargs))
        if not body.stream:
            return JSONResponse(answer)
        chunks: Iterator[Any] = iter(answer)
        try:
            first = await run_in_threadpool(next, chunks, _END)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(_close, chunks)
            raise
        return StreamingResponse(_events(first, chunks), media_type="text/event-stream")

    @router.post(EMBEDDINGS_PATH, summary="Embedding", tags=[_OPENAI])
    async def create_embedding(body: CreateEmbeddingRequest) -> Any:
        # The middleware refuses this path where the model computes no embeddings.
        return await engine.in_turn(lambda: engine.llm.create_embedding(body.input))

    @router.get("/v1/models", summary="Models", tags=[_OPENAI])
    async def get_models() -> ModelList:
        return {
            "object": "list",
            "data": [{"id": alias, "object": "model", "owned_by": "me", "permissions": []}],
        }

    @router.post("/extras/tokenize", summary="Tokenize", tags=[_EXTRAS])
    async def tokenize(body: TokenizeInputRequest) -> TokenizeInputResponse:
        return TokenizeInputResponse(tokens=engine.tokenize(body.input))

    @router.post("/extras/tokenize/count", summary="Tokenize Count", tags=[_EXTRAS])
    async def count_query_tokens(body: TokenizeInputRequest) -> TokenizeInputCountResponse:
        return TokenizeInputCountResponse(count=len(engine.tokenize(body.input)))

    @router.post(DETOKENIZE_PATH, summary="Detokenize", tags=[_EXTRAS])
    async def detokenize(body: DetokenizeInputRequest) -> DetokenizeInputResponse:
        # Tokens that end inside a character (a byte token, a prefix of a stream) are not UTF-8 on
        # their own: their text holds U+FFFD there.
        return DetokenizeInputResponse(text=engine.detokenize(body.tokens))

    return router


def _model_arguments(engine: ModelEngine, body: CreateCompletionRequest) -> dict[str, Any]:
    """`Llama.create_completion`'s keyword arguments for `body`, as llama-cpp-python's server makes
    them: a logit bias by texts keyed by their tokens, the grammar compiled, and `min_tokens` as a
    logits processor."""
    kwargs = body.model_dump(exclude=set(_NOT_FOR_THE_MODEL) | {"prompt"})
    if body.logit_bias is not None:
        kwargs["logit_bias"] = (
            engine.bias_by_token(body.logit_bias) if body.logit_bias_type == "tokens" else body.logit_bias
        )
    if body.grammar is not None:
        kwargs["grammar"] = LlamaGrammar.from_string(body.grammar, verbose=False)
    if body.min_tokens > 0:
        kwargs["logits_processor"] = engine.min_tokens_processor(body.min_tokens)
    return kwargs


async def _events(first: Any, chunks: Iterator[Any]) -> AsyncIterator[bytes]:
    """The stream's server-sent events, one chunk each, then `[DONE]`; `chunks` closed at the end."""
    try:
        chunk = first
        while chunk is not _END:
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            chunk = await run_in_threadpool(next, chunks, _END)
        yield b"data: [DONE]\n\n"
    finally:
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(_close, chunks)


def _close(chunks: Iterator[Any]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()
