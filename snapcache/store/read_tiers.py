"""The read contract each tier honours for the store (`ReadTier`), and its three implementations:
memory (the RAM tier and snapshots waiting for their disk write), the disk, and the remote tier.

`store.reads` walks them in order, fastest first. A tier here only reads: what a hit costs the
others (a disk hit promoted into RAM, a remote hit copied into the local tiers) is each one's own
business, and so are its failures (a disk or remote fault is a logged miss, never an exception).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from snapcache.errors import StoreUnavailable
from snapcache.formats.threads import map_in_parallel
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.deferred_uses import DeferredUses
from snapcache.store.memory import StoreMemory
from snapcache.store.prefix_index import PrefixIndex
from snapcache.store.report import Counters
from snapcache.tier_contract import TierName

if TYPE_CHECKING:
    from snapcache.disk import DiskTier, Miss
    from snapcache.remote import RemoteTier

log = logging.getLogger("snapcache")

# What a block read hands back per key: the snapshot; True when it was handed to `copy` without
# one of its own (a disk block lent for a restore); False when the tier does not hold it.
BlockRead = Snapshot | bool
Copy = Callable[[int, memoryview], None]

# How long the remote catalog of one fingerprint and scope is reused before Redis is asked again.
REMOTE_CATALOG_TTL_S = 1.0
# Blocks read from disk by restores that are remembered, so that a second read promotes them.
_LENT_KEYS_REMEMBERED = 1 << 14


def disk_call(what: str, call: Callable[..., Any], *args: Any, default: Any) -> Any:
    """A read of the disk tier: an unavailable disk is a logged miss, never an exception."""
    try:
        return call(*args)
    except (StoreUnavailable, OSError) as exc:
        log.warning("snapcache: disk %s failed: %s", what, exc)
        return default


class ReadTier(Protocol):
    """One tier as the store's reads see it."""

    @property
    def name(self) -> TierName:
        """The tier a hit here is reported as."""
        ...

    def index(self, model_fingerprint: str, scope: str) -> PrefixIndex:
        """The tier's candidates for a longest-prefix lookup in one fingerprint and scope."""
        ...

    def read(self, key: SnapshotKey, epoch: int) -> Snapshot | None:
        """The snapshot under `key` (kept by the faster tiers as this tier sees fit), or None."""
        ...

    def read_blocks(
        self, keys: Sequence[SnapshotKey], epoch: int, copy: Copy | None, keep: Copy | None = None
    ) -> list[BlockRead]:
        """Each block of `keys`, read together; with `copy`, each state is handed to `copy(i, state)`
        (i: the position in `keys`) before this returns, and the result may be True (no snapshot).
        A state whose bytes stay as they are (held in RAM, or fetched for this read) goes to `keep`
        instead where one is given."""
        ...

    def count(self, counters: Counters, *, hit: bool) -> None:
        """Count a hit or a miss of this tier. The store's lock held."""
        ...


class MemoryReads:
    """The RAM tier, and snapshots waiting for their disk write (which count for the disk without RAM)."""

    def __init__(self, lock: threading.Condition, memory: StoreMemory) -> None:
        self._lock = lock
        self._memory = memory

    @property
    def name(self) -> TierName:
        return "ram" if self._memory.ram is not None else "disk"

    def index(self, model_fingerprint: str, scope: str) -> PrefixIndex:
        return self._memory.index

    def read(self, key: SnapshotKey, epoch: int) -> Snapshot | None:
        with self._lock:
            return self._memory.get(key)

    def read_blocks(
        self, keys: Sequence[SnapshotKey], epoch: int, copy: Copy | None, keep: Copy | None = None
    ) -> list[BlockRead]:
        with self._lock:
            held = [self._memory.get(key) for key in keys]
        if keep is not None:  # the snapshots' bytes are never written again
            for i, snapshot in enumerate(held):
                if snapshot is not None:
                    keep(i, memoryview(snapshot.state))
        elif copy is not None:

            def copy_held(i: int) -> None:
                snapshot = held[i]
                assert snapshot is not None
                copy(i, memoryview(snapshot.state))

            map_in_parallel(copy_held, [i for i, snapshot in enumerate(held) if snapshot is not None])
        return [False if snapshot is None else snapshot for snapshot in held]

    def count(self, counters: Counters, *, hit: bool) -> None:
        if self._memory.ram is not None:
            if hit:
                counters.ram_hits += 1
            else:
                counters.ram_misses += 1
        elif hit:
            counters.disk_hits += 1


