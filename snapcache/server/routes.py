"""snapcache's own routes: warm a prompt in the running server, its statistics, Prometheus metrics;
and llama-cpp-python's detokenize, answered without failing on a character cut between tokens.

They sit beside llama-cpp-python's OpenAI routes and use the same API-key check. Warming runs on
the Llama's own context in its turn (`ModelTurns`), so it waits instead of racing a completion there.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from llama_cpp.server import app as llama_server
from llama_cpp.server.app import authenticate, get_llama_proxy
from llama_cpp.server.types import DetokenizeInputRequest, DetokenizeInputResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, MAX_PRIORITY
from snapcache.llama.hook.cache_hook import CacheHook
from snapcache.llama.stored.reports import WarmResult
from snapcache.server.chat.rules import PromptRules
from snapcache.server.checks import AS_JSON_INTEGER, DETOKENIZE_PATH
from snapcache.server.error_answers import error_document
from snapcache.server.monitor import ServeMonitor
from snapcache.server.parallel import ModelTurns, ParallelModel

__all__ = ["WarmRequest", "extras_router", "llama_cpp_router", "snapcache_router"]


class WarmRequest(BaseModel):
    """`POST /snapcache/warm`: exactly one of `system`, `messages` (their leading system messages) or
    `prompt` (raw text, as a completion prompt starts)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    system: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    scope: str = Field(default=DEFAULT_SCOPE, min_length=1, max_length=256)
    priority: Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY), AS_JSON_INTEGER] = 0


def snapcache_router(
    hook: CacheHook,
    monitor: ServeMonitor,
    turns: ModelTurns,
    parallel: ParallelModel | None = None,
    rules: PromptRules | None = None,
) -> APIRouter:
    """`parallel`: the model running completions several at once (its load goes into the stats, its
    completions are explained before those of the Llama's own context); `rules`: the prompt rules,
    whose effect on the scope's latest request `/snapcache/why` reports."""
    router = APIRouter(tags=["snapcache"], dependencies=[Depends(authenticate)])

    @router.post("/snapcache/warm")
    async def warm(body: WarmRequest) -> Response:
        given = [name for name in ("system", "messages", "prompt") if getattr(body, name) is not None]
        if len(given) != 1:
            message = "give exactly one of system, messages or prompt"
            return JSONResponse(error_document(message), status_code=400)
        try:
            result = await turns.run(lambda: _warm(hook, body))
        except InvalidArgument as exc:
            return JSONResponse(error_document(str(exc)), status_code=400)
        return JSONResponse(_warm_report(result, body))

    @router.get("/snapcache/why")
    async def why(scope: str = DEFAULT_SCOPE) -> Response:
        """Why the last completion in `scope` restored what it did."""
        try:
            explanation = None if parallel is None else await run_in_threadpool(parallel.explain, scope)
            if explanation is None:
                explanation = await turns.run(lambda: hook.explain(scope))
        except InvalidArgument as exc:
            return JSONResponse(error_document(str(exc), param="scope"), status_code=400)
        if explanation is None:
            message = f"no completion has run in scope {scope!r} since the server started"
            return JSONResponse(error_document(message, param="scope"), status_code=404)
        report = explanation.as_json()
        report["exactness"] = hook.exactness.as_dict()
        if rules is not None:
            report["prompt_rules"] = rules.report(scope)
        return JSONResponse(report)

    @router.get("/snapcache/stats")
    async def stats() -> dict[str, Any]:
        result = await run_in_threadpool(monitor.stats)
        if parallel is not None:
            scheduler = parallel.scheduler
            running, waiting = scheduler.pending()
            result["parallel"] = {
                "sequences": scheduler.n_seq,
                "mode": scheduler.mode,
                "running": running,
                "waiting": waiting,
            }
        return result

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        text = await run_in_threadpool(generate_latest, monitor.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return router


def llama_cpp_router(taken_over: Collection[str]) -> APIRouter:
    """llama-cpp-python's routes but those of the paths in `taken_over` (which snapcache answers)."""
    router = APIRouter()
    router.routes.extend(
        route for route in llama_server.router.routes if getattr(route, "path", None) not in taken_over
    )
    return router


def extras_router() -> APIRouter:
    """Routes that take the place of llama-cpp-python's of the same path (included before them)."""
    router = APIRouter(dependencies=[Depends(authenticate)])

    @router.post(DETOKENIZE_PATH, include_in_schema=False)
    async def detokenize(body: DetokenizeInputRequest) -> DetokenizeInputResponse:
        # Tokens that end inside a character (a byte token, a prefix of a stream) are not UTF-8 on
        # their own: llama-cpp-python's route fails on them with a 500.
        async with contextlib.asynccontextmanager(get_llama_proxy)() as llama_proxy:
            data = llama_proxy(body.model).detokenize(body.tokens)
        return DetokenizeInputResponse(text=data.decode("utf-8", errors="replace"))

    return router


def _warm(hook: CacheHook, body: WarmRequest) -> WarmResult:
    if body.system is not None:
        return hook.warm(body.system, body.priority, scope=body.scope)
    if body.messages is not None:
        return hook.warm_chat(body.messages, body.priority, scope=body.scope)
    assert body.prompt is not None
    return hook.warm(body.prompt, body.priority, raw=True, scope=body.scope)


def _warm_report(result: WarmResult, body: WarmRequest) -> dict[str, Any]:
    report = dataclasses.asdict(result)
    key = report.pop("key")
    return {"key": result.key.id, "scope": key["scope"], "priority": body.priority, **report}
