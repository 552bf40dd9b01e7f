"""The store's entry rows: what RAM and the disk hold, filtered and merged (one row per key); and
what the store knows of the disk following each change to it."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.memory import StoreMemory
from snapcache.store.read_tiers import disk_call
from snapcache.store.report import DiskFigures, merge_entries
from snapcache.tier_contract import EntryInfo

if TYPE_CHECKING:
    from snapcache.disk import Change, DiskTier


def local_entries(
    lock: threading.Condition,
    memory: StoreMemory,
    disk: DiskTier | None,
    model_fingerprint: str | None,
    scope: str | None,
    blocks: bool,
) -> list[EntryInfo]:
    """One row per snapshot RAM or the disk holds (with `blocks`, per block too), of one fingerprint
    and/or scope when they are given."""

    def wanted(key: SnapshotKey) -> bool:
        return (
            (blocks or not key.is_block)
            and (model_fingerprint is None or key.model_fingerprint == model_fingerprint)
            and (scope is None or key.user_scope == scope)
        )

    with lock:
        rows = memory.rows(wanted)
    disk_rows: list[EntryInfo] = []
    if disk is not None:
        disk_scope = None if blocks else scope
        found = disk_call("entries", disk.entries, model_fingerprint, disk_scope, default=[])
        disk_rows = [row for row in found if wanted(row.key)]
    return merge_entries(rows, disk_rows)


def follow_disk(
    change: Change, lock: threading.Condition, catalogs: DiskCatalogs, memory: StoreMemory
) -> None:
    """A committed disk transaction of the store's: the catalogs follow it, and RAM keys whose disk
    copy it removed (evicted, replaced) are no longer known to be on disk."""
    catalogs.apply(change)
    if change.removed:
        with lock:
            for row in change.removed:
                with contextlib.suppress(InvalidArgument):  # a row no put could have written
                    memory.off_disk(row.key())


def disk_figures(disk: DiskTier | None) -> DiskFigures:
    """What the disk tier holds now, for stats() (zeros without one, or once closed)."""
    if disk is None:
        return DiskFigures()
    return DiskFigures(disk.used_bytes, disk.budget_bytes, len(disk), disk.evictions)