class DiskReads:
    """The disk tier: its hits are promoted into RAM (blocks only once a restore read them twice)."""

    name: TierName = "disk"

    def __init__(
        self,
        lock: threading.Condition,
        memory: StoreMemory,
        disk: DiskTier,
        catalogs: DiskCatalogs,
        uses: DeferredUses | None,
    ) -> None:
        self._lock = lock
        self._memory = memory
        self._disk = disk
        self._catalogs = catalogs
        self._uses = uses  # recorded off the read's path
        # Blocks a restore read from disk without promoting them, oldest first: see `_lent_before`.
        self._lent: dict[str, bool] = {}

    def index(self, model_fingerprint: str, scope: str) -> PrefixIndex:
        return self._catalogs.get(model_fingerprint, scope)

    def read(self, key: SnapshotKey, epoch: int) -> Snapshot | None:
        found: Snapshot | Miss | None = disk_call(
            "get", functools.partial(self._disk.read, touch=False), key, default=None
        )
        if isinstance(found, Snapshot):
            if self._uses is not None:
                self._uses.add([key])
            self._promote([found], epoch)
            return found
        if found is not None and found.lasting:
            # Gone, damaged or another secret's: the catalog stops offering it. A transient failure
            # (None, or Miss.UNAVAILABLE) leaves it there for the next lookup to try again.
            self._catalogs.forget(key)
        return None

    def read_blocks(
        self, keys: Sequence[SnapshotKey], epoch: int, copy: Copy | None, keep: Copy | None = None
    ) -> list[BlockRead]:
        # Every block goes to `copy`: one lent from disk is decoded into a buffer that is reused.
        if copy is None:
            promoted = [True] * len(keys)
        else:
            with self._lock:
                promoted = [self._lent_before(key) for key in keys]
        read: list[Snapshot | Miss | None] = disk_call(
            "get", functools.partial(self._disk.lend_many, keep=promoted), keys, copy, default=[]
        )
        results: list[BlockRead] = [False] * len(keys)
        kept: list[Snapshot] = []
        for i, result in enumerate(read):
            if isinstance(result, Snapshot):
                results[i] = result
                kept.append(result)
            elif result is None:
                results[i] = True
        self._promote(kept, epoch)
        return results

    def count(self, counters: Counters, *, hit: bool) -> None:
        if hit:
            counters.disk_hits += 1
        else:
            counters.disk_misses += 1

    def _promote(self, snapshots: list[Snapshot], epoch: int) -> None:
        """Promote what was read into RAM, the first as the most recently used."""
        if not snapshots:
            return
        with self._lock:
            for snapshot in reversed(snapshots):
                self._memory.promote(snapshot, epoch)
        writes = self._memory.writes
        if writes is not None and not writes.background:
            writes.drain()  # without a writer thread, the spills of the evictions are written now

    def _lent_before(self, key: SnapshotKey) -> bool:
        """Whether `key` was lent from disk recently (and is then worth a place in RAM); the first
        time, remember it. Lock held."""
        if self._memory.ram is None:
            return False
        if self._lent.pop(key.id, False):
            return True
        self._lent[key.id] = True
        if len(self._lent) > _LENT_KEYS_REMEMBERED:
            del self._lent[next(iter(self._lent))]
        return False


class RemoteReads:
    """The remote tier: its hits are copied into the local tiers; a record's blocks come in one
    round trip, and its catalog of one fingerprint and scope is reused for `REMOTE_CATALOG_TTL_S`."""

    name: TierName = "remote"

    def __init__(self, remote: RemoteTier, copy_in: Callable[[Snapshot], None] | None) -> None:
        self._remote = remote
        self._copy_in = copy_in
        self._lock = threading.Lock()
        self._catalogs: dict[tuple[str, str], tuple[float, PrefixIndex]] = {}

    def index(self, model_fingerprint: str, scope: str) -> PrefixIndex:
        group = (model_fingerprint, scope)
        now = time.monotonic()
        with self._lock:
            cached = self._catalogs.get(group)
        if cached is not None and now - cached[0] < REMOTE_CATALOG_TTL_S:
            return cached[1]
        rows = self._remote.catalog(model_fingerprint, scope)
        index = PrefixIndex.of_group(model_fingerprint, scope, rows, None if cached is None else cached[1])
        with self._lock:
            if len(self._catalogs) > 1024:  # many scopes: forget the old ones rather than grow
                self._catalogs.clear()
            self._catalogs[group] = (now, index)
        return index

    def read(self, key: SnapshotKey, epoch: int) -> Snapshot | None:
        return self._kept(self._remote.get(key))

    def read_blocks(
        self, keys: Sequence[SnapshotKey], epoch: int, copy: Copy | None, keep: Copy | None = None
    ) -> list[BlockRead]:
        results: list[BlockRead] = []
        hand_over = keep or copy  # a state fetched for this read is this read's own
        for i, snapshot in enumerate(self._remote.get_many(keys)):
            if snapshot is None:
                results.append(False)
                continue
            if hand_over is not None:
                hand_over(i, memoryview(snapshot.state))
            results.append(self._kept(snapshot) or False)
        return results

    def count(self, counters: Counters, *, hit: bool) -> None:
        if hit:
            counters.remote_hits += 1
        else:
            counters.remote_misses += 1

    def forget(self, key: SnapshotKey) -> None:
        """`key` is gone from Redis: the cached catalog stops offering it."""
        with self._lock:
            cached = self._catalogs.get((key.model_fingerprint, key.scope))
            if cached is not None:
                cached[1].remove(key)

    def _kept(self, snapshot: Snapshot | None) -> Snapshot | None:
        if snapshot is not None and self._copy_in is not None:
            self._copy_in(snapshot)
        return snapshot
