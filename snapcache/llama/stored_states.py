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

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from snapcache.errors import SnapcacheError
from snapcache.key import BLOCK_TOKENS, SnapshotKey, TokenArray, block_keys
from snapcache.llama.blocks import Assembly, Record, is_record, pads_window, read_record, split_state
from snapcache.llama.reports import Source
from snapcache.llama.state import CapturedState
from snapcache.prompt_tokens import PromptTokens
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore
from snapcache.tier import TierName, slowest

__all__ = ["Found", "RestorePoint", "StoredStates"]

_log = logging.getLogger("snapcache")

# Records tried, longest first, before a lookup gives up on the ones whose blocks fail to read.
_RECORD_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class RestorePoint:
    """Where a saved capture can be restored: after `n_tokens`, at `priority`, of a record `kind`."""

    n_tokens: int
    priority: int
    kind: int


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
        than computed again.
        """
        prompt = PromptTokens.of(captured.tokens) if prompt is None else prompt.extended(captured.tokens)
        tokens, n = prompt.array, len(prompt)
        points = [p for p in points if 0 < p.n_tokens <= n]
        split = split_state(captured.state)
        if split is None or n < BLOCK_TOKENS:
            whole = [p for p in points if p.n_tokens == n]
            for point in whole:
                key = prompt.key(self.fingerprint, scope)
                self._store.put(key, tokens, captured.state, point.priority, captured.logits)
            return len(whole)
        points = [p for p in points if p.n_tokens >= BLOCK_TOKENS]
        if split.windows:
            points = [p for p in points if p.n_tokens == n]  # window caches hold only their own point
        n_blocks = max([p.n_tokens for p in points] + [min(blocks_upto, n)]) // BLOCK_TOKENS
        # The keys of these very slices: a put checks each key against its slice without a hash.
        keys = prompt.block_keys(self.fingerprint, scope, n_blocks)
        missing = []
        for i, key in enumerate(keys):
            needed = [p.priority for p in points if p.n_tokens >= (i + 1) * BLOCK_TOKENS]
            priority = max(needed) if needed else min((p.priority for p in points), default=0)
            held = self._store.held_priority(key)
            if held is None or held < priority:
                missing.append((key, prompt.block(i), split.block(i), priority))
        self._store.put_many(missing)  # queued together: one pack file for many blocks
        for point in points:
            prefix = prompt.prefix(point.n_tokens)
            key = prompt.key(self.fingerprint, scope, point.n_tokens)
            logits = captured.logits if point.n_tokens == n else None
            self._store.put(key, prefix, split.record(point.n_tokens, point.kind), point.priority, logits)
        return len(points)

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

    def supersede(self, old: SnapshotKey, new_tokens: TokenArray | PromptTokens, priority: int) -> bool:
        """Remove the prompt-end record `old` now that a later turn of the same conversation stored
        one after `new_tokens`: only when its tokens start them and its priority is at most `priority`.
        A store that fails meanwhile keeps `old` (False): the previous turn stays restorable."""
        if old.token_count >= len(new_tokens):
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
    ) -> Found | None:
        """The longest prefix of `tokens` this store can restore, assembled; None on a miss.

        `blocks_alone`: whether a run of blocks without a record may serve (a model with one cache).
        Blocks never cover the prompt's last token, which a completion must read itself.
        `pad_windows`: assemble a sliding-window cache padded (see `blocks.assemble`).
        `longer_than`: a prefix of at most this many tokens is a miss, and is never assembled (the
        caller holds one that long already).
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
            best = self._from_record(snapshot, tier, pad_windows, prompt)
            if best is not None or snapshot.key.token_count <= 1:
                break
            query = prompt.prefix(snapshot.key.token_count - 1)
        if blocks_alone:
            limit = (len(prompt) - 1) // BLOCK_TOKENS
            longest = max(longer_than, 0 if best is None else best.snapshot.key.token_count)
            if limit * BLOCK_TOKENS > longest:
                try:
                    from_blocks = self._from_blocks(prompt, scope, limit, longest)
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
        state, served = self._assemble(keys, record, padded)
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

    def _from_blocks(self, prompt: PromptTokens, scope: str, limit: int, longer_than: int) -> Found | None:
        keys = prompt.block_keys(self.fingerprint, scope, limit)
        run = 0
        for key in keys:
            if self._store.held_priority(key) is None:
                break
            run += 1
        if run * BLOCK_TOKENS <= longer_than:
            return None
        state, served = self._assemble(keys[:run], None)
        if state is None and 0 < len(served) < run and len(served) * BLOCK_TOKENS > longer_than:
            # A block failed to read: the run before it, in a blob of its own size.
            run = len(served)
            state, served = self._assemble(keys[:run], None)
        if state is None:
            return None
        prefix = prompt.prefix(run * BLOCK_TOKENS)
        key = prompt.key(self.fingerprint, scope, run * BLOCK_TOKENS)
        return Found(Snapshot(key, prefix, state), slowest(served, "ram"), None, None)

    def _assemble(
        self, keys: Sequence[SnapshotKey], record: Record | None, pad_window: bool = False
    ) -> tuple[memoryview | None, list[TierName]]:
        """The blob of the blocks of `keys` and `record`, each copied in as the store hands it over,
        and the tiers that served the blocks. The blob is None unless every block was served (the
        tiers then say how many were), or when the store fails or the pieces do not fit together."""
        try:
            assembly = Assembly(len(keys), record, pad_window=pad_window)
            served = self._store.copy_blocks(keys, assembly.place)
            if len(served) < len(keys):
                return None, served
            return assembly.finish(), served
        except ValueError as exc:
            _log.warning("stored blocks do not fit together, not restored: %s", exc)
            return None, []
        except (SnapcacheError, OSError) as exc:
            _log.warning("block lookup failed: %s", exc)
            return None, []
