"""snapcache's own routes: warm a prompt in the running server, explain a miss, its statistics and
Prometheus metrics.

They sit beside the OpenAI routes and take the same API key. Warming and explaining run on the
Llama's own context in its turn (`ModelEngine.in_turn`), so they wait instead of racing a completion
there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, MAX_PRIORITY
from snapcache.llama.hook.cache_hook import CacheHook
from snapcache.llama.stored.reports import WarmResult
from snapcache.server.chat.engine.prompt_rules import PromptRules
from snapcache.server.checks import AS_JSON_INTEGER
from snapcache.server.error_answers import error_document
from snapcache.server.model_engine import ModelEngine
from snapcache.server.monitor import ServeMonitor

__all__ = ["WarmRequest", "snapcache_router"]


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
    engine: ModelEngine, monitor: ServeMonitor, rules: PromptRules, authenticate: Callable[..., Any]
) -> APIRouter:
    """The routes of `engine`'s cache; `rules`: the prompt rules, whose effect on the scope's latest
    request `/snapcache/why` reports."""
    router = APIRouter(tags=["snapcache"], dependencies=[Depends(authenticate)])

    @router.post("/snapcache/warm")
    async def warm(body: WarmRequest) -> Response:
        given = [name for name in ("system", "messages", "prompt") if getattr(body, name) is not None]
        if len(given) != 1:
            message = "give exactly one of system, messages or prompt"
            return JSONResponse(error_document(message), status_code=400)
        try:
            result = await engine.in_turn(lambda: _warm(engine.hook, body))
        except InvalidArgument as exc:
            return JSONResponse(error_document(str(exc)), status_code=400)
        return JSONResponse(_warm_report(result, body))

    @router.get("/snapcache/why")
    async def why(scope: str = DEFAULT_SCOPE) -> Response:
        """Why the last completion in `scope` restored what it did."""
        try:
            explanation = await run_in_threadpool(engine.explain, scope)
        except InvalidArgument as exc:
            return JSONResponse(error_document(str(exc), param="scope"), status_code=400)
        if explanation is None:
            message = f"no completion has run in scope {scope!r} since the server started"
            return JSONResponse(error_document(message, param="scope"), status_code=404)
        report = explanation.as_json()
        report["exactness"] = engine.exactness.as_dict()
        report["prompt_rules"] = rules.report(scope)
        return JSONResponse(report)

    @router.get("/snapcache/stats")
    async def stats() -> dict[str, Any]:
        result = await run_in_threadpool(monitor.stats)
        load = engine.load()
        if load is not None:
            result["parallel"] = load
        return result

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        text = await run_in_threadpool(generate_latest, monitor.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

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
