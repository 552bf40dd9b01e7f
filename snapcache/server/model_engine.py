"""The served model, its cache and its scheduler: the one object the routes call to reach llama.cpp.

`create_app` builds one `ModelEngine` and hands it to every route. A route calls it with the
request's scope and `RequestRecord` as arguments; what the completion restored and did is written
into that record (and told to the monitor) as it happens. The Llama itself is left as it was loaded:
no method of it is replaced and no hook stays attached.

Completions run on one of two paths, chosen once:

- batched (`--parallel` N above 1, the default 4): a `BatchedLlama` over a `Scheduler` of N
  sequences runs them side by side; what it cannot run (logprobs, mirostat, logits processors,
  prompts longer than a sequence) runs on the Llama's own context, one at a time, through the
  `CacheHook` installed for that call;
- one at a time (`--parallel 1`, or a model the scheduler cannot run): every completion runs through
  that `CacheHook` on the Llama's own context, under its lock, a whole one on a thread of its own; a
  stream holds the lock from its first chunk until it ends or its route closes it, in the request's
  worker threads.

Either way, warming and explaining a miss run on the Llama's own context in its turn (`in_turn`).
Whatever decodes on the Llama's own context runs on a thread that ends with the call, never on a
worker thread that stays, but for the streams of the one-at-a-time path: llama.cpp's OpenMP keeps a
team of threads for each thread that decoded, and more teams than cores slow every decode, the
scheduler's too (`openmp_teams`).
Given the model's projector, chats with images run through the `CacheHook`'s chats with images, on
the Llama's own context, one at a time (the batched path reads text only).
See docs/how-it-works/architecture.md ("The server").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import llama_cpp
from starlette.concurrency import run_in_threadpool

from snapcache.llama.batch import BatchedLlama, Mode, Scheduler, unbatched_reason
from snapcache.llama.exactness.choice import AUTO, ExactnessChoice, choose_exactness
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.hook.cache_hook import CacheHook
from snapcache.llama.hook.detached_stream import on_own_context
from snapcache.llama.hook.miss import MissExplanation, explain_prompt
from snapcache.llama.media.projector import Projector
from snapcache.llama.setup.openmp_teams import on_passing_thread
from snapcache.llama.stored.reports import CompletionListener, CompletionReport, RestoreInfo
from snapcache.server.request_record import RequestRecord
from snapcache.store import SnapshotStore

__all__ = ["EngineOptions", "ModelEngine"]

_log = logging.getLogger("snapcache")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How the engine runs completions: the priority of the states it saves, how many run at once
    (`parallel`) and how their steps are batched (`batch_mode`), and the tokens each sequence holds
    (`seq_ctx`; None: the Llama's `n_ctx`)."""

    priority: int = 0
    parallel: int = 4
    batch_mode: Mode = "batched"
    seq_ctx: int | None = None


