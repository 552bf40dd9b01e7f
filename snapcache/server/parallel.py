"""Several completions at once on the one loaded model: the server's side of `snapcache.llama.batch`.

With `--parallel N` the routes get a `ParallelModel` in place of the Llama: its completions go to a
`BatchedLlama` over a `Scheduler` of N sequences (one context, N KV streams of `n_ctx` cells each,
or `--seq-ctx`, beside the Llama's own context), everything else to the Llama. llama-cpp-python's
routes hold one lock for a whole request (`get_llama_proxy`); `unlock_routes` gives them one that
does not, so requests meet in the scheduler. The Llama's own context still serves what the scheduler cannot
(logprobs, mirostat, ...: `BatchedLlama` sends them there, through the cache hook) and warms, one
at a time under `BatchedLlama.own_context`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import anyio
import llama_cpp
from fastapi import FastAPI
from llama_cpp.server import app as llama_server
from starlette.concurrency import run_in_threadpool

from snapcache.llama.batch import BatchedLlama, Mode, Scheduler, unbatched_reason
from snapcache.llama.exactness.choice import ExactnessChoice
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.hook.miss import MissExplanation, explain_prompt
from snapcache.llama.hook.request_streams import current_streams
from snapcache.llama.stored.reports import CompletionListener
from snapcache.server.request_record import current_scope
from snapcache.store import SnapshotStore

__all__ = ["ModelTurns", "ParallelModel", "parallel_model", "unlock_routes"]

_log = logging.getLogger("snapcache")

T = TypeVar("T")

_LOCKED_PROXY = llama_server.get_llama_proxy  # llama-cpp-python's: one request at a time


class ParallelModel:
    """The Llama to llama-cpp-python's routes, but for completions, which a `BatchedLlama` runs."""

    # Its sampler takes a `LazyGrammar` (llama-cpp-python's own takes none).
    takes_lazy_grammars = True

    def __init__(self, batched: BatchedLlama, store: SnapshotStore) -> None:
        self.batched = batched
        self.scheduler = batched.scheduler
        self.llm = batched.llm
        self._store = store
        self._notes = FingerprintNotes(store.directory)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    def create_completion(self, prompt: str | Sequence[int] = "", **kwargs: Any) -> Any:
        return self.batched.create_completion(prompt, **kwargs)

    def __call__(self, prompt: str | Sequence[int] = "", **kwargs: Any) -> Any:
        return self.batched.create_completion(prompt, **kwargs)

    def create_chat_completion(self, messages: list[Any], **kwargs: Any) -> Any:
        return self.batched.create_chat_completion(messages, **kwargs)

    @property
    def chat_handler(self) -> Callable[..., Any]:
        """What `Llama.create_chat_completion(self, ...)` calls: llama-cpp-python's streaming chat
        route calls that function of the class with this object, not its own method."""

        def handler(*, llama: Any, messages: list[Any], **kwargs: Any) -> Any:
            return self.batched.create_chat_completion(messages, **kwargs)

        return handler

    def explain(self, scope: str) -> MissExplanation | None:
        """Why the scope's latest batched completion restored what it did; None if none ran."""
        last = self.batched.last_request(scope)
        fingerprint = self.scheduler.fingerprint
        if last is None or fingerprint is None:
            return None
        request, submitted_at = last
        restored = request.restore.restored_tokens if request.restore is not None else 0
        return explain_prompt(
            self.llm,
            self._store,
            self._notes,
            fingerprint,
            scope,
            request.prompt,
            restored,
            stored_before=submitted_at,
        )

    def close(self) -> None:
        self.scheduler.close()


def parallel_model(
    llm: llama_cpp.Llama,
    store: SnapshotStore,
    n_seq: int,
    *,
    mode: Mode,
    priority: int,
    exact: ExactnessChoice,
    listener: CompletionListener,
    seq_ctx: int | None = None,
) -> ParallelModel | None:
    """A `ParallelModel` of `n_seq` sequences on `llm`; None (one request at a time, with the
    reason logged) when `n_seq` is 1 or the scheduler cannot run this Llama's requests."""
    if n_seq <= 1:
        return None
    reason = unbatched_reason(llm)
    if reason is not None:
        _log.warning("--parallel %d: %s; requests run one at a time", n_seq, reason)
        return None
    scheduler = Scheduler(llm, store, n_seq=n_seq, mode=mode, priority=priority, seq_ctx=seq_ctx, exact=exact)
    _log.info("%d requests at once (%s mode), %d tokens each", n_seq, mode, scheduler.n_ctx)
    return ParallelModel(BatchedLlama(scheduler, scope=current_scope, listener=listener), store)


@contextlib.asynccontextmanager
async def _stopping_streams() -> AsyncIterator[None]:
    """The model's use by one request: the streams it started and left unread (its client gone)
    are closed before the model is given back (see `snapcache.llama.hook.request_streams`)."""
    try:
        yield
    finally:
        streams = current_streams()
        if streams is not None:
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(streams.close_all)


async def _locked_proxy() -> AsyncIterator[Any]:
    """llama-cpp-python's model proxy (one request at a time), whose streams stop with the request."""
    async with contextlib.asynccontextmanager(_LOCKED_PROXY)() as proxy, _stopping_streams():
        yield proxy


async def _unlocked_proxy() -> AsyncIterator[Any]:
    """llama-cpp-python's model proxy, without its lock: the scheduler takes requests side by side."""
    async with _stopping_streams():
        yield llama_server._llama_proxy


def unlock_routes(app: FastAPI, unlocked: bool) -> None:
    """Make llama-cpp-python's routes take their model without (or, `unlocked=False`, with) the
    one-request lock, their streams stopped when their request ends. The completion routes call the
    module's `get_llama_proxy` directly, the others through a dependency: both are set."""
    proxy = _unlocked_proxy if unlocked else _locked_proxy
    llama_server.get_llama_proxy = proxy
    app.dependency_overrides[_LOCKED_PROXY] = proxy


class ModelTurns:
    """Runs a call that needs the Llama's own context in its turn, in a worker thread."""

    def __init__(self, own_context: threading.Lock | None) -> None:
        self._own_context = own_context

    async def run(self, call: Callable[[], T]) -> T:
        """`call()` once the Llama's own context is free: under `own_context` (parallel), else
        under llama-cpp-python's model lock, which every request holds."""
        lock = self._own_context
        if lock is None:
            async with contextlib.asynccontextmanager(_LOCKED_PROXY)():
                return await run_in_threadpool(call)

        def locked() -> T:
            with lock:
                return call()

        return await run_in_threadpool(locked)
