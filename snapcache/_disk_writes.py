"""How the store's snapshots reach its disk tier: each write logged and counted when it fails.

The write-behind queue calls `write` for every snapshot it writes and `undo` when a remove() overtook
a write; close() calls `write_out` to leave what RAM holds on disk. None of them raises for a disk
that fails: the store keeps serving from RAM.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from snapcache._disk_catalogs import DiskCatalogs
from snapcache._store_reads import disk_call
from snapcache._store_report import Counters
from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

if TYPE_CHECKING:
    from snapcache.disk_tier import DiskTier

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

    def write(self, snapshot: Snapshot) -> bool:
        """disk.put with failures logged and counted; True if the disk kept it."""
        try:
            stored = self._disk.put(snapshot)
        except (StoreUnavailable, OSError) as exc:
            log.warning("snapcache: could not write snapshot %s to disk: %s", snapshot.key.id[:16], exc)
            with self._lock:
                self._counters.write_errors += 1
            return False
        if not stored:
            log.warning(
                "snapcache: snapshot %s (%d bytes, priority %d) not kept on disk: larger than the disk "
                "budget, or no room without evicting a higher priority",
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
        """Write each of `held` that the disk does not hold yet, in order (close()'s last step)."""
        for snapshot in held:
            if not disk_call("contains", self._disk.__contains__, snapshot.key, default=True):
                self.write(snapshot)
