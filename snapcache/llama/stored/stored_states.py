"""States in the store as shared 64-token blocks plus one small record per restore point.

Saving a capture stores the blocks of its first cache that the store does not hold yet (or holds at
a lower priority), then a record per restore point (see `blocks`). A capture whose layout cannot be
cut (recurrent and hybrid models) is stored whole, as one snapshot. Finding the longest prefix of a
prompt takes the longer of:

- the longest stored record (or whole snapshot) whose tokens start the prompt, with all its blocks;
- on a model with one cache (no sliding window), the longest run of stored blocks along the
  prompt's own tokens: any 64-aligned prefix of any stored prompt.

Blocks are marked as used from the last to the first, so that the first blocks of a prompt, which
every longer prefix needs, are the last to be evicted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from snapcache.errors import SnapcacheError
from snapcache.key import BLOCK_TOKENS, SnapshotKey, TokenArray, block_keys
from snapcache.llama.state.assembly import Assembly, Lender
from snapcache.llama.state.blocks import (
    Record,
    SplitState,
    is_record,
    pads_window,
    read_record,
    split_state,
)
from snapcache.llama.state.sequences import CapturedState
from snapcache.llama.stored.checkpoints import RestorePoint
from snapcache.llama.stored.reports import Source
from snapcache.prompt_tokens import PromptTokens
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore
from snapcache.tier_contract import TierName, slowest

__all__ = ["Found", "RestorePoint", "StoredStates"]

_log = logging.getLogger("snapcache")

# Records tried, longest first, before a lookup gives up on the ones whose blocks fail to read.
_RECORD_ATTEMPTS = 4


Logits = npt.NDArray[np.float32] | None


@dataclass(frozen=True, slots=True)
class _BlockPut:
    """A block a save stores unless the store holds it already (at `priority` or higher)."""

    index: int
    key: SnapshotKey
    tokens: TokenArray
    priority: int


@dataclass(frozen=True, slots=True)
class _RecordPut:
    """The record a save stores for one restore point."""

    point: RestorePoint
    key: SnapshotKey
    tokens: TokenArray
    logits: Logits


def _releasing(job: Callable[[], None], captured: CapturedState) -> None:
    """`job`, then the capture's buffer given back (see `CapturedState.release`), whatever happens."""
    try:
        job()
    finally:
        if captured.release is not None:
            captured.release()


@dataclass(frozen=True, slots=True)
class Found:
    """A prefix ready to restore: the assembled snapshot, the tier that served it, and the record
    it came from (None for blocks alone or a whole snapshot) and that record's kind;
    `window_padded` when its sliding-window cache was assembled padded (see `_state_layout.pad_window`)."""

    snapshot: Snapshot
    source: Source
    record_key: SnapshotKey | None
    kind: int | None
    window_padded: bool = False