class ModelEngine:
    """The served Llama with its cache (see the module docstring). `exactness`: chosen once for both
    paths (None: this build's choice, "auto"); `listener` (the server's monitor) hears of every
    completion, after the request's own record; `projector`: the model's, with which chats read
    images."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        store: SnapshotStore,
        options: EngineOptions | None = None,
        *,
        exactness: ExactnessChoice | None = None,
        listener: CompletionListener | None = None,
        projector: Projector | None = None,
    ) -> None:
        options = options or EngineOptions()
        self.llm = llm
        self.store = store
        self._notes = FingerprintNotes(store.directory)
        self.exactness = exactness or choose_exactness(llm, AUTO, self._notes)
        self._listener = listener
        # Never installed for good: each call that runs on the Llama's own context installs it for itself.
        self.hook = CacheHook(
            llm,
            store,
            priority=options.priority,
            listener=listener,
            exact=self.exactness,
            projector=projector,
        )
        self.projector = projector
        self.batched = _batched(llm, store, options, self.exactness, self.hook, listener)
        # The Llama's own context serves one call at a time: one-at-a-time completions, warms, explains.
        self._own_context = self.batched.own_context if self.batched is not None else threading.Lock()

    @property
    def scheduler(self) -> Scheduler | None:
        """The scheduler of the batched path; None when completions run one at a time."""
        return self.batched.scheduler if self.batched is not None else None

    @property
    def path(self) -> str:
        """Which path completions take: "batched" or "one at a time"."""
        return "batched" if self.batched is not None else "one at a time"

    # -- completions (call from a worker thread) ----------------------------------------------------

    def complete(self, prompt: str | Sequence[int], record: RequestRecord, **kwargs: Any) -> Any:
        """`Llama.create_completion` of `prompt` in the record's scope, cached: a dict, or an iterator
        of chunks with `stream=True`. What it restored and did goes into `record`."""
        listener = _RecordListener(record, self._listener)
        if self.batched is not None:
            return self.batched.create_completion(prompt, scope=record.scope, listener=listener, **kwargs)
        hook = self.hook
        return self._one_at_a_time(
            lambda: hook.create_completion(prompt, scope=record.scope, listener=listener, **kwargs),
            stream=bool(kwargs.get("stream")),
        )

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        record: RequestRecord,
        *,
        special_text: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`Llama.create_chat_completion` of `messages` in the record's scope, cached, as `complete`;
        `special_text` keeps the model's special tokens in the answer's text (a tool call's marker)."""
        listener = _RecordListener(record, self._listener)
        if self.batched is not None:
            return self.batched.create_chat_completion(
                list(messages), scope=record.scope, listener=listener, special_text=special_text, **kwargs
            )
        hook = self.hook
        return self._one_at_a_time(
            lambda: hook.create_chat_completion(
                list(messages), scope=record.scope, listener=listener, special_text=special_text, **kwargs
            ),
            stream=bool(kwargs.get("stream")),
        )

    def _one_at_a_time(self, run: Callable[[], Any], *, stream: bool) -> Any:
        """`run()` on the Llama's own context: a whole call on a thread that ends with it (its OpenMP
        team goes with it, see `openmp_teams`); a stream under the context's lock from its first
        chunk until it ends or is closed, in the request's worker threads (made in a thread of its
        own, a stream whose client went saved an empty state: not done)."""
        if stream:
            return _holding(self._own_context, run)
        return on_own_context(run, self._own_context, stream=False)

    # -- the model's vocabulary (thread-safe) -------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens as a prompt starts (special tokens read as such)."""
        return list(self.llm.tokenize(text.encode("utf-8"), special=True))

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`; a character cut between tokens is U+FFFD, not a failure."""
        data = llama_cpp.Llama.detokenize(self.llm, list(tokens))
        return bytes(data).decode("utf-8", errors="replace")

    def bias_by_token(self, bias: Mapping[str, float]) -> dict[int, float]:
        """A logit bias keyed by texts, keyed by their tokens instead (each token of a text gets its
        bias), as llama-cpp-python's `logit_bias_type: "tokens"` reads it."""
        return {
            token: value
            for text, value in bias.items()
            for token in self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        }

    def min_tokens_processor(self, min_tokens: int) -> llama_cpp.LogitsProcessorList:
        """What holds an answer's end of generation back for its first `min_tokens` tokens."""
        eos = int(self.llm.token_eos())
        return llama_cpp.LogitsProcessorList([llama_cpp.MinTokensLogitsProcessor(min_tokens, eos)])

    # -- the Llama's own context --------------------------------------------------------------------

    async def in_turn(self, call: Callable[[], T]) -> T:
        """`call()` in a worker thread once the Llama's own context is free."""
        lock = self._own_context

        def locked() -> T:
            with lock:
                return on_passing_thread(call)  # its OpenMP team goes with the thread (`openmp_teams`)

        return await run_in_threadpool(locked)

    def explain(self, scope: str) -> MissExplanation | None:
        """Why the scope's latest completion restored what it did; None if none ran. A worker thread's
        call: a batched completion is explained at once, one on the Llama's own context in its turn."""
        explained = self._explain_batched(scope)
        if explained is not None:
            return explained
        with self._own_context:
            return self.hook.explain(scope)

    def _explain_batched(self, scope: str) -> MissExplanation | None:
        batched = self.batched
        if batched is None:
            return None
        last = batched.last_request(scope)
        fingerprint = batched.scheduler.fingerprint
        if last is None or fingerprint is None:
            return None
        request, submitted_at = last
        restored = request.restore.restored_tokens if request.restore is not None else 0
        return explain_prompt(
            self.llm,
            self.store,
            self._notes,
            fingerprint,
            scope,
            request.prompt,
            restored,
            stored_before=submitted_at,
        )

    def load(self) -> dict[str, Any] | None:
        """The batched path's sequences, mode, running and waiting requests; None one at a time."""
        scheduler = self.scheduler
        if scheduler is None:
            return None
        running, waiting = scheduler.pending()
        return {"sequences": scheduler.n_seq, "mode": scheduler.mode, "running": running, "waiting": waiting}

    def close(self) -> None:
        """Stop the scheduler (the Llama stays loaded, as it was given)."""
        if self.batched is not None:
            self.batched.scheduler.close()


def _holding(lock: threading.Lock, run: Callable[[], Any]) -> Generator[Any, None, None]:
    """The chunks of `run()`, made under `lock` from the first chunk asked for until the stream ends
    or is closed (the routes close every stream they start, also when their client goes)."""
    with lock:
        chunks = iter(run())
        try:
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()


class _RecordListener:
    """One request's listener: what its completion restored and generated goes into its record,
    and on to the server's listener."""

    def __init__(self, record: RequestRecord, listener: CompletionListener | None) -> None:
        self._record = record
        self._listener = listener

    def restored(self, scope: str, info: RestoreInfo) -> None:
        self._record.restore = info
        if self._listener is not None:
            self._listener.restored(scope, info)

    def finished(self, report: CompletionReport) -> None:
        self._record.completion_tokens = report.completion_tokens
        if self._listener is not None:
            self._listener.finished(report)


def _batched(
    llm: llama_cpp.Llama,
    store: SnapshotStore,
    options: EngineOptions,
    exactness: ExactnessChoice,
    hook: CacheHook,
    listener: CompletionListener | None,
) -> BatchedLlama | None:
    """A `BatchedLlama` of `options.parallel` sequences on `llm`; None (one at a time, the reason
    logged) when that is 1 or the scheduler cannot run this Llama's requests."""
    n_seq = options.parallel
    if n_seq <= 1:
        return None
    reason = unbatched_reason(llm)
    if reason is not None:
        _log.warning("--parallel %d: %s; requests run one at a time", n_seq, reason)
        return None
    scheduler = Scheduler(
        llm,
        store,
        n_seq=n_seq,
        mode=options.batch_mode,
        priority=options.priority,
        seq_ctx=options.seq_ctx,
        exact=exactness,
    )
    _log.info("%d requests at once (%s mode), %d tokens each", n_seq, options.batch_mode, scheduler.n_ctx)
    return BatchedLlama(scheduler, listener=listener, hook=hook)
