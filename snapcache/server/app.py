"""`snapcache serve`: llama-cpp-python's OpenAI-compatible server with the cache hook attached.

The OpenAI routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, ...), their request
models, error handling, streaming and API-key check are llama-cpp-python's own (`llama_cpp.server`);
snapcache adds the hook on the model, a middleware for scopes and reuse (see `middleware`) that
checks every JSON body before it reaches the model (see `checks`), and its routes (see `routes`).
With `parallel` above 1, up to that many completions run at once on the one model, batched by a
scheduler (see `parallel`); otherwise requests run one at a time, as in llama-cpp-python's server.
A streaming request is never cut short by the next one (`interrupt_requests` off), so every client
queued behind it gets its answer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from llama_cpp.server import app as llama_server
from llama_cpp.server.settings import ServerSettings

import snapcache
from snapcache.key import DEFAULT_SCOPE
from snapcache.llama.batch import Mode
from snapcache.llama.exactness.choice import AUTO, Exactness, choose_exactness
from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.hook.cache_hook import CacheHook
from snapcache.llama.hook.cached import attach, detach
from snapcache.server.chat import ChatEngine, PromptRules, install_dialects
from snapcache.server.checks import CHAT_PATH, ModelLimits, RequestChecks
from snapcache.server.error_answers import answer_client_errors
from snapcache.server.middleware import SnapcacheMiddleware
from snapcache.server.monitor import ServeMonitor
from snapcache.server.openapi import describe_api
from snapcache.server.parallel import ModelTurns, parallel_model, unlock_routes
from snapcache.server.request_record import current_scope
from snapcache.server.routes import extras_router, llama_cpp_router, snapcache_router
from snapcache.server.served_model import ServedModel
from snapcache.store import SavingsLedger, SnapshotStore

__all__ = ["DEFAULT_MAX_TOKENS", "ServeOptions", "create_app", "serve"]

_log = logging.getLogger("snapcache")

# A completion that sets no limit stops here: long enough for an agent's answer or tool call, short
# of a whole context (Gemma-3-270M on 2 busy cores: 33 s for 1,024 tokens, 107 s under
# response_format json_object, whose grammar is checked against all 262,144 tokens at each step).
DEFAULT_MAX_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How the app answers: the API key clients must send, the model's name in `/v1/models`, the
    browser origins allowed to call it (none by default), the priority of the states it saves,
    whether restores must be exact ("auto": this build's choice; `exact=False`: at any token; see
    `snapcache.CacheHook`), the tokens a completion that sets no limit may generate (None: until
    the context is full), how many completions run at once (`parallel`, each with the Llama's
    `n_ctx`, or `seq_ctx` tokens where set: longer requests run one at a time on the Llama's own
    context) and how their steps are batched (`batch_mode`: see `snapcache.llama.batch.Scheduler`);
    whether Claude Code's per-session billing line stays in prompts (`keep_billing_header`),
    patterns of other text to delete from them (`normalize`: see `snapcache.server.chat.PromptRules`),
    and whether a streamed tool call goes out as it is written (`live_tool_calls`: see
    `snapcache.server.chat.ChatEngine`)."""

    api_key: str | None = None
    model_alias: str | None = None
    cors_origins: Sequence[str] = field(default_factory=tuple)
    priority: int = 0
    exact: Exactness = AUTO
    max_tokens_default: int | None = DEFAULT_MAX_TOKENS
    parallel: int = 4
    batch_mode: Mode = "batched"
    seq_ctx: int | None = None
    keep_billing_header: bool = False
    normalize: Sequence[str] = field(default_factory=tuple)
    live_tool_calls: bool = False


class _OneModel:
    """What llama-cpp-python's routes ask of their model proxy, for the one model already loaded
    (the Llama, or the `ParallelModel` that runs its completions several at once)."""

    def __init__(self, llm: Any, alias: str) -> None:
        self._llm = llm
        self._alias = alias

    def __call__(self, model: str | None = None) -> Any:
        return self._llm

    def __iter__(self) -> Iterator[str]:
        yield self._alias


def create_app(llm: llama_cpp.Llama, store: SnapshotStore, options: ServeOptions | None = None) -> FastAPI:
    """The server's ASGI app, serving `llm` with `store` behind it.

    Attaches the cache hook to `llm` (undone when the app shuts down); with `options.parallel`
    above 1, starts the scheduler (closed when the app shuts down). llama-cpp-python keeps its
    server's model and settings in module globals, so a process serves one app at a time.
    """
    options = options or ServeOptions()
    # Chosen once, so that the hook and the scheduler save and find states under one fingerprint.
    exactness = choose_exactness(llm, options.exact, FingerprintNotes(store.directory))
    fingerprint = model_fingerprint(llm, exact=exactness.exact)
    ledger = SavingsLedger(store.directory) if store.directory is not None else None
    monitor = ServeMonitor(store, fingerprint, ledger, exactness)
    hook: CacheHook = attach(
        llm, store, scope=current_scope, priority=options.priority, listener=monitor, exact=exactness
    )
    parallel = parallel_model(
        llm,
        store,
        options.parallel,
        mode=options.batch_mode,
        priority=options.priority,
        exact=exactness,
        listener=monitor,
        seq_ctx=options.seq_ctx,
    )
    alias = options.model_alias or Path(llm.model_path).name
    llama_server.set_server_settings(ServerSettings(api_key=options.api_key, interrupt_requests=False))
    llama_server._llama_proxy = _OneModel(parallel or llm, alias)  # type: ignore[assignment]
    turns = ModelTurns(parallel.batched.own_context if parallel is not None else None)
    answer_client_errors()
    limits = ModelLimits.of(llm)
    checks = RequestChecks(limits, options.max_tokens_default)
    rules = PromptRules(options.normalize, keep_billing_header=options.keep_billing_header)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if parallel is not None:
            parallel.close()
        detach(llm)
        if ledger is not None:
            ledger.close()

    app = FastAPI(title="snapcache", version=snapcache.__version__, lifespan=lifespan)
    app.include_router(extras_router())  # first: its routes answer before llama-cpp-python's
    app.include_router(llama_cpp_router(taken_over={CHAT_PATH}))  # the chat engine answers chats
    app.include_router(snapcache_router(hook, monitor, turns, parallel, rules))
    install_dialects(
        app,
        ChatEngine(llm, rules, options.max_tokens_default, live_tool_calls=options.live_tool_calls),
        ServedModel.of(llm, alias, fingerprint),
        options.api_key,
    )
    unlock_routes(app, parallel is not None)
    app.add_middleware(SnapcacheMiddleware, checks=checks)
    describe_api(app, limits, api_key=options.api_key is not None)
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Snapcache-Restored-Tokens", "X-Snapcache-Source", "Server-Timing"],
        )

    _log.info(
        "serving %s (fingerprint %s, %s), default scope %r",
        alias,
        fingerprint[:12],
        exactness.describe(),
        DEFAULT_SCOPE,
    )
    return app


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run `app` with uvicorn until SIGINT or SIGTERM; uvicorn logs only warnings and errors."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
