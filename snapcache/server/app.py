"""`snapcache serve`: the server's ASGI app, with one model engine behind every route.

`create_app` builds the `ModelEngine` (the loaded Llama, its cache, and with `parallel` above 1 the
scheduler that runs that many completions at once) and hands it to the routes: OpenAI's text
completions and the tokenizer's (`completion_routes`), the chat dialects (`chat`: Chat Completions,
Responses, Anthropic Messages, Ollama) through their `ChatEngine`, and snapcache's own (`routes`).
They call it with each request's scope and record. A middleware scopes text completions and reports
what they reused (see `middleware`), after checking every JSON body before it reaches the model
(see `checks`). llama-cpp-python's request and response models describe the OpenAI text routes;
its server module, its globals and the served Llama's methods are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

import snapcache
from snapcache.key import DEFAULT_SCOPE
from snapcache.llama.batch import Mode
from snapcache.llama.exactness.choice import AUTO, Exactness, choose_exactness
from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.media.projector import Projector
from snapcache.llama.state.capture_buffer import release_capture_buffer
from snapcache.server.api_key import bearer_key_check
from snapcache.server.chat import ChatEngine, PromptRules, install_dialects
from snapcache.server.checks import ModelLimits, RequestChecks
from snapcache.server.completion_routes import completion_router
from snapcache.server.middleware import SnapcacheMiddleware
from snapcache.server.model_engine import EngineOptions, ModelEngine
from snapcache.server.monitor import ServeMonitor
from snapcache.server.openapi import describe_api
from snapcache.server.routes import snapcache_router
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
    whether a streamed tool call goes out as it is written (`live_tool_calls`: see
    `snapcache.server.chat.ChatEngine`), and the model's projector (`mmproj`, an mmproj GGUF file),
    with which chats read images (without one, a request with an image is a 400)."""

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
    mmproj: str | os.PathLike[str] | None = None


def create_app(llm: llama_cpp.Llama, store: SnapshotStore, options: ServeOptions | None = None) -> FastAPI:
    """The server's ASGI app, serving `llm` with `store` behind it.

    With `options.parallel` above 1, starts the scheduler (closed when the app shuts down). `llm` is
    left as it was given: nothing is attached to it, and several apps may serve Llamas in one process.
    """
    options = options or ServeOptions()
    # Chosen once, so that the one-at-a-time path and the scheduler save and find states under one
    # fingerprint.
    exactness = choose_exactness(llm, options.exact, FingerprintNotes(store.directory))
    fingerprint = model_fingerprint(llm, exact=exactness.exact)
    ledger = SavingsLedger(store.directory) if store.directory is not None else None
    monitor = ServeMonitor(store, fingerprint, ledger, exactness)
    projector = Projector(llm, options.mmproj) if options.mmproj is not None else None
    engine = ModelEngine(
        llm,
        store,
        EngineOptions(
            priority=options.priority,
            parallel=options.parallel,
            batch_mode=options.batch_mode,
            seq_ctx=options.seq_ctx,
        ),
        exactness=exactness,
        listener=monitor,
        projector=projector,
    )
    alias = options.model_alias or Path(llm.model_path).name
    limits = ModelLimits.of(llm)
    checks = RequestChecks(limits, options.max_tokens_default)
    rules = PromptRules(options.normalize, keep_billing_header=options.keep_billing_header)
    authenticate = bearer_key_check(options.api_key)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.close()
        if projector is not None:
            projector.close()
        release_capture_buffer(llm)
        if ledger is not None:
            ledger.close()

    app = FastAPI(title="snapcache", version=snapcache.__version__, lifespan=lifespan)
    app.include_router(completion_router(engine, alias, authenticate))
    app.include_router(snapcache_router(engine, monitor, rules, authenticate))
    install_dialects(
        app,
        ChatEngine(engine, rules, options.max_tokens_default, live_tool_calls=options.live_tool_calls),
        ServedModel.of(llm, alias, fingerprint, reads_images=projector is not None),
        options.api_key,
    )
    app.add_middleware(SnapcacheMiddleware, checks=checks)
    describe_api(app, limits, api_key=options.api_key is not None, images=projector is not None)
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Snapcache-Restored-Tokens", "X-Snapcache-Source", "Server-Timing"],
        )

    _log.info(
        "serving %s (fingerprint %s, %s, %s), default scope %r",
        alias,
        fingerprint[:12],
        exactness.describe(),
        engine.path,
        DEFAULT_SCOPE,
    )
    return app


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run `app` with uvicorn until SIGINT or SIGTERM; uvicorn logs only warnings and errors."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
