"""How the store's snapshots reach its disk tier: each write logged and counted when it fails.

The write-behind queue calls `write` for every snapshot it writes and `undo` when a remove() overtook
a write; close() calls `write_out` to leave what RAM holds on disk. None of them raises for a disk
that fails: the store keeps serving from RAM.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.reads import disk_call
from snapcache.store.report import Counters

if TYPE_CHECKING:
    from snapcache.disk import DiskTier

log = logging.getLogger("snapcache")


class DiskWrites:
    """The store's writes to `disk`; `counters.write_errors` counts the failed ones."""

    def __init__(
        self, lock: threading.Condition, disk: DiskTier, catalogs: DiskCatalogs, counters: Counters
    ) -> None:
        self._lock = lock
        self._disk = disk
        self._catalogs = catalogs
        self._counters = counters

    def write(self, snapshots: list[Snapshot]) -> list[bool]:
        """disk.put_many with failures logged and counted; whether the disk kept each."""
        try:
            stored = self._disk.put_many(snapshots)
        except (StoreUnavailable, OSError) as exc:
            # Those written before the failure stay on disk; each of the others is a failed write.
            stored = [disk_call("contains", self._disk.__contains__, s.key, default=False) for s in snapshots]
            log.warning("snapcache: could not write %d snapshot(s) to disk: %s", stored.count(False), exc)
            with self._lock:
                self._counters.write_errors += stored.count(False)
            return stored
        for snapshot, kept in zip(snapshots, stored, strict=True):
            if not kept:
                log.warning(
                    "snapcache: snapshot %s (%d bytes, priority %d) not kept on disk: larger than the "
                    "disk budget, or no room without evicting a higher priority",
                    snapshot.key.id[:16],
                    snapshot.nbytes,
                    snapshot.priority,
                )
        return stored

    def undo(self, key: SnapshotKey) -> None:
        """remove() ran while `key` was being written: remove what the write left on disk."""
        disk_call("remove", self._disk.remove, key, default=False)
        self._catalogs.forget(key)

    def write_out(self, held: list[Snapshot]) -> None:
        """Write those of `held` that the disk does not hold yet, in order (close()'s last step)."""
        missing = [s for s in held if not disk_call("contains", self._disk.__contains__, s.key, default=True)]
        if missing:
            self.write(missing)
