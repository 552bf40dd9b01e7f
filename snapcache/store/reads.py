"""Finding a snapshot across the tiers, walked in order behind one contract (`store.read_tiers`):
memory, then the disk (whose hits are promoted into RAM), then the remote tier if any (whose hits
are copied into the local tiers).

Exact gets, longest-prefix lookups and the reads of shared blocks, with the hits and misses each
counts. Arguments arrive checked (the store's façade checks them).

The longest prefix is looked for across every tier at once: a longer prefix in Redis beats a shorter
one on disk. Its cost per lookup is bounded: the remote catalog of the prompt's fingerprint and scope
is read at most once (one HVALS, then reused for `REMOTE_CATALOG_TTL_S` seconds), and at most
`_MAX_REMOTE_TRIES` candidates are fetched from Redis (one round trip each) before the lookup gives
up on the remote tier. A record's blocks missing locally come from Redis in one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from snapcache.key import SnapshotKey, TokenArray, rolling_prefix_hashes
from snapcache.snapshot import Snapshot
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.deferred_uses import DeferredUses
from snapcache.store.memory import StoreMemory
from snapcache.store.prefix_index import iter_prefix_matches
from snapcache.store.read_tiers import (
    REMOTE_CATALOG_TTL_S,
    Copy,
    DiskReads,
    MemoryReads,
    ReadTier,
    RemoteReads,
    disk_call,
)
from snapcache.store.report import Counters
from snapcache.tier_contract import TierName

if TYPE_CHECKING:
    from snapcache.disk import DiskTier
    from snapcache.remote import RemoteTier

__all__ = ["REMOTE_CATALOG_TTL_S", "TierReads", "disk_call"]

# Remote candidates a longest-prefix lookup reads at most, longest first, before it gives up: each
# that fails verification (or was evicted meanwhile) costs a round trip.
_MAX_REMOTE_TRIES = 3


class TierReads:
    """The store's reads: the tiers walked fastest first (see the module docstring)."""

    def __init__(
        self,
        lock: threading.Condition,
        memory: StoreMemory,
        disk: DiskTier | None,
        catalogs: DiskCatalogs,
        counters: Counters,
        *,
        remote: RemoteTier | None = None,
        copy_in: Callable[[Snapshot], None] | None = None,
        uses: DeferredUses | None = None,
    ) -> None:
        self._lock = lock
        self._memory = memory
        self._disk = disk
        self._counters = counters
        self._uses = uses  # of disk entries (None without a disk tier), recorded off the read's path
        self._tiers: list[ReadTier] = [MemoryReads(lock, memory)]
        if disk is not None:
            self._tiers.append(DiskReads(lock, memory, disk, catalogs, uses))
        if remote is not None:
            self._tiers.append(RemoteReads(remote, copy_in))

    @property
    def tiers(self) -> list[ReadTier]:
        """The tiers, in the order they are asked."""
        return list(self._tiers)

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot under exactly `key`, from the first tier that holds it; counted."""
        epoch = self._epoch()
        for i, tier in enumerate(self._tiers):
            snapshot = tier.read(key, epoch)
            if snapshot is not None:
                self._count(served_by=i)
                return snapshot
        self._count(served_by=None)
        return None

    def longest_prefix(
        self, model_fingerprint: str, scope: str, query: TokenArray
    ) -> tuple[Snapshot, TierName] | None:
        """The snapshot of the longest prefix of `query` any tier holds, and the tier that served it.

        A candidate is read from the fastest tier whose catalog offers it; one that fails to read
        there is tried in the slower ones, then the next longest candidate."""
        indexes = [tier.index(model_fingerprint, scope) for tier in self._tiers]
        hashes = rolling_prefix_hashes(query)
        tried: set[SnapshotKey] = set()
        remote_tries = 0
        while True:
            with self._lock:
                live = [
                    index
                    for tier, index in zip(self._tiers, indexes, strict=True)
                    if tier.name != "remote" or remote_tries < _MAX_REMOTE_TRIES
                ]
                key = next(
                    (
                        candidate
                        for candidate in iter_prefix_matches(live, model_fingerprint, scope, query, hashes)
                        if candidate not in tried
                    ),
                    None,
                )
                epoch = self._memory.remove_epoch
            if key is None:
                break
            tried.add(key)
            for i, (tier, index) in enumerate(zip(self._tiers, indexes, strict=True)):
                with self._lock:
                    offered = key in index
                if not offered:
                    continue
                if tier.name == "remote":
                    if remote_tries >= _MAX_REMOTE_TRIES:
                        continue
                    remote_tries += 1
                snapshot = tier.read(key, epoch)
                if snapshot is not None:
                    self._count(served_by=i)
                    return snapshot, tier.name
                if isinstance(tier, RemoteReads):
                    tier.forget(key)
        self._count(served_by=None)
        return None

    def get_blocks(self, keys: Sequence[SnapshotKey]) -> list[tuple[Snapshot, TierName]]:
        """The blocks of `keys` up to the first that no tier holds, each with its tier: promoted like
        a get but neither counted nor touched. Each tier reads the blocks it is asked for at once."""
        found = self._read_blocks(keys, None)
        blocks: list[tuple[Snapshot, TierName]] = []
        for result, tier in found:
            if not isinstance(result, Snapshot):
                break
            blocks.append((result, tier))
        return blocks

    def copy_blocks(
        self, keys: Sequence[SnapshotKey], copy: Copy, keep: Copy | None = None
    ) -> list[TierName]:
        """Hand the state of each block of `keys` to `copy(i, state)` (or `keep`), up to the first
        that no tier holds; return the tiers that served them. See `SnapshotStore.copy_blocks`."""
        served: list[TierName] = []
        for result, tier in self._read_blocks(keys, copy, keep):
            if result is False:
                break
            served.append(tier)
        if served:
            self.touch_blocks(list(keys[: len(served)]))
        return served

    def _read_blocks(
        self, keys: Sequence[SnapshotKey], copy: Copy | None, keep: Copy | None = None
    ) -> list[tuple[object, TierName]]:
        """What each tier in turn served of the blocks the faster ones lacked, in the order of `keys`
        (False, with the last tier's name, where none held the block)."""
        found: list[tuple[object, TierName]] = [(False, "ram")] * len(keys)
        wanted = list(range(len(keys)))
        epoch = self._epoch()
        for tier in self._tiers:
            if not wanted:
                break
            positions = wanted

            results = tier.read_blocks(
                [keys[i] for i in positions], epoch, _at(copy, positions), _at(keep, positions)
            )
            results += [False] * (len(positions) - len(results))
            for i, result in zip(positions, results, strict=True):
                found[i] = (result, tier.name)
            wanted = [i for i, result in zip(positions, results, strict=True) if result is False]
        return found

    def peek(self, key: SnapshotKey) -> Snapshot | None:
        """What memory holds under `key`, without marking it as used or counting."""
        with self._lock:
            return self._memory.peek(key)

    def held_priority(self, key: SnapshotKey) -> int | None:
        """The priority stored under `key`, read from memory or the disk's index alone."""
        snapshot = self.peek(key)
        if snapshot is not None:
            return snapshot.priority
        if self._disk is None:
            return None
        priority: int | None = disk_call("read the index", self._disk.held_priority, key, default=None)
        return priority

    def stored_tokens(self, key: SnapshotKey) -> TokenArray | None:
        """The tokens stored under `key`, without loading its state."""
        snapshot = self.peek(key)
        if snapshot is not None:
            return snapshot.tokens
        if self._disk is None:
            return None
        found: TokenArray | None = disk_call("read tokens", self._disk.stored_tokens, key, default=None)
        return found

    def touch_blocks(self, keys: list[SnapshotKey]) -> None:
        """Record a use of `keys`, the first as the most recent, in RAM and on disk."""
        ram = self._memory.ram
        if ram is not None:
            with self._lock:
                for key in reversed(keys):
                    ram.get(key)  # in RAM too, the first becomes the most recently used
        if self._uses is not None:
            self._uses.add(keys)

    def _epoch(self) -> int:
        with self._lock:
            return self._memory.remove_epoch

    def _count(self, *, served_by: int | None) -> None:
        """A read served by the tier at `served_by` (None: by none): a hit there, a miss in each
        tier asked before it."""
        with self._lock:
            if served_by is None:
                self._counters.misses += 1
            else:
                self._counters.hits += 1
            asked = self._tiers if served_by is None else self._tiers[: served_by + 1]
            for i, tier in enumerate(asked):
                tier.count(self._counters, hit=i == served_by)


def _at(hand_over: Copy | None, positions: list[int]) -> Copy | None:
    """`hand_over` for a tier asked for the blocks at `positions` of the keys: its block j is
    handed over as the keys' `positions[j]`."""
    if hand_over is None:
        return None
    return lambda j, state: hand_over(positions[j], state)
