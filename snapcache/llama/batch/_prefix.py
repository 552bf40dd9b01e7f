"""The store side of a sequence: restore the longest stored prefix of a prompt, save its restore points.

It is `PrefixLoader` and `CompletionCache` with a sequence id: the same `StoredStates` finds and
assembles prefixes and saves captures, under the Llama's own fingerprint (states cross between the
layouts in `SequenceContext`), at the same restore points (`checkpoints.checkpoint_plan`: the end of
the system messages of a chat, and near the end of the prompt, on the model's measured split
alignment; an inexact cache, `exact=False`, splits anywhere and keeps its states apart under the
inexact fingerprint, as `CachedLlama(exact=False)` does). A model with one cache saves every point
from one capture of the prompt once it has been read; a sliding-window model reads to each point and
saves it there, with the ladder of window points along a raw prompt that `CompletionCache` leaves
(`prefix_reuse`). A stored prompt end replaces the one its conversation's previous turn restored from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import llama_cpp

from snapcache.errors import SnapcacheError
from snapcache.formats.threads import wider
from snapcache.key import BLOCK_TOKENS, SnapshotKey, TokenArray
from snapcache.llama.batch._context import SequenceContext
from snapcache.llama.blocks import KIND_PROMPT_END
from snapcache.llama.checkpoints import RestorePoint, checkpoint_plan, window_ladder
from snapcache.llama.exactness import AUTO, Exactness, ExactnessChoice, choose_exactness
from snapcache.llama.fingerprint import model_fingerprint
from snapcache.llama.fingerprint_notes import FingerprintNotes
from snapcache.llama.prefix_loader import PrefixLoader
from snapcache.llama.readiness import Readiness
from snapcache.llama.reports import Source
from snapcache.llama.state import CapturedState, can_truncate, pads_windows
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
        loader = PrefixLoader(llm, store, model_fingerprint(llm, exact=exact))
        readiness = Readiness(llm, loader, notes, exact=exact)
        self.uncacheable = readiness.reason_not(saving=save)
        if self.uncacheable is not None:
            _log.warning("%s", self.uncacheable)
        self.alignment = readiness.alignment
        self.fingerprint = loader.fingerprint
        self._states = loader.states
        self._save = save and self.uncacheable is None
        self._min_tokens = min_tokens
        self._priority = priority
        self.one_capture = can_truncate(llm)
        self._pad_windows = pads_windows(llm)
        n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
        self._ladder = [] if self.one_capture else window_ladder(n_swa, int(llm.n_ctx()), prefix_reuse)

    def restore(
        self, context: SequenceContext, seq_id: int, tokens: TokenArray, scope: str, *, longer_than: int = 0
    ) -> Restored:
        """Restore the longest stored prefix of `tokens` (short of its last token, which the request
        reads for its logits) into `seq_id` when it is longer than `longer_than` tokens (else
        nothing: `Restored()`)."""
        if self.uncacheable is not None:
            return Restored()
        query = tokens[:-1]
        while len(query) > longer_than:
            with wider(context.restore_threads):
                found = self._states.find(
                    query,
                    scope,
                    blocks_alone=self.one_capture,
                    pad_windows=self._pad_windows,
                    longer_than=longer_than,
                )
            if found is None:
                break
            n = found.snapshot.key.token_count
            if n <= longer_than:
                break
            if context.restore(seq_id, found.snapshot, window_padded=found.window_padded):
                prompt_end = found.record_key if found.kind == KIND_PROMPT_END else None
                return Restored(n, found.source, n - 1 if found.window_padded else 0, prompt_end)
            query = tokens[: n - 1]
        return Restored()

    def plan(self, tokens: TokenArray, reused: int, head: int, *, chat: bool) -> list[RestorePoint]:
        """The restore points `tokens` should leave behind, past the `reused` ones, ascending, as a
        single-sequence completion plans them (`chat`: a rendered chat, which has no ladder)."""
        if not self._save:
            return []
        points = checkpoint_plan(
            tokens,
            ladder=[] if chat else self._ladder,
            head=head,
            priority=self._priority,
            after=reused,
            alignment=self.alignment,
            exact=self.exact,
        )
        if self.one_capture:
            return points
        # A window cache holds one point: a whole window is not worth a few tokens more.
        kept, last = [], reused
        for point in points:
            if point.n_tokens - last >= self._min_tokens:
                kept.append(point)
                last = point.n_tokens
        return kept

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
        try:
            return self._states.save(
                pending.captured, pending.scope, pending.points, blocks_upto=pending.blocks_upto
            )
        except (SnapcacheError, OSError) as exc:
            _log.warning("could not save the state of %d tokens: %s", len(pending.captured.tokens), exc)
            return 0

    def superseding(
        self, pending: PendingSave, old: SnapshotKey | None, *, head: int = 0
    ) -> SnapshotKey | None:
        """`pending` was stored: when it held a prompt end, the previous turn's prompt end `old` goes
        (see `StoredStates.supersede`: only where it starts the new one's tokens and lies past the
        `head` its conversations share), and the new one's key is returned (what the next turn
        supersedes); otherwise `old`."""
        for point in pending.points:
            if point.kind != KIND_PROMPT_END:
                continue
            tokens = pending.captured.tokens[: point.n_tokens]
            if old is not None:
                self._states.supersede(old, tokens, point.priority, head=head)
            return SnapshotKey.for_tokens(self.fingerprint, pending.scope, tokens)
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
