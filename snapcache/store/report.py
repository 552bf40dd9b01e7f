"""What the store reports about itself: StoreStats and the counters behind it, and entry rows
merged across the tiers (StoreEntry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from snapcache.key import SnapshotKey, rolling_hash
from snapcache.snapshot import Snapshot
from snapcache.tier_contract import EntryInfo, TierName

if TYPE_CHECKING:
    from snapcache.store.ram import RamTier


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters since the store opened, and what each tier holds now."""

    hits: int
    misses: int
    ram_hits: int
    disk_hits: int
    ram_misses: int
    disk_misses: int
    ram_used_bytes: int
    disk_used_bytes: int
    ram_budget_bytes: int
    disk_budget_bytes: int
    ram_entries: int
    disk_entries: int
    evictions: int
    ram_evictions: int
    disk_evictions: int
    spills: int
    promotions: int
    dropped: int
    write_errors: int
    pending_write_bytes: int  # snapshots waiting for their disk write that RAM does not hold
    remote_hits: int = 0  # gets, lookups and blocks the remote tier served
    remote_misses: int = 0  # reads the remote tier was asked and could not serve


@dataclass(frozen=True, slots=True)
class StoreEntry(EntryInfo):
    """One stored key; `tiers` names every tier holding it, `tier` the one a get would read first.

    `nbytes` is what the entry costs that first tier. A snapshot still waiting for its disk write is
    reported in RAM.
    """

    tiers: tuple[TierName, ...]


@dataclass(slots=True)
class Counters:
    """What the store counts as it serves; StoreStats adds what the tiers hold."""

    hits: int = 0
    misses: int = 0
    ram_hits: int = 0
    disk_hits: int = 0
    ram_misses: int = 0
    disk_misses: int = 0
    spills: int = 0
    promotions: int = 0
    dropped: int = 0
    write_errors: int = 0
    remote_hits: int = 0
    remote_misses: int = 0


@dataclass(frozen=True, slots=True)
class DiskFigures:
    """What the disk tier holds now, read before the store takes its lock (all 0 without a disk)."""

    used_bytes: int = 0
    budget_bytes: int = 0
    entries: int = 0
    evictions: int = 0


def store_stats(
    counters: Counters, ram: RamTier | None, disk: DiskFigures, pending_write_bytes: int
) -> StoreStats:
    """The counters and what each tier holds, as one StoreStats. Call with the store's lock held."""
    c = counters
    ram_evictions = 0 if ram is None else ram.evictions
    return StoreStats(
        hits=c.hits,
        misses=c.misses,
        ram_hits=c.ram_hits,
        disk_hits=c.disk_hits,
        ram_misses=c.ram_misses,
        disk_misses=c.disk_misses,
        ram_used_bytes=0 if ram is None else ram.used_bytes,
        disk_used_bytes=disk.used_bytes,
        ram_budget_bytes=0 if ram is None else ram.budget_bytes,
        disk_budget_bytes=disk.budget_bytes,
        ram_entries=0 if ram is None else len(ram),
        disk_entries=disk.entries,
        evictions=ram_evictions + disk.evictions,
        ram_evictions=ram_evictions,
        disk_evictions=disk.evictions,
        spills=c.spills,
        promotions=c.promotions,
        dropped=c.dropped,
        write_errors=c.write_errors,
        pending_write_bytes=pending_write_bytes,
        remote_hits=c.remote_hits,
        remote_misses=c.remote_misses,
    )


def memory_row(snapshot: Snapshot) -> EntryInfo:
    """The row of a snapshot held in memory outside the RAM tier (waiting for its disk write)."""
    return EntryInfo(
        key=snapshot.key,
        tier="ram",
        priority=snapshot.priority,
        nbytes=snapshot.nbytes,
        state_bytes=memoryview(snapshot.state).nbytes,
        created_at=snapshot.created_at,
        last_used_at=snapshot.created_at,
        rolling_hash=rolling_hash(snapshot.tokens),
    )


def merge_entries(memory: dict[SnapshotKey, EntryInfo], disk: list[EntryInfo]) -> list[EntryInfo]:
    """One StoreEntry per key: the memory row where memory holds it, naming every tier that does."""
    on_disk = {row.key: row for row in disk}
    result: list[EntryInfo] = []
    for key, row in memory.items():
        tiers: tuple[TierName, ...] = ("ram", "disk") if key in on_disk else ("ram",)
        result.append(_store_entry(row, tiers))
    result.extend(_store_entry(row, ("disk",)) for key, row in on_disk.items() if key not in memory)
    return result


def _store_entry(row: EntryInfo, tiers: tuple[TierName, ...]) -> StoreEntry:
    return StoreEntry(
        key=row.key,
        tier=row.tier,
        priority=row.priority,
        nbytes=row.nbytes,
        state_bytes=row.state_bytes,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        rolling_hash=row.rolling_hash,
        tiers=tiers,
    )
