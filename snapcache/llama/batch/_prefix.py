"""The store side of a sequence: restore the longest stored prefix of a prompt, save its restore points.

The rules are the single-context path's, from the same `PrefixCache`: it finds and assembles
prefixes, plans the restore points (the end of a chat's head and near the end of the prompt, on the
model's measured split alignment; an inexact cache, `exact=False`, splits anywhere and keeps its
states apart under the inexact fingerprint, as `CachedLlama(exact=False)` does), saves captures
under the Llama's own fingerprint (states cross between the layouts in `SequenceContext`) and lets a
stored prompt end replace the one its conversation's previous turn left. What is here is about
sequences: which one a state goes into or comes from, and when it is captured (a model with one cache
saves every point from one capture of the prompt once it has been read; a sliding-window model reads
to each point and saves it there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import llama_cpp

from snapcache.errors import SnapcacheError
from snapcache.key import BLOCK_TOKENS, SnapshotKey, TokenArray
from snapcache.llama.batch._context import SequenceContext
from snapcache.llama.exactness.choice import AUTO, Exactness, ExactnessChoice, choose_exactness
from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.exactness.readiness import Readiness
from snapcache.llama.state.blocks import KIND_PROMPT_END
from snapcache.llama.state.sequences import CapturedState
from snapcache.llama.stored.checkpoints import RestorePoint
from snapcache.llama.stored.prefix_cache import PrefixCache
from snapcache.llama.stored.reports import Source
from snapcache.llama.stored.stored_states import Found
from snapcache.prompt_tokens import PromptTokens
from snapcache.store import SnapshotStore

__all__ = ["PendingSave", "Restored", "SequenceCache"]

_log = logging.getLogger("snapcache")


@dataclass(frozen=True, slots=True)
class PendingSave:
    """A sequence's state taken at restore points, not stored yet."""

    captured: CapturedState
    scope: str
    points: tuple[RestorePoint, ...]
    blocks_upto: int


@dataclass(frozen=True, slots=True)
class Restored:
    """What `SequenceCache.restore` put into a sequence: `n_tokens` (0: nothing), the tier it came
    from, the shortest length the sequence may be cut back to (one short of it where the window
    cache was padded, else 0), and the prompt end of the conversation it continues: the record
    restored when it was one, or the one a reused live sequence stored (a later turn supersedes it)."""

    n_tokens: int = 0
    source: Source | None = None
    floor: int = 0
    prompt_end: SnapshotKey | None = None


