"""The cache's rules for one Llama's states, whatever holds its sequences: which stored prefix a prompt
restores, which restore points it leaves behind, how they are saved, and which prompt end a newer one
of the same conversation replaces.

Both paths go through one `PrefixCache`: `CacheHook`'s one context (`prefix_loader`, `completion`)
and the batched scheduler's N sequences (`batch._prefix`). They keep only what is about their
sequences: capturing and restoring them, and what each holds live. The rules were written twice
before, and the copies drifted: the batched path once lost an agent's main chat after its sub-agents
(the scheduler's promise: docs/how-it-works/architecture.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import llama_cpp

from snapcache.errors import SnapcacheError
from snapcache.formats.threads import RESTORE_THREADS, wider
from snapcache.key import SnapshotKey, TokenArray
from snapcache.llama.state.blocks import KIND_PROMPT_END
from snapcache.llama.state.capture_buffer import CaptureBuffer
from snapcache.llama.state.sequences import CapturedState, can_truncate, pads_windows
from snapcache.llama.stored.checkpoints import RestorePoint, checkpoint_plan, window_ladder
from snapcache.llama.stored.read_grid import ReadGrid
from snapcache.llama.stored.stored_states import Found, StoredStates
from snapcache.prompt_tokens import PromptTokens
from snapcache.store import SnapshotStore

__all__ = ["PrefixCache", "Restore"]

_log = logging.getLogger("snapcache")

# Puts a found prefix into its sequence: True when it did; False when it was refused with the
# sequence as it was (a shorter prefix may still fit); None when it was refused and the sequence lost
# what it held (nothing more is tried).
Restore = Callable[[Found], "bool | None"]


class PrefixCache:
    """Finds, plans, saves and supersedes the states of one Llama's model and context settings in
    `store`, under `fingerprint` (see the module docstring).

    `save=False` only restores. On a model that cannot cut one capture into several points
    (sliding windows, recurrent states), no point is planned that spares fewer than `min_tokens`
    tokens over the last one kept, and a raw prompt leaves the ladder of window points that
    `prefix_reuse` (None: off) sets. `priority` goes with every point (ladder points: one lower).
    `exact=False` splits anywhere.
    """

    def __init__(
        self,
        llm: llama_cpp.Llama,
        store: SnapshotStore,
        fingerprint: str,
        *,
        save: bool = True,
        min_tokens: int = 1,
        priority: int = 0,
        prefix_reuse: float | None = None,
        exact: bool = True,
    ) -> None:
        self.states = StoredStates(store, fingerprint)
        self.saves = save
        self.min_tokens = min_tokens
        self.priority = priority
        self.exact = exact
        # One cache of full attention: every point is cut from one capture after the prompt is read.
        # Sliding windows and recurrent states hold only their last point: read on to each.
        self.one_capture = can_truncate(llm)
        self.pads_windows = pads_windows(llm)
        n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
        self.windows = n_swa > 0
        self.ladder = [] if self.one_capture else window_ladder(n_swa, int(llm.n_ctx()), prefix_reuse)

    @property
    def fingerprint(self) -> str:
        """The fingerprint states are saved and found under: set again when adapters change it."""
        return self.states.fingerprint

    @fingerprint.setter
    def fingerprint(self, value: str) -> None:
        self.states.fingerprint = value

    def restore_longest(
        self,
        prompt: PromptTokens,
        scope: str,
        restore: Restore,
        *,
        longer_than: int = 0,
        buffer: CaptureBuffer | None = None,
        workers: int = RESTORE_THREADS,
        holds: Callable[[int], bool] | None = None,
    ) -> Found | None:
        """The longest stored prefix of `prompt` in `scope`, longer than `longer_than` tokens, that
        `restore` put into its sequence; None when none did (see `Restore`). A prefix refused before
        any byte reached llama.cpp (too long for the sequence, say) is followed by the next shorter
        one. `buffer`: where the prefix is assembled (the sequence's own touched, perhaps pinned,
        buffer; a second assembly of one restore gets new memory); `workers`: how many threads a
        restore may use (more where a GPU waits for it, see `threads.wider`); `holds`: whether a
        prefix of so many tokens may be restored (`ReadGrid.holds` of the reading Llama: a prefix
        stored on another's batches is passed over for the next shorter one)."""
        query = prompt
        while len(query) > longer_than:
            loan = None if buffer is None else buffer.loan()
            try:
                with wider(workers):
                    found = self.states.find(
                        query,
                        scope,
                        blocks_alone=self.one_capture,
                        pad_windows=self.pads_windows,
                        longer_than=longer_than,
                        into=loan,
                    )
                if found is None or found.snapshot.key.token_count <= longer_than:
                    return None
                if holds is not None and not holds(found.snapshot.key.token_count):
                    query = prompt.head(found.snapshot.key.token_count - 1)
                    continue
                restored = restore(found)
            finally:
                if loan is not None:
                    loan.release()
            if restored:
                return found
            if restored is None:
                return None
            query = prompt.head(found.snapshot.key.token_count - 1)
        return None

    def plan(
        self,
        tokens: TokenArray,
        *,
        reused: int,
        head: int,
        raw: bool,
        alignment: int,
        grid: ReadGrid | None = None,
    ) -> list[RestorePoint]:
        """The restore points `tokens` should leave behind past the `reused` ones, ascending: its
        head (`checkpoints.head_point`, 0: none) and its end on the `alignment` grid, and on a
        sliding-window model the ladder along a `raw` prompt (not a chat's), each sparing at least
        `min_tokens` over the last one kept. None when this cache does not save."""
        if not self.saves:
            return []
        points = checkpoint_plan(
            tokens,
            ladder=self.ladder if raw else [],
            head=head,
            priority=self.priority,
            after=reused,
            alignment=alignment,
            exact=self.exact,
            grid=grid,
        )
        if self.one_capture:
            return points
        # A window (or a recurrent state) is stored whole: not worth it for a few tokens more, but
        # for the head's points, which every conversation of the chat restores, where the read to
        # them is a piece of a batch long enough (`ReadGrid`: a point placed for the prompt alone
        # may lie a few tokens past the restored one).
        piece = 1 if grid is None else grid.min_piece
        kept, last = [], reused
        for point in points:
            spared = point.n_tokens - last
            if spared >= self.min_tokens or (point.head and spared >= piece):
                kept.append(point)
                last = point.n_tokens
        return kept

    def save(
        self,
        captured: CapturedState,
        scope: str,
        points: Sequence[RestorePoint],
        *,
        blocks_upto: int = 0,
        prompt: PromptTokens | None = None,
    ) -> int:
        """Store `captured` for `points` and its blocks up to `blocks_upto` tokens (see
        `StoredStates.save`); how many points were stored, 0 (logged) when the store fails."""
        try:
            return self.states.save(captured, scope, points, blocks_upto=blocks_upto, prompt=prompt)
        except (SnapcacheError, OSError) as exc:
            _log.warning("could not save the state of %d tokens: %s", len(captured.tokens), exc)
            return 0

    def supersede(
        self,
        point: RestorePoint,
        stored: PromptTokens | TokenArray,
        scope: str,
        previous: Iterable[SnapshotKey | None],
        *,
        head: int,
    ) -> SnapshotKey | None:
        """`point` was stored for the tokens `stored`: when it is a prompt end, the conversation's
        `previous` prompt ends go (only where they start `stored` and lie past the `head` its
        conversations share, see `StoredStates.supersede`), and its own key is returned (what the
        conversation's next turn supersedes); None for a point of another kind."""
        if point.kind != KIND_PROMPT_END:
            return None
        tokens = stored if isinstance(stored, PromptTokens) else PromptTokens.of(stored)
        for old in set(previous) - {None}:
            assert old is not None
            self.states.supersede(old, tokens, point.priority, head=head)
        return tokens.key(self.fingerprint, scope, len(tokens))
