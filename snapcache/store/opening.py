"""Opening a store: its arguments resolved into a directory, a secret and a remote tier; its disk
tier with the write-behind queue in front of it; and the stores still open closed at exit."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from snapcache.errors import InvalidArgument
from snapcache.formats.compression import Compression
from snapcache.key import validate_budget
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.deferred_uses import DeferredUses
from snapcache.store.disk_writes import DiskWrites
from snapcache.store.inputs import Default, open_remote, resolve_remote, resolve_secret, store_path
from snapcache.store.memory import StoreMemory
from snapcache.store.report import Counters
from snapcache.store.write_behind import WriteBehind

if TYPE_CHECKING:
    from snapcache.disk import Change, DiskTier
    from snapcache.remote import RemoteTier

log = logging.getLogger("snapcache")

# Snapshots waiting for the background writer outside the RAM tier may hold at most
# min(ram_bytes * _PENDING_SHARE, _MAX_PENDING_BYTES) (or the one being written) before `put` waits:
# with the writer's compression buffer, the process then stays within the RAM budget plus a tenth.
_PENDING_SHARE = 0.05
_MAX_PENDING_BYTES = 256 << 20


def open_tiers_args(
    directory: str | os.PathLike[str] | Default | None,
    ram_bytes: int,
    disk_bytes: int | None,
    secret: bytes | str | None,
    remote: str | RemoteTier | None,
    remote_budget_bytes: int | None,
) -> tuple[Path | None, bytes | None, RemoteTier | None]:
    """The disk tier's directory (None: none), the secret, and the remote tier, opened first: a bad
    URL raises before anything else is open (it connects on first use)."""
    path = store_path(directory)
    if path is not None and disk_bytes == 0:
        path = None
    if path is None and ram_bytes == 0:
        raise InvalidArgument("ram_bytes=0 needs a disk tier: give a directory and disk_bytes > 0")
    remote = resolve_remote(remote)
    if remote_budget_bytes is not None:
        remote_budget_bytes = validate_budget("remote_budget_bytes", remote_budget_bytes)
        if remote is not None and not isinstance(remote, str):
            raise InvalidArgument("remote_budget_bytes is for a remote URL: give the RemoteTier its budget")
    mac_secret = resolve_secret(secret) if path is not None or isinstance(remote, str) else None
    if isinstance(remote, str):
        return path, mac_secret, open_remote(remote, mac_secret, remote_budget_bytes)
    return path, mac_secret, remote


@dataclass(frozen=True, slots=True)
class DiskParts:
    """The disk tier and what stands in front of it (all None without one)."""

    disk: DiskTier | None = None
    writes: WriteBehind | None = None
    disk_writes: DiskWrites | None = None
    uses: DeferredUses | None = None


def open_disk(
    path: Path,
    disk_bytes: int | None,
    ram_bytes: int,
    *,
    secret: bytes | None,
    allow_shared_dir: bool,
    compression: Compression,
    background: bool,
    lock: threading.Condition,
    memory: StoreMemory,
    catalogs: DiskCatalogs,
    counters: Counters,
    on_change: Callable[[Change], None],
) -> DiskParts:
    """The disk tier in `path`, its catalogs, its write-behind queue and the recorder of its uses."""
    from snapcache.disk import DiskTier

    disk = DiskTier(
        path,
        disk_bytes,
        secret=secret,
        allow_shared_dir=allow_shared_dir,
        compression=compression,
        on_change=on_change,
    )
    catalogs.attach(disk)
    disk_writes = DiskWrites(lock, disk, catalogs, counters)
    writes = WriteBehind(
        lock,
        write=disk_writes.write,
        settle=memory.settle_write,
        undo=disk_writes.undo,
        held_in_ram=memory.holds,
        limit_bytes=min(int(ram_bytes * _PENDING_SHARE), _MAX_PENDING_BYTES),
        background=background,
    )
    memory.attach_writes(writes)
    uses = DeferredUses(functools.partial(disk.touch, patient=background), background=background)
    return DiskParts(disk, writes, disk_writes, uses)


class _Closable(Protocol):
    def close(self) -> None: ...


# Stores still open at interpreter exit are closed then, so that queued writes reach the disk.
_open_stores: weakref.WeakSet[_Closable] = weakref.WeakSet()


def close_at_exit(store: _Closable) -> None:
    """Close `store` at interpreter exit unless it was closed before."""
    _open_stores.add(store)


def closed_already(store: _Closable) -> None:
    _open_stores.discard(store)


@atexit.register
def _close_open_stores() -> None:
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:
            log.exception("snapcache: closing a store at exit failed")
