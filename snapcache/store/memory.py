"""What the store holds in memory, and on what terms: RAM admission by priority, and what an eviction becomes.

A put or a disk hit enters the RAM tier only where it fits without evicting a higher priority. What
RAM evicts is queued for the disk as a spill, or simply let go when the disk holds it already.
Snapshots waiting for their disk write stay in memory until written; one prefix index covers them
and the RAM tier's keys. Guarded by the store's lock: every method expects the caller to hold it.
"""

from __future__ import annotations

from collections.abc import Callable

from snapcache.key import SnapshotKey, rolling_hash
from snapcache.snapshot import Snapshot
from snapcache.store.prefix_index import PrefixIndex
from snapcache.store.ram import RamTier
from snapcache.store.report import Counters, memory_row
from snapcache.store.write_behind import PendingWrite, WriteBehind
from snapcache.tier_contract import EntryInfo


class StoreMemory:
    """The RAM tier, the write-behind queue and the prefix index over both, kept in step.

    `closed()` tells whether the store's close() began: from then on no disk hit is promoted.
    """

    def __init__(self, ram_bytes: int, counters: Counters, closed: Callable[[], bool]) -> None:
        self._evicted: list[Snapshot] = []
        self.ram = RamTier(ram_bytes, on_evict=self._evicted.append) if ram_bytes else None
        self.writes: WriteBehind | None = None
        # Keys held in RAM or waiting for their disk write; the disk keeps its own catalog.
        self.index = PrefixIndex()
        # RAM keys whose snapshot this store knows the disk to hold: evicting them writes nothing.
        self._on_disk: set[SnapshotKey] = set()
        # Moved by every remove(): a disk read begun before it must not promote what it removed.
        self.remove_epoch = 0
        self._counters = counters
        self._closed = closed

    def attach_writes(self, writes: WriteBehind) -> None:
        """The queue of disk writes (it calls `settle_write` and `holds`, so it is made after this)."""
        self.writes = writes

    def admit(self, snapshot: Snapshot, *, queue_write: bool = True) -> bool:
        """A put: RAM takes `snapshot` if it fits by priority, the disk write is queued (with
        `queue_write=False`, left for `writes.queue_together`). True if in RAM."""
        ram, writes, key = self.ram, self.writes, snapshot.key
        in_ram = False
        self._on_disk.discard(key)  # whatever the disk holds under this key is older
        if ram is not None:
            in_ram = ram.put(snapshot)
            if not in_ram:
                ram.remove(key)  # an older state under the same key must not outlive this one
        if key.is_block:
            pass  # found by exact key only, never by prefix
        elif in_ram or writes is not None:
            self.index.add(key, rolling_hash(snapshot.tokens))
        else:
            self.index.remove(key)
        if writes is not None:
            writes.add(snapshot, spill=False, queue_now=queue_write)
        self._spill_evicted()
        return in_ram

    def refusal(self, snapshot: Snapshot) -> str:
        """Why RAM refused `snapshot`, for a store without a disk tier to keep it instead."""
        assert self.ram is not None
        too_large = snapshot.nbytes > self.ram.budget_bytes
        why = "larger than the RAM budget" if too_large else "no room without evicting a higher priority"
        return f"{why} and there is no disk tier"

    def promote(self, snapshot: Snapshot, epoch: int) -> None:
        """Copy a disk hit into RAM.

        Never once close() began (its final write-out would miss what the promotion evicts), nor
        after a remove() since the read began (the promotion would undo it).
        """
        ram, key = self.ram, snapshot.key
        if ram is None or self._closed() or epoch != self.remove_epoch or key in ram:
            return
        if ram.put(snapshot):
            self._counters.promotions += 1
            if not key.is_block:
                self.index.add(key, rolling_hash(snapshot.tokens))
            self._on_disk.add(key)
        self._spill_evicted()

    def peek(self, key: SnapshotKey) -> Snapshot | None:
        """What RAM or the write queue holds under `key`, without marking it as used."""
        snapshot = None if self.ram is None else self.ram.peek(key)
        if snapshot is None and self.writes is not None:
            snapshot = self.writes.get(key)
        return snapshot

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """What RAM or the write queue holds under `key`, marked in RAM as the most recently used."""
        snapshot = None if self.ram is None else self.ram.get(key)
        if snapshot is None and self.writes is not None:
            snapshot = self.writes.get(key)
        return snapshot

    def forget(self, key: SnapshotKey) -> bool:
        """A remove(): drop `key` from RAM and the write queue; True if either held it."""
        found = self.ram is not None and self.ram.remove(key)
        if self.writes is not None and self.writes.discard(key):
            found = True
        self._on_disk.discard(key)
        self.index.remove(key)
        self.remove_epoch += 1
        return found

    def off_disk(self, key: SnapshotKey) -> None:
        """The disk no longer holds this store's copy of `key` (evicted, replaced)."""
        self._on_disk.discard(key)

    def rows(self, wanted: Callable[[SnapshotKey], bool]) -> dict[SnapshotKey, EntryInfo]:
        """The rows of what memory holds, RAM's first, of the keys `wanted` accepts."""
        rows: dict[SnapshotKey, EntryInfo] = {}
        if self.ram is not None:
            rows.update((row.key, row) for row in self.ram.entries() if wanted(row.key))
        if self.writes is not None:
            for snapshot in self.writes.snapshots():
                if snapshot.key not in rows and wanted(snapshot.key):
                    rows[snapshot.key] = memory_row(snapshot)
        return rows

    # -- the write queue's callbacks ----------------------------------------------------------------

    def holds(self, job: PendingWrite) -> bool:
        """Whether RAM holds the very snapshot `job` writes."""
        return self.ram is not None and self.ram.peek(job.snapshot.key) is job.snapshot

    def settle_write(self, job: PendingWrite, stored: bool, current: bool) -> None:
        """A queued write is done."""
        key = job.snapshot.key
        if stored and job.spill:
            self._counters.spills += 1
        if not current:
            return  # a newer snapshot under the key waits for its own write
        if self.holds(job):
            if stored:
                self._on_disk.add(key)
            return
        if self.ram is None or key not in self.ram:
            self.index.remove(key)
            if not stored:
                self._counters.dropped += 1

    def _spill_evicted(self) -> None:
        """Spill what the RAM tier just evicted, unless the disk holds it already."""
        evicted = self._evicted[:]
        self._evicted.clear()
        writes = self.writes
        for snapshot in evicted:
            key = snapshot.key
            if writes is None:
                self.index.remove(key)
            elif writes.mark_spill(key):
                continue  # its write is still queued: that write is now the spill
            elif key in self._on_disk:
                self._on_disk.discard(key)
                self.index.remove(key)  # the disk's catalog serves it from now on
            else:
                writes.add(snapshot, spill=True)
