"""Flushing and closing a store's tiers: the queues waited for or stopped, every RAM entry left on
disk, each tier released."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from snapcache.store.deferred_uses import DeferredUses
from snapcache.store.disk_writes import DiskWrites
from snapcache.store.ram import RamTier
from snapcache.store.write_behind import WriteBehind

if TYPE_CHECKING:
    from snapcache.disk import DiskTier
    from snapcache.remote import RemoteTier


def flush_tiers(*, writes: WriteBehind | None, uses: DeferredUses | None, remote: RemoteTier | None) -> None:
    """Wait until what was queued so far reached the disk, its index and the remote tier."""
    if writes is not None:
        writes.flush()
    if uses is not None:
        uses.flush()
    if remote is not None:
        remote.flush()


def close_tiers(
    lock: threading.Condition,
    *,
    ram: RamTier | None,
    disk: DiskTier | None,
    writes: WriteBehind | None,
    uses: DeferredUses | None,
    disk_writes: DiskWrites | None,
    remote: RemoteTier | None,
) -> None:
    """Write what is queued, leave what RAM holds on disk (when there is one), then close the tiers:
    the store was marked closed before, so nothing promotes into RAM meanwhile."""
    if writes is not None:
        writes.stop()
    if uses is not None:
        uses.stop()
    if disk is not None:
        if ram is not None:
            assert disk_writes is not None
            with lock:
                held = ram.snapshots()  # least valuable first: the most valuable stay
            disk_writes.write_out(held)
        disk.close()
    if ram is not None:
        with lock:
            ram.close()
    if remote is not None:
        remote.close()