class SequenceCache:
    """Restores into, and saves from, the sequences of one `SequenceContext` (see the module docstring).

    `uncacheable` says why this Llama's states can be neither restored nor saved (None: they can).
    `exact`: "auto" (this build's choice), True, or False: restore and save at any token (see
    `CacheHook`'s `exact`). `prefix_reuse` (None: off) sets the ladder of window points along a raw
    prompt on a sliding-window model.
    """

    def __init__(
        self,
        llm: llama_cpp.Llama,
        store: SnapshotStore,
        *,
        save: bool,
        min_tokens: int,
        priority: int,
        exact: Exactness | ExactnessChoice = AUTO,
        prefix_reuse: float | None = None,
    ) -> None:
        self.store = store
        notes = FingerprintNotes(store.directory)
        self.exactness = exact if isinstance(exact, ExactnessChoice) else choose_exactness(llm, exact, notes)
        self.exact = exact = self.exactness.exact
        self._cache = cache = PrefixCache(
            llm,
            store,
            model_fingerprint(llm, exact=exact),
            save=save,
            min_tokens=min_tokens,
            priority=priority,
            prefix_reuse=prefix_reuse,
            exact=exact,
        )
        readiness = Readiness(llm, cache, notes, exact=exact)
        self.uncacheable = readiness.reason_not(saving=save)
        if self.uncacheable is not None:
            _log.warning("%s", self.uncacheable)
        self.grid = readiness.grid  # where reads stop and restores start (`ReadGrid`)
        self._save = save and self.uncacheable is None
        self.one_capture = cache.one_capture

    @property
    def alignment(self) -> int:
        """The model's split alignment (the grid's)."""
        return self.grid.alignment

    @property
    def fingerprint(self) -> str:
        return self._cache.fingerprint

    def restore(
        self, context: SequenceContext, seq_id: int, tokens: TokenArray, scope: str, *, longer_than: int = 0
    ) -> Restored:
        """Restore the longest stored prefix of `tokens` (short of its last token, which the request
        reads for its logits, and at a point of the read grid) into `seq_id` when it is longer than
        `longer_than` tokens (else nothing: `Restored()`)."""
        if self.uncacheable is not None:
            return Restored()

        def restore(found: Found) -> bool:
            return context.restore(seq_id, found.snapshot, window_padded=found.window_padded)

        grid, n = self.grid.for_stored, len(tokens)
        found = self._cache.restore_longest(
            PromptTokens.of(tokens[: grid.at_most(n - 1, n)]),
            scope,
            restore,
            longer_than=longer_than,
            buffer=context.restore_buffer,
            workers=context.restore_threads,
            holds=lambda n_tokens: grid.holds(n_tokens, n),
        )
        if found is None:
            return Restored()
        n = found.snapshot.key.token_count
        prompt_end = found.record_key if found.kind == KIND_PROMPT_END else None
        return Restored(n, found.source, n - 1 if found.window_padded else 0, prompt_end)

    def plan(self, tokens: TokenArray, reused: int, head: int, *, chat: bool) -> list[RestorePoint]:
        """The restore points `tokens` should leave behind, past the `reused` ones, ascending, as a
        single-sequence completion plans them (`chat`: a rendered chat, which has no ladder)."""
        if not self._save:
            return []
        return self._cache.plan(
            tokens, reused=reused, head=head, raw=not chat, alignment=self.alignment, grid=self.grid
        )

    def capture_point(
        self, context: SequenceContext, seq_id: int, tokens: TokenArray, scope: str, point: RestorePoint
    ) -> PendingSave | None:
        """The state of the sequence, which holds exactly `tokens[:point.n_tokens]`, to store for
        `point` with `save` (the sequence may read on meanwhile); None if it cannot be taken."""
        if not self._save:
            return None
        return self._capture(context, seq_id, tokens[: point.n_tokens], scope, (point,), 0)

    def capture_prompt(
        self,
        context: SequenceContext,
        seq_id: int,
        tokens: TokenArray,
        scope: str,
        points: list[RestorePoint],
        reused: int,
    ) -> PendingSave | None:
        """The state of a prompt read whole (the sequence holds exactly `tokens`) to store with
        `save` for its points and its blocks, from one capture (a model with one cache); None if
        there is nothing to save or it cannot be taken."""
        if not self._save or not (points or len(tokens) - reused >= BLOCK_TOKENS):
            return None
        return self._capture(context, seq_id, tokens, scope, tuple(points), len(tokens))

    def save(self, pending: PendingSave) -> int:
        """Store what `capture_point` or `capture_prompt` took; how many restore points were stored."""
        return self._cache.save(
            pending.captured, pending.scope, pending.points, blocks_upto=pending.blocks_upto
        )

    def superseding(
        self, pending: PendingSave, old: SnapshotKey | None, *, head: int = 0
    ) -> SnapshotKey | None:
        """`pending` was stored: when it held a prompt end, the previous turn's prompt end `old` goes
        (see `PrefixCache.supersede`), and the new one's key is returned (what the next turn
        supersedes); otherwise `old`."""
        for point in pending.points:
            tokens = pending.captured.tokens[: point.n_tokens]
            key = self._cache.supersede(point, tokens, pending.scope, (old,), head=head)
            if key is not None:
                return key
        return old

    def _capture(
        self,
        context: SequenceContext,
        seq_id: int,
        tokens: TokenArray,
        scope: str,
        points: tuple[RestorePoint, ...],
        blocks_upto: int,
    ) -> PendingSave | None:
        try:
            return PendingSave(context.capture(seq_id, tokens), scope, points, blocks_upto)
        except SnapcacheError as exc:
            _log.warning("could not save the state of %d tokens of sequence %d: %s", len(tokens), seq_id, exc)
            return None
