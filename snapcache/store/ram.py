"""Snapshots in memory under an exact byte budget; evicts lowest priority first, then least recently used."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from snapcache.key import SnapshotKey, rolling_hash, validate_budget
from snapcache.snapshot import Snapshot
from snapcache.tier_contract import EntryInfo, TierName, may_evict

# Rebuild the heap once stale items outnumber live ones by this factor (plus a small floor).
_COMPACT_FACTOR = 2
_COMPACT_FLOOR = 32


@dataclass(slots=True)
class _Entry:
    snapshot: Snapshot
    nbytes: int
    tick: int  # matches the one live heap item of this entry; older items are stale
    last_used_at: float
    rolling_hash: int


class RamTier:
    """A bounded in-memory map from key to snapshot.

    A put may evict only entries of its own priority or lower (`tier.may_evict`); one that would
    need more is refused. Not thread-safe: the store serializes access. `on_evict` is called with
    every snapshot a `put` pushes out to make room (not for replacements or removals), before `put`
    returns.
    """

    name: TierName = "ram"

    def __init__(self, budget_bytes: int, *, on_evict: Callable[[Snapshot], None] | None = None) -> None:
        self._budget = validate_budget("budget_bytes", budget_bytes)
        self._on_evict = on_evict
        self._entries: dict[SnapshotKey, _Entry] = {}
        # (priority, tick, key): the smallest is the next to go. Items whose tick no longer matches
        # their entry are stale and skipped (lazy deletion).
        self._heap: list[tuple[int, int, SnapshotKey]] = []
        self._ticks = itertools.count()
        self._used = 0
        self._evictions = 0
        self._bytes_by_priority: dict[int, int] = {}  # what a put of each priority could evict

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def evictions(self) -> int:
        return self._evictions

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def put(self, snapshot: Snapshot) -> bool:
        """Store `snapshot`, evicting others as needed; False (nothing changed) if it does not fit.

        It does not fit when it exceeds the budget, or when room for it would take evicting an entry
        of higher priority. An older entry under the same key counts as free room.
        """
        nbytes = snapshot.nbytes
        if nbytes > self._budget:
            return False
        key = snapshot.key
        old = self._entries.get(key)
        freed = 0 if old is None else old.nbytes
        excess = self._used - freed + nbytes - self._budget
        if excess > 0 and self._evictable(snapshot.priority, old) < excess:
            return False
        if old is not None:
            self._forget(key)
        while self._used + nbytes > self._budget:
            self._evict_one()
        tick = next(self._ticks)
        self._entries[key] = _Entry(snapshot, nbytes, tick, time.time(), rolling_hash(snapshot.tokens))
        self._used += nbytes
        priority = snapshot.priority
        self._bytes_by_priority[priority] = self._bytes_by_priority.get(priority, 0) + nbytes
        self._push(priority, tick, key)
        return True

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot under `key`, marked as just used; None on a miss."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.tick = next(self._ticks)
        entry.last_used_at = time.time()
        self._push(entry.snapshot.priority, entry.tick, key)
        return entry.snapshot

    def peek(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot under `key` without marking it used."""
        entry = self._entries.get(key)
        return None if entry is None else entry.snapshot

    def remove(self, key: SnapshotKey) -> bool:
        return self._forget(key) is not None

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot held, least valuable first (the order eviction would take them)."""
        live = sorted((e.snapshot.priority, e.tick, k) for k, e in self._entries.items())
        return [self._entries[k].snapshot for _, _, k in live]

    def entries(self) -> list[EntryInfo]:
        return [
            EntryInfo(
                key=key,
                tier="ram",
                priority=entry.snapshot.priority,
                nbytes=entry.nbytes,
                state_bytes=memoryview(entry.snapshot.state).nbytes,
                created_at=entry.snapshot.created_at,
                last_used_at=entry.last_used_at,
                rolling_hash=entry.rolling_hash,
            )
            for key, entry in self._entries.items()
        ]

    def close(self) -> None:
        self._entries.clear()
        self._heap.clear()
        self._bytes_by_priority.clear()
        self._used = 0

    def _evictable(self, priority: int, sparing: _Entry | None) -> int:
        """Bytes a put of `priority` may evict, not counting the entry it replaces."""
        total = sum(nbytes for p, nbytes in self._bytes_by_priority.items() if may_evict(priority, p))
        if sparing is not None and may_evict(priority, sparing.snapshot.priority):
            total -= sparing.nbytes
        return total

    def _forget(self, key: SnapshotKey) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._used -= entry.nbytes
            priority = entry.snapshot.priority
            left = self._bytes_by_priority[priority] - entry.nbytes
            if left:
                self._bytes_by_priority[priority] = left
            else:
                del self._bytes_by_priority[priority]
        return entry

    def _push(self, priority: int, tick: int, key: SnapshotKey) -> None:
        heapq.heappush(self._heap, (priority, tick, key))
        if len(self._heap) > _COMPACT_FACTOR * len(self._entries) + _COMPACT_FLOOR:
            self._heap = [(e.snapshot.priority, e.tick, k) for k, e in self._entries.items()]
            heapq.heapify(self._heap)

    def _evict_one(self) -> None:
        while True:
            _, tick, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is not None and entry.tick == tick:
                break
        self._forget(key)
        self._evictions += 1
        if self._on_evict is not None:
            self._on_evict(entry.snapshot)