class StoredStates:
    """Saves captures into one store under one fingerprint, and finds and assembles prefixes."""

    def __init__(self, store: SnapshotStore, fingerprint: str) -> None:
        self._store = store
        self.fingerprint = fingerprint

    # -- saving -------------------------------------------------------------------------------------

    def save(
        self,
        captured: CapturedState,
        scope: str,
        points: Sequence[RestorePoint],
        *,
        blocks_upto: int = 0,
        prompt: PromptTokens | None = None,
    ) -> int:
        """Store `captured` for each restore point (at most its length) and its blocks up to
        `blocks_upto` tokens at least; return how many points were stored.

        A capture that cannot be cut is stored whole, for the point at its own length only; so is
        one of fewer tokens than a block. A point before the first block's end is not stored: a
        record needs a block, and the state of those tokens alone was never captured. `prompt`:
        tokens the capture's tokens start with (or are), whose hashes and keys are taken rather
        than computed again. The blocks are copied out and put off the caller's path (see
        `SnapshotStore.defer`: the store answers as if they were stored already), then
        `captured.release` is called, if set.
        """
        try:
            count, job = self._save_job(captured, scope, points, blocks_upto, prompt)
            self._store.defer(functools.partial(_releasing, job, captured))
        except BaseException:
            if captured.release is not None:
                captured.release()
            raise
        return count

    def _save_job(
        self,
        captured: CapturedState,
        scope: str,
        points: Sequence[RestorePoint],
        blocks_upto: int,
        prompt: PromptTokens | None,
    ) -> tuple[int, Callable[[], None]]:
        """How many points `save` stores, and the job that stores them. The keys are made here, on
        the caller's thread, which owns `prompt`; the job copies and puts."""
        prompt = PromptTokens.of(captured.tokens) if prompt is None else prompt.extended(captured.tokens)
        tokens, n = prompt.array, len(prompt)
        points = [p for p in points if 0 < p.n_tokens <= n]
        split = split_state(captured.state)
        if split is None or n < BLOCK_TOKENS:
            whole = [p for p in points if p.n_tokens == n]
            key = prompt.key(self.fingerprint, scope)
            puts = [(key, tokens, captured.state, p.priority, captured.logits) for p in whole]
            return len(whole), functools.partial(self._put_whole, puts)
        points = [p for p in points if p.n_tokens >= BLOCK_TOKENS]
        if split.windows:
            points = [p for p in points if p.n_tokens == n]  # window caches hold only their own point
        n_blocks = max([p.n_tokens for p in points] + [min(blocks_upto, n)]) // BLOCK_TOKENS
        # The keys of these very slices: a put checks each key against its slice without a hash.
        keys = prompt.block_keys(self.fingerprint, scope, n_blocks)
        blocks = []
        for i, key in enumerate(keys):
            needed = [p.priority for p in points if p.n_tokens >= (i + 1) * BLOCK_TOKENS]
            priority = max(needed) if needed else min((p.priority for p in points), default=0)
            blocks.append(_BlockPut(i, key, prompt.block(i), priority))
        records = [
            _RecordPut(
                point,
                prompt.key(self.fingerprint, scope, point.n_tokens),
                prompt.prefix(point.n_tokens),
                captured.logits if point.n_tokens == n else None,
            )
            for point in points
        ]
        return len(points), functools.partial(self._put_split, split, blocks, records)

    def _put_whole(self, puts: list[tuple[SnapshotKey, TokenArray, memoryview, int, Logits]]) -> None:
        for key, tokens, state, priority, logits in puts:
            self._store.put(key, tokens, state, priority, logits)

    def _put_split(self, split: SplitState, blocks: list[_BlockPut], records: list[_RecordPut]) -> None:
        """The blocks the store does not hold yet (or holds at a lower priority), then the records:
        each copied once out of the capture into a buffer the store keeps as it is."""
        missing = []
        for block in blocks:
            held = self._store.held_priority(block.key)
            if held is None or held < block.priority:
                missing.append((block.key, block.tokens, split.block(block.index), block.priority))
        self._store.put_many(missing, owned=True)  # queued together: one pack file for many blocks
        for record in records:
            point = record.point
            state = split.record(point.n_tokens, point.kind)
            self._store.put(record.key, record.tokens, state, point.priority, record.logits)

    def raise_priority(self, key: SnapshotKey, priority: int, prompt: PromptTokens | None = None) -> None:
        """Store the record (or whole state) under `key` and every block it needs at `priority`.
        `prompt`: tokens that start with the key's (their block keys are reused)."""
        snapshot = self._store.get(key)
        if snapshot is None:
            return
        if is_record(snapshot.state):
            record = read_record(snapshot.state)
            keys = self._block_keys(snapshot, record.n_blocks, prompt)
            for block_key in keys:
                found = self._store.get_block(block_key)
                if found is not None and found[0].priority < priority:
                    block = found[0]
                    self._store.put(block_key, block.tokens, block.state, priority)
        self._store.put(key, snapshot.tokens, snapshot.state, priority, snapshot.logits)

    def supersede(
        self, old: SnapshotKey, new_tokens: TokenArray | PromptTokens, priority: int, *, head: int = 0
    ) -> bool:
        """Remove the prompt-end record `old` now that a later turn of the same conversation stored
        one after `new_tokens`: only when its tokens start them, lie past the `head` every
        conversation like it shares (a prompt end there is that head too, whoever stored it) and its
        priority is at most `priority`. A store that fails meanwhile keeps `old` (False): the
        previous turn stays restorable."""
        if old.token_count <= head or old.token_count >= len(new_tokens):
            return False
        if PromptTokens.of(new_tokens).key(self.fingerprint, old.scope, old.token_count) != old:
            return False
        try:
            held = self._store.held_priority(old)
            return held is not None and held <= priority and self._store.remove(old)
        except (SnapcacheError, OSError) as exc:
            _log.debug("could not remove the previous turn's state: %s", exc)
            return False

    # -- finding ------------------------------------------------------------------------------------

    def complete(self, key: SnapshotKey, prompt: PromptTokens | None = None) -> Snapshot | None:
        """The snapshot under `key`, assembled from its record and blocks (or stored whole); None when
        absent or when a block it needs is missing. `prompt`: tokens that start with the key's
        (their block keys are reused)."""
        snapshot = self._store.get(key)
        if snapshot is None:
            return None
        found = self._from_record(snapshot, "ram", prompt=prompt)
        return None if found is None else found.snapshot

    def find(
        self,
        tokens: TokenArray | PromptTokens,
        scope: str,
        *,
        blocks_alone: bool,
        pad_windows: bool = False,
        longer_than: int = 0,
        into: Lender | None = None,
    ) -> Found | None:
        """The longest prefix of `tokens` this store can restore, assembled; None on a miss.

        `blocks_alone`: whether a run of blocks without a record may serve (a model with one cache).
        Blocks never cover the prompt's last token, which a completion must read itself.
        `pad_windows`: assemble a sliding-window cache padded (see `assembly.assemble`).
        `longer_than`: a prefix of at most this many tokens is a miss, and is never assembled (the
        caller holds one that long already). `into`: lends the memory to assemble in (see `Assembly`).
        """
        prompt = PromptTokens.of(tokens)
        best: Found | None = None
        query = prompt.array
        for _attempt in range(_RECORD_ATTEMPTS):  # a record whose blocks fail: a shorter one next
            try:
                found = self._store.lookup_with_tier(self.fingerprint, scope, query)
            except (SnapcacheError, OSError) as exc:
                _log.warning("snapshot lookup failed, reading the prompt in full: %s", exc)
                found = None
            if found is None or found[0].key.token_count <= longer_than:
                break
            snapshot, tier = found
            prompt.learn(snapshot.key, snapshot.tokens)  # the store hashed that prefix already
            # The store confirmed its tokens start the prompt: the prompt's block keys are theirs.
            best = self._from_record(snapshot, tier, pad_windows, prompt, into)
            if best is not None or snapshot.key.token_count <= 1:
                break
            query = prompt.prefix(snapshot.key.token_count - 1)
        if blocks_alone:
            limit = (len(prompt) - 1) // BLOCK_TOKENS
            longest = max(longer_than, 0 if best is None else best.snapshot.key.token_count)
            if limit * BLOCK_TOKENS > longest:
                try:
                    from_blocks = self._from_blocks(prompt, scope, limit, longest, into)
                except (SnapcacheError, OSError) as exc:
                    _log.warning("block lookup failed: %s", exc)
                    from_blocks = None
                if from_blocks is not None:
                    best = from_blocks
        return best

    def _from_record(
        self,
        snapshot: Snapshot,
        tier: TierName,
        pad_windows: bool = False,
        prompt: PromptTokens | None = None,
        into: Lender | None = None,
    ) -> Found | None:
        if not is_record(snapshot.state):
            return Found(snapshot, tier, None, None)  # a whole state
        try:
            record = read_record(snapshot.state)
            if record.n_tokens != snapshot.key.token_count:
                raise ValueError(f"it holds {record.n_tokens} tokens, its key {snapshot.key.token_count}")
        except ValueError as exc:
            _log.warning("record %s is malformed, ignored: %s", snapshot.key.id[:12], exc)
            return None
        keys = self._block_keys(snapshot, record.n_blocks, prompt)
        padded = pad_windows and pads_window(record)
        state, served = self._assemble(keys, record, padded, into)
        if state is None:
            if len(served) < record.n_blocks:
                _log.debug("record %s lacks some of its %d blocks", snapshot.key.id[:12], record.n_blocks)
            return None
        source: Source = slowest([*served, tier], tier)  # the record's tier, or a slower block's
        restored = Snapshot(snapshot.key, snapshot.tokens, state, snapshot.logits, snapshot.priority)
        return Found(restored, source, snapshot.key, record.kind, padded)

    def _block_keys(
        self, snapshot: Snapshot, n_blocks: int, prompt: PromptTokens | None
    ) -> list[SnapshotKey]:
        """The keys of the first `n_blocks` blocks of `snapshot`; from `prompt` when given (its tokens
        start with the snapshot's)."""
        if prompt is not None and len(prompt) >= snapshot.key.token_count:
            return prompt.block_keys(self.fingerprint, snapshot.key.scope, n_blocks)
        return block_keys(self.fingerprint, snapshot.key.scope, snapshot.tokens, n_blocks)

    def _from_blocks(
        self, prompt: PromptTokens, scope: str, limit: int, longer_than: int, into: Lender | None
    ) -> Found | None:
        keys = prompt.block_keys(self.fingerprint, scope, limit)
        run = 0
        for key in keys:
            if self._store.held_priority(key) is None:
                break
            run += 1
        if run * BLOCK_TOKENS <= longer_than:
            return None
        state, served = self._assemble(keys[:run], None, into=into)
        if state is None and 0 < len(served) < run and len(served) * BLOCK_TOKENS > longer_than:
            # A block failed to read: the run before it, in a blob of its own size.
            run = len(served)
            state, served = self._assemble(keys[:run], None, into=into)
        if state is None:
            return None
        prefix = prompt.prefix(run * BLOCK_TOKENS)
        key = prompt.key(self.fingerprint, scope, run * BLOCK_TOKENS)
        return Found(Snapshot(key, prefix, state), slowest(served, "ram"), None, None)

    def _assemble(
        self,
        keys: Sequence[SnapshotKey],
        record: Record | None,
        pad_window: bool = False,
        into: Lender | None = None,
    ) -> tuple[memoryview | None, list[TierName]]:
        """The blob of the blocks of `keys` and `record`, each copied in as the store hands it over,
        and the tiers that served the blocks. The blob is None unless every block was served (the
        tiers then say how many were), or when the store fails or the pieces do not fit together."""
        try:
            assembly = Assembly(len(keys), record, pad_window=pad_window, into=into)
            served = self._store.copy_blocks(keys, assembly.place, keep=assembly.keep)
            if len(served) < len(keys):
                return None, served
            return assembly.finish(), served
        except ValueError as exc:
            _log.warning("stored blocks do not fit together, not restored: %s", exc)
            return None, []
        except (SnapcacheError, OSError) as exc:
            _log.warning("block lookup failed: %s", exc)
            return None, []
