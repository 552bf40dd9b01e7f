"""Several requests at once on one Llama: a scheduler over one context of N sequences.

Requests wait in one queue, first come first served, and each takes a free sequence between steps
(continuous batching: a request joins while others generate, and leaves as soon as it ends or is
cancelled). A sequence a request left keeps the prompt it read, for the next request of the same
scope. On joining, a request reuses the longest prefix of its prompt that a sequence of its scope
holds (its own sequence cut back, or another one's copied in: "context"), or restores a longer one
from the store (`SequenceCache`); live prefixes are cut on the model's split alignment, where reading
on is bit for bit a cold read. A chat whose system part an earlier request of its scope is still
reading waits for that one to save it, then restores it. One thread runs the steps; a step is

- first, every prompt with at most `SHORT_READ` tokens left to read (a question after a restored
  prefix), each read whole, alone, earliest first, so that its first token waits for no step;
  requests that came meanwhile join and are read too (a burst's questions come a few
  milliseconds apart), and only then are the states taken on the way stored;
- the next token of every generating sequence: in `batched` mode one `llama_decode` for all of
  them, in `exact` mode one `llama_decode` per sequence;
- then one chunk (at most `n_batch` tokens, cut at restore points) of the prompt of the earliest
  request still reading a longer prompt, decoded alone.

Batching never makes the cache forget: each request plans the restore points a single-sequence
completion plans (`SequenceCache.plan`: the chat prefix, the prompt end, a raw prompt's ladder on a
sliding-window model), a sliding-window model reads to each and captures it there (a capture and a
decode more, the price of the cache's promise: that window exists only while the read stops there),
and a stored prompt end supersedes the one its conversation's previous turn restored. A request
waits for an earlier one of its scope to store their shared chat prefix only where that prefix can
be a restore point. When every free sequence holds a prompt, the one whose restore points the store
holds gives way first (see `LivePrefixes.choose`).

Prompts are always read alone, in the chunks a single-sequence Llama reads them in: a prompt's
KV cells, its first token and the states saved from it are those of a cold single-sequence run
(the cache never adds a difference of its own). In `batched` mode the later tokens of a request
that shares its steps with others come from batched decodes, whose logits differ slightly from a
decode alone (up to 0.9: docs/how-it-works/architecture.md), so greedy text can part from the solo
text; a request generating alone decodes alone. `exact` mode keeps every answer token for token
that of the same request run alone on a 1-sequence Llama, at the cost of the batching gain. `batched` is the
default: several agents at once want throughput, and a lone request, every prompt read, every
first token and every saved state stay exact. Measured (benchmarks/scheduler_throughput.py,
Gemma-3-270M, 2 threads, 4 requests of 80 prompt and 128 generated tokens): 54.9 generated tokens/s
batched, 40.1 exact, 39.3 one by one on the Llama; exact mode's gain is fairness (slowest first
token 1.0 s instead of 10.0 s), not throughput.

Each request's first token says where its time went (`FirstTokenPhases`, on its restore report):
its own restore and read, and the others' work it waited for, from the seconds the scheduler counts
by kind of work (`PhaseClock`).

The module stays whole at about 530 lines of code: the loop, admission, the step and the end of a request
are one state machine over the same slots; what sequences keep between requests is `_live`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import llama_cpp
import numpy as np

from snapcache.errors import InvalidArgument
from snapcache.key import BLOCK_TOKENS, DEFAULT_SCOPE, SnapshotKey, Tokens, as_token_array, validate_scope
from snapcache.llama.batch._context import Chunk, SequenceContext
from snapcache.llama.batch._live import Held, LivePrefixes
from snapcache.llama.batch._prefix import PendingSave, Restored, SequenceCache
from snapcache.llama.batch._request import FinishReason, Request, SchedulerError
from snapcache.llama.batch._sampling import SamplerChain, SamplingParams
from snapcache.llama.exactness.adapters import adapter_settings
from snapcache.llama.exactness.choice import AUTO, Exactness, ExactnessChoice
from snapcache.llama.state.blocks import KIND_PROMPT_END
from snapcache.llama.state.sequences import can_truncate
from snapcache.llama.stored.checkpoints import (
    CHECKPOINT_ALIGN,
    DEFAULT_PREFIX_REUSE,
    MIN_PREFIX_TOKENS,
    RestorePoint,
    align_down,
    head_point,
)
from snapcache.llama.stored.phases import PhaseClock, RequestTimer
from snapcache.llama.stored.read_grid import ReadGrid
from snapcache.llama.stored.reports import RestoreInfo
from snapcache.store import SnapshotStore

__all__ = ["Mode", "Scheduler"]

_log = logging.getLogger("snapcache")

Mode = Literal["batched", "exact"]
MODES: tuple[Mode, ...] = ("batched", "exact")
DEFAULT_MIN_TOKENS = 32
# A prompt with at most this many tokens left to read is read at once, before the next generation step.
SHORT_READ = 128


@dataclass(slots=True)
class _Slot:
    """A request holding a sequence: how far it has read and generated, what it saves on the way."""

    request: Request
    seq_id: int
    sampler: SamplerChain
    order: int
    n_past: int  # tokens the sequence holds
    reused: int
    stops: list[RestorePoint] = field(default_factory=list)  # read to each and save it there
    points: list[RestorePoint] = field(default_factory=list)  # saved from one capture of the prompt
    next_token: int = -1
    generated: int = 0
    checkpoints: int = 0
    floor: int = 0  # the shortest length its sequence may be cut back to (see `Held`)
    stored: int = 0  # how many of its prompt's tokens the store gives back (see `Held`)
    kept: int = 0  # its prompt-end point, which the store should give back
    prompt_end: SnapshotKey | None = None  # its conversation's latest stored prompt end
    head: int = 0  # where the head its conversations share ends (`checkpoints.head_point`; 0: none)
    left: Held | None = None  # what its sequence kept once it finished, for saves stored after
    timer: RequestTimer | None = None  # its own seconds, for the phases of its first token

    def held(self) -> Held:
        """What the sequence holds of the prompt so far, as a later request may reuse it."""
        prompt = self.request.prompt
        n = min(self.n_past, len(prompt))
        return Held(
            self.request.scope,
            prompt[:n],
            self.floor,
            stored=min(self.stored, n),
            kept=self.kept,
            prompt_end=self.prompt_end,
        )


class Scheduler:
    """Runs requests on `llm` in `n_seq` sequences of one context (see the module docstring).

    `store` (None: no cache) restores prefixes and saves states as `CachedLlama` does, under the
    Llama's own fingerprint; `save=False` only restores; `min_tokens` and `priority` as in
    `CachedLlama`; `prefix_reuse`: the ladder of window points along raw prompts, as in
    `CachedLlama`; `seq_ctx`: the tokens each sequence holds (default and most: the Llama's
    `n_ctx`); `exact` as in `CachedLlama` ("auto": this build's choice, see `exactness`);
    `exact=False` restores, saves and reuses live prefixes at any token, under the inexact
    fingerprint (`CachedLlama(exact=False)`'s): a burst reads only what its prompts do not share,
    and answers are no longer bit for bit a cold run's. `close` ends it (also a context manager).
    What each request restored is on the request (`Request.restore`); `BatchedLlama` tells a
    listener, on the reader's thread.
    """

    def __init__(
        self,
        llm: llama_cpp.Llama,
        store: SnapshotStore | None = None,
        *,
        n_seq: int = 4,
        mode: Mode = "batched",
        save: bool = True,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        priority: int = 0,
        seq_ctx: int | None = None,
        exact: Exactness | ExactnessChoice = AUTO,
        prefix_reuse: float | None = DEFAULT_PREFIX_REUSE,
    ) -> None:
        if isinstance(n_seq, bool) or not isinstance(n_seq, int) or not 1 <= n_seq <= 256:
            raise InvalidArgument(f"n_seq must be an int from 1 to 256, got {n_seq!r}")
        if seq_ctx is not None and (
            isinstance(seq_ctx, bool) or not isinstance(seq_ctx, int) or seq_ctx < 16
        ):
            raise InvalidArgument(f"seq_ctx must be an int of at least 16 tokens, got {seq_ctx!r}")
        if mode not in MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        reason = unbatched_reason(llm)
        if reason is not None:
            raise InvalidArgument(reason)
        self.llm = llm
        self.mode: Mode = mode
        self.n_seq = n_seq
        self._cache = (
            None
            if store is None
            else SequenceCache(
                llm,
                store,
                save=save,
                min_tokens=min_tokens,
                priority=priority,
                exact=exact,
                prefix_reuse=prefix_reuse,
            )
        )
        self._context = SequenceContext(llm, n_seq, seq_ctx)
        self._waiting: deque[Request] = deque()
        self._slots: dict[int, _Slot] = {}
        self._saves: list[tuple[_Slot, PendingSave]] = []  # taken by reads, stored after them
        self._free = list(range(n_seq))
        self._grid = ReadGrid.of(llm, CHECKPOINT_ALIGN) if self._cache is None else self._cache.grid
        self._live = LivePrefixes(self._context, self._grid, can_truncate(llm))
        self._admitted = 0
        self._closing = False
        self._cond = threading.Condition()
        self.decode_calls = 0
        self._clock = PhaseClock()  # the seconds of each kind of work, for requests' phases
        self._thread = threading.Thread(target=self._loop, name="snapcache-scheduler", daemon=True)
        self._thread.start()

    @property
    def exactness(self) -> ExactnessChoice | None:
        """What its cache chose (see `exactness`); None without a store."""
        return None if self._cache is None else self._cache.exactness

    @property
    def n_ctx(self) -> int:
        """The most tokens one request may hold, prompt and answer (the Llama's own `n_ctx`)."""
        return self._context.n_ctx

    @property
    def fingerprint(self) -> str | None:
        """The fingerprint states are saved and found under (the Llama's own); None without a store."""
        return None if self._cache is None else self._cache.fingerprint

    def submit(
        self,
        prompt: Tokens,
        params: SamplingParams | None = None,
        *,
        scope: str = DEFAULT_SCOPE,
        chat_prefix: Tokens | None = None,
        chat: bool = False,
    ) -> Request:
        """Queue a request for `prompt` (tokens, as the Llama's chat handler or tokenizer made them).

        `chat_prefix`: the tokens every chat with the same system messages starts with (a restore
        point is saved at their end); `chat`: the prompt is a rendered chat (a raw prompt leaves
        the ladder of window points that `prefix_reuse` sets). InvalidArgument for an empty prompt
        or one that leaves no room in the context; SchedulerError once closed.
        """
        tokens = as_token_array(prompt)
        n = len(tokens)
        if n == 0:
            raise InvalidArgument("the prompt has no tokens")
        if n >= self.n_ctx:
            raise InvalidArgument(f"Requested tokens ({n}) exceed context window of {self.n_ctx}")
        if int(tokens.max()) >= int(self.llm.n_vocab()):
            raise InvalidArgument("the prompt holds tokens outside this model's vocabulary")
        params = params or SamplingParams()
        # As Llama._create_completion: none or <= 0 is up to the context's end, and never past it.
        max_tokens = params.max_tokens
        room = self.n_ctx - n
        max_tokens = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        prefix = None if chat_prefix is None else as_token_array(chat_prefix)
        request = Request(tokens, params, max_tokens, validate_scope(scope), prefix, self._wake, chat=chat)
        with self._cond:
            if self._closing:
                raise SchedulerError("the scheduler is closed")
            self._waiting.append(request)
            self._cond.notify()
        return request

    def pending(self) -> tuple[int, int]:
        """(requests holding a sequence, requests waiting for one)."""
        with self._cond:
            return len(self._slots), len(self._waiting)

    def close(self) -> None:
        """Stop the scheduler: requests still running or waiting end with an error."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
        self._thread.join()
        closed = SchedulerError("the scheduler was closed")
        for slot in list(self._slots.values()):
            self._finish(slot, "error", closed)
        while self._waiting:
            self._waiting.popleft().finish("error", closed)
        self._context.close()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the scheduler's thread ---------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._drop_cancelled_waiting()
                while not self._closing and not self._waiting and not self._slots:
                    self._cond.wait()
                    self._drop_cancelled_waiting()
                if self._closing:
                    return
            try:
                for slot in [s for s in self._slots.values() if s.request.cancelled]:
                    self._finish(slot, "cancelled")
                self._step()
            except Exception as exc:  # a bug must not leave every client waiting forever
                _log.exception("the scheduler failed a step; its requests end with an error")
                self._saves.clear()
                for slot in list(self._slots.values()):
                    self._finish(slot, "error", exc)

    def _take_waiting(self) -> list[tuple[Request, int]]:
        """The waiting requests that take a free sequence now, first come first served, each with
        its sequence (called holding `_cond`)."""
        self._drop_cancelled_waiting()
        admitted: list[tuple[Request, int]] = []
        for request in list(self._waiting):
            if not self._free:
                break
            if self._follows(request, [r for r, _ in admitted]):
                continue
            self._waiting.remove(request)
            seq_id = self._live.choose(self._free, request.scope, request.prompt)
            self._free.remove(seq_id)
            admitted.append((request, seq_id))
        return admitted

    def _follows(self, request: Request, admitted: list[Request]) -> bool:
        """Whether `request` should wait for a request ahead of it with the same chat prefix in its
        scope to finish reading its prompt, and then restore what that one saved instead of reading
        the prefix itself. It loses no time: prompts are read one at a time, earliest first. A
        prefix too short to be a restore point is read by each (nothing would be saved to wait for)."""
        prefix = request.chat_prefix
        cache = self._cache
        if cache is None or prefix is None or cache.grid.at_most(len(prefix)) < MIN_PREFIX_TOKENS:
            return False
        ahead = [s.request for s in self._slots.values() if s.n_past < len(s.request.prompt)]
        return any(
            other.scope == request.scope
            and other.chat_prefix is not None
            and np.array_equal(other.chat_prefix, prefix)
            for other in ahead + admitted
        )

    def _drop_cancelled_waiting(self) -> None:
        if any(r.cancelled for r in self._waiting):
            for request in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(request)
                request.finish("cancelled")

    def _admit(self, request: Request, seq_id: int) -> None:
        started = time.perf_counter()
        timer = RequestTimer(self._clock, queued=started - request.submitted_at)
        context = self._context
        tokens = request.prompt
        try:
            sampler = SamplerChain(request.params, self.llm)
        except Exception as exc:
            self._live.forget(seq_id)
            context.clear(seq_id)
            self._release(seq_id)
            request.finish("error", exc)
            return
        running = {other: slot.held() for other, slot in self._slots.items()}
        live_source, live, live_held = self._live.longest(request.scope, tokens, seq_id, running)
        if self._cache is not None and self._cache.uncacheable is not None:
            live_source, live, live_held = seq_id, 0, None  # a live prefix would not read on exactly either
        self._live.forget(seq_id)
        if live_source != seq_id:
            context.clear(seq_id)
        restored = Restored()
        cache = self._cache
        if cache is not None:
            restored = cache.restore(context, seq_id, tokens, request.scope, longer_than=live)
            if restored.n_tokens == 0 and live_source == seq_id and context.last_position(seq_id) < 0:
                live = 0  # a refused restore cleared the sequence that held the live prefix
        stored = restored.n_tokens  # what the store gives back of it
        if restored.n_tokens == 0 and live > 0:
            if self._live.take(live_source, seq_id, live):
                assert live_held is not None
                restored = Restored(live, "context", live_held.floor, live_held.prompt_end)
                stored = min(live, live_held.stored)
            elif cache is not None:  # the live prefix could not be cut: the store's, however short
                restored = cache.restore(context, seq_id, tokens, request.scope)
                stored = restored.n_tokens
        reused = restored.n_tokens
        if reused == 0:
            context.clear(seq_id)
        slot = _Slot(
            request,
            seq_id,
            sampler,
            self._admitted,
            reused,
            reused,
            floor=restored.floor,
            stored=stored,
            prompt_end=restored.prompt_end,
        )
        self._admitted += 1
        if cache is not None:
            slot.head = head_point(tokens, request.chat_prefix, cache.alignment, cache.grid)
            points = cache.plan(tokens, reused, slot.head, chat=request.chat)
            slot.kept = max((p.n_tokens for p in points if p.kind == KIND_PROMPT_END), default=0)
            if cache.one_capture:
                slot.points = points
            else:
                slot.stops = points
        n = len(tokens)
        request.restore = RestoreInfo(
            n, reused, n - reused, restored.source, 0, time.perf_counter() - started
        )
        timer.restore = request.restore.restore_seconds
        self._clock.restore += timer.restore
        slot.timer = timer
        self._slots[seq_id] = slot

    def _step(self) -> None:
        # Waiting requests join, then prompts with little left to read (a question after a restored
        # prefix) are read first, each alone, earliest first: their first tokens come without waiting
        # a generation step each. Requests that came meanwhile join too, so that a burst's questions
        # are all read before anyone's next token. The states taken on the way are stored after the
        # reads. A longer read goes one chunk per step, so that it does not hold the others' answers
        # back.
        while True:
            with self._cond:
                admitted = [] if self._closing else self._take_waiting()
            for request, seq_id in admitted:
                self._admit(request, seq_id)
            for slot in sorted(self._slots.values(), key=lambda s: s.order):
                while slot.seq_id in self._slots and 0 < len(slot.request.prompt) - slot.n_past <= SHORT_READ:
                    self._read(slot)
            self._store_saves()
            if not admitted:
                break
        slots = list(self._slots.values())
        generating = [s for s in slots if s.n_past >= len(s.request.prompt)]
        if generating:
            groups = [generating] if self.mode == "batched" else [[s] for s in generating]
            for group in groups:
                self._generate(group)
        reading = [s for s in slots if s.n_past < len(s.request.prompt) and s.seq_id in self._slots]
        if reading:
            self._read(min(reading, key=lambda s: s.order))
            self._store_saves()

    def _store_saves(self) -> None:
        """Store the states the reads took at restore points (out of the way of first tokens); a
        stored prompt end supersedes its conversation's previous one."""
        cache = self._cache
        while self._saves and cache is not None:
            slot, pending = self._saves.pop(0)
            started = time.perf_counter()
            stored = cache.save(pending)
            self._clock.save += time.perf_counter() - started
            if not stored:
                continue
            slot.checkpoints += stored
            upto = max([p.n_tokens for p in pending.points] + [align_down(pending.blocks_upto, BLOCK_TOKENS)])
            slot.stored = max(slot.stored, upto)
            slot.prompt_end = cache.superseding(pending, slot.prompt_end, head=slot.head)
            if slot.left is not None:  # it finished before its saves were stored
                slot.left.stored = min(slot.stored, len(slot.left.tokens))
                slot.left.prompt_end = slot.prompt_end
            request = slot.request
            if request.restore is not None:
                request.restore = replace(request.restore, checkpoints=slot.checkpoints)

    def _generate(self, group: list[_Slot]) -> None:
        # In sequence order: llama.cpp splits a batch over several KV streams into ubatches of
        # consecutive, increasing sequence ids, and each ubatch reads every weight once.
        group = sorted(group, key=lambda s: s.seq_id)
        chunks = [Chunk(s.seq_id, [s.next_token], s.n_past, True) for s in group]
        started = time.perf_counter()
        code, rows = self._context.decode(chunks)
        self._clock.generate += time.perf_counter() - started
        self.decode_calls += 1
        if code != 0:
            self._fail(group, code)
            return
        for slot, row in zip(group, rows, strict=True):
            slot.n_past += 1
            reason = self._take(slot, slot.sampler.sample(self._context.ctx, row))
            if reason is not None:
                self._finish(slot, reason)

    def _read(self, slot: _Slot) -> None:
        """Decode the next chunk of the slot's prompt; at its end, sample the first token."""
        tokens = slot.request.prompt
        n = len(tokens)
        end = self._grid.piece_end(slot.n_past, n)  # the cold read's batches
        if slot.stops and slot.stops[0].n_tokens < end:
            end = slot.stops[0].n_tokens
        started = time.perf_counter()
        code, rows = self._context.decode(
            [Chunk(slot.seq_id, tokens[slot.n_past : end], slot.n_past, end == n)]
        )
        self.decode_calls += 1
        if code != 0:
            self._fail([slot], code)
            return
        slot.n_past = end
        cache = self._cache
        if cache is not None and slot.stops and slot.stops[0].n_tokens == end:
            point = slot.stops.pop(0)
            pending = cache.capture_point(self._context, slot.seq_id, tokens, slot.request.scope, point)
            if pending is not None:
                self._saves.append((slot, pending))
        if end < n:
            self._count_read(slot, started)
            return
        token = slot.sampler.sample(self._context.ctx, rows[0])
        self._count_read(slot, started)
        if slot.timer is not None and slot.request.restore is not None:
            first_token = time.perf_counter() - slot.request.submitted_at
            phases = slot.timer.phases(self._clock, first_token)
            slot.request.restore = replace(slot.request.restore, phases=phases)
        reason = self._take(slot, token)
        # The sequence holds exactly the prompt until the first token is decoded: take its state
        # now, after that token went to its reader.
        if cache is not None and cache.one_capture:
            pending = cache.capture_prompt(
                self._context, slot.seq_id, tokens, slot.request.scope, slot.points, slot.reused
            )
            if pending is not None:
                self._saves.append((slot, pending))
        if reason is not None:
            self._finish(slot, reason)

    def _count_read(self, slot: _Slot, started: float) -> None:
        spent = time.perf_counter() - started
        self._clock.read += spent
        if slot.timer is not None:
            slot.timer.read += spent

    def _take(self, slot: _Slot, token: int) -> FinishReason | None:
        """Hand a sampled token to its request; why the request ends with it, or None."""
        if slot.request.cancelled:
            return "cancelled"
        if self._context.is_eog(token):
            return "stop"
        slot.request.emit(token)
        slot.generated += 1
        if slot.generated >= slot.request.max_tokens:
            return "length"
        slot.next_token = token
        return None

    def _fail(self, group: Sequence[_Slot], code: int) -> None:
        error = SchedulerError(f"llama_decode failed (code {code})")
        _log.warning("%s for %d request(s); they end with an error", error, len(group))
        for slot in group:
            self._finish(slot, "error", error)

    def _finish(self, slot: _Slot, reason: FinishReason, error: BaseException | None = None) -> None:
        request = slot.request
        if reason == "error":
            self._context.clear(slot.seq_id)
        else:
            slot.left = slot.held()
            self._live.keep(slot.seq_id, slot.left)  # for the next request of the scope
        slot.sampler.close()
        self._slots.pop(slot.seq_id, None)
        self._release(slot.seq_id)
        request.finish(reason, error)

    def _release(self, seq_id: int) -> None:
        with self._cond:
            self._free.append(seq_id)
            self._free.sort()


def unbatched_reason(llm: llama_cpp.Llama) -> str | None:
    """Why the scheduler cannot run this Llama's requests (they take the single-sequence path), or None."""
    model = llm.model
    if llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model):
        return "recurrent and hybrid models are not batched yet"
    if getattr(llm.context_params, "embeddings", False):
        return "this Llama was built with embedding=True: it has no completions"
    if adapter_settings(llm):
        return "LoRA adapters and control vectors are not batched yet"
    return None
