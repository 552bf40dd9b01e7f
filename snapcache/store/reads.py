"""Finding a snapshot across the tiers: memory first, then the disk, whose hits are promoted into RAM,
then the remote tier (if any), whose hits are copied into the local tiers.

Exact gets, longest-prefix lookups and the reads of shared blocks, with the hits and misses each
counts. Arguments arrive checked (the store's façade checks them); a disk that fails to answer is a
logged miss, never an exception, and so is a remote tier (see remote.tier).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from snapcache.errors import StoreUnavailable
from snapcache.formats.threads import map_in_parallel
from snapcache.key import SnapshotKey, TokenArray, rolling_prefix_hashes
from snapcache.snapshot import Snapshot
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.deferred_uses import DeferredUses
from snapcache.store.memory import StoreMemory
from snapcache.store.prefix_index import PrefixHashes, PrefixIndex, iter_prefix_matches
from snapcache.store.report import Counters
from snapcache.tier import TierName

if TYPE_CHECKING:
    from snapcache.disk import DiskTier, Miss
    from snapcache.remote import RemoteTier

log = logging.getLogger("snapcache")

# Remote candidates a longest-prefix lookup reads at most, longest first, before it gives up: each
# that fails verification (or was evicted meanwhile) costs a round trip.
_MAX_REMOTE_TRIES = 3
# Blocks read from disk by restores that are remembered, so that a second read promotes them.
_LENT_KEYS_REMEMBERED = 1 << 14


def disk_call(what: str, call: Callable[..., Any], *args: Any, default: Any) -> Any:
    """A read of the disk tier: an unavailable disk is a logged miss, never an exception."""
    try:
        return call(*args)
    except (StoreUnavailable, OSError) as exc:
        log.warning("snapcache: disk %s failed: %s", what, exc)
        return default


class TierReads:
    """The store's reads: RAM, else a snapshot waiting for its disk write, else the disk."""

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
        self._catalogs = catalogs
        self._counters = counters
        self._remote = remote
        self._copy_in = copy_in
        self._uses = uses  # of disk entries (None without a disk tier), recorded off the read's path
        # Blocks a restore read from disk without promoting them, oldest first: see copy_blocks.
        self._lent_from_disk: dict[str, bool] = {}

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot under exactly `key`, counted as a hit or a miss."""
        with self._lock:
            snapshot = self._get_memory(key)
            if snapshot is not None:
                return snapshot
            epoch = self._memory.remove_epoch
        snapshot = self._get_disk(key, epoch)
        if snapshot is None:
            snapshot = self._get_remote(key)
            with self._lock:
                if snapshot is None:
                    self._counters.misses += 1
                else:
                    self._counters.hits += 1
        return snapshot

    def longest_prefix(
        self, model_fingerprint: str, scope: str, query: TokenArray
    ) -> tuple[Snapshot, TierName] | None:
        """The snapshot of the longest stored prefix of `query` and the tier that served it."""
        indexes = [self._memory.index]
        if self._disk is not None:
            indexes.append(self._catalogs.get(model_fingerprint, scope))
        hashes = rolling_prefix_hashes(query)
        tried: set[SnapshotKey] = set()
        while True:
            with self._lock:
                key = None
                for candidate in iter_prefix_matches(indexes, model_fingerprint, scope, query, hashes):
                    if candidate not in tried:
                        key = candidate
                        break
                if key is None:
                    break
                snapshot = self._get_memory(key, count_miss=False)
                if snapshot is not None:
                    return snapshot, self._memory_tier()
                epoch = self._memory.remove_epoch
            snapshot = self._get_disk(key, epoch, count_miss=False)
            if snapshot is not None:
                if self._memory.ram is not None:
                    with self._lock:
                        self._counters.ram_misses += 1
                return snapshot, "disk"
            tried.add(key)  # vanished or corrupt on disk: try the next best
        found = self._remote_prefix(model_fingerprint, scope, query, hashes)
        with self._lock:
            self._count_miss(served=found is not None)
        return found

    def _remote_prefix(
        self, model_fingerprint: str, scope: str, query: TokenArray, hashes: PrefixHashes
    ) -> tuple[Snapshot, TierName] | None:
        """The longest prefix of `query` the remote tier holds, copied into the local tiers."""
        if self._remote is None:
            return None
        rows = self._remote.catalog(model_fingerprint, scope)
        if not rows:
            return None
        index = PrefixIndex.of_group(model_fingerprint, scope, rows)
        matches = iter_prefix_matches((index,), model_fingerprint, scope, query, hashes)
        for key in itertools.islice(matches, _MAX_REMOTE_TRIES):
            snapshot = self._get_remote(key)
            if snapshot is not None:
                return snapshot, "remote"
        return None

    def _get_remote(self, key: SnapshotKey) -> Snapshot | None:
        """`key` from the remote tier, verified and copied into the local tiers; None on a miss."""
        if self._remote is None:
            return None
        snapshot = self._remote.get(key)
        with self._lock:
            if snapshot is None:
                self._counters.remote_misses += 1
            else:
                self._counters.remote_hits += 1
        if snapshot is not None and self._copy_in is not None:
            self._copy_in(snapshot)
        return snapshot

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

    def get_blocks(self, keys: Sequence[SnapshotKey]) -> list[tuple[Snapshot, TierName]]:
        """The blocks of `keys` up to the first that no tier holds, each with its tier: promoted like
        a get but neither counted nor touched. Those not in memory are read from disk at once."""
        memory_tier = self._memory_tier()
        found: list[tuple[Snapshot, TierName] | None] = []
        with self._lock:
            for key in keys:
                snapshot = self._memory.get(key)
                found.append(None if snapshot is None else (snapshot, memory_tier))
            epoch = self._memory.remove_epoch
        missing = [i for i, held in enumerate(found) if held is None]
        disk = self._disk
        if missing and disk is not None:
            wanted = [keys[i] for i in missing]
            read: list[Snapshot | Miss] = disk_call("get", disk.read_many, wanted, default=[])
            hits = [
                (i, snapshot)
                for i, snapshot in zip(missing, read, strict=False)
                if isinstance(snapshot, Snapshot)
            ]
            for i, snapshot in hits:
                found[i] = (snapshot, "disk")
            self._promote_blocks([snapshot for _, snapshot in hits], epoch)
        blocks: list[tuple[Snapshot, TierName]] = []
        for key, held in zip(keys, found, strict=True):
            if held is not None:
                blocks.append(held)
                continue
            remote = self._get_remote(key)
            if remote is None:
                break
            blocks.append((remote, "remote"))
        return blocks

    def copy_blocks(
        self, keys: Sequence[SnapshotKey], copy: Callable[[int, memoryview], None]
    ) -> list[TierName]:
        """Hand the state of each block of `keys` to `copy(i, state)`, up to the first that no tier
        holds; return the tiers that served them. See `SnapshotStore.copy_blocks`."""
        memory_tier = self._memory_tier()
        tiers: list[TierName | None] = [None] * len(keys)
        with self._lock:
            held = [self._memory.get(key) for key in keys]
            epoch = self._memory.remove_epoch
        in_memory = [i for i, snapshot in enumerate(held) if snapshot is not None]

        def copy_held(i: int) -> None:
            snapshot = held[i]
            assert snapshot is not None
            copy(i, memoryview(snapshot.state))

        map_in_parallel(copy_held, in_memory)
        for i in in_memory:
            tiers[i] = memory_tier
        missing = [i for i, snapshot in enumerate(held) if snapshot is None]
        disk = self._disk
        if missing and disk is not None:
            with self._lock:
                keep = [self._read_from_disk_before(keys[i]) for i in missing]
            read: list[Snapshot | Miss | None] = disk_call(
                "get",
                functools.partial(disk.lend_many, keep=keep),
                [keys[i] for i in missing],
                lambda j, state: copy(missing[j], state),
                default=[],
            )
            kept: list[Snapshot] = []
            for i, result in zip(missing, read, strict=False):
                if result is None or isinstance(result, Snapshot):
                    tiers[i] = "disk"
                    if result is not None:
                        kept.append(result)
            self._promote_blocks(kept, epoch)
        served: list[TierName] = []
        for i, (key, tier) in enumerate(zip(keys, tiers, strict=True)):
            if tier is None:
                remote = self._get_remote(key)
                if remote is None:
                    break
                copy(i, memoryview(remote.state))
                tier = "remote"
            served.append(tier)
        if served:
            self.touch_blocks(list(keys[: len(served)]))
        return served

    def _promote_blocks(self, blocks: list[Snapshot], epoch: int) -> None:
        """Promote blocks read from disk into RAM, the first of them as the most recently used."""
        if not blocks:
            return
        with self._lock:
            for snapshot in reversed(blocks):
                self._memory.promote(snapshot, epoch)
        self._drain_if_foreground()

    def _read_from_disk_before(self, key: SnapshotKey) -> bool:
        """Whether `key` was lent from disk recently (and is then worth a place in RAM); the first
        time, remember it. Lock held."""
        if self._memory.ram is None:
            return False
        if self._lent_from_disk.pop(key.id, False):
            return True
        self._lent_from_disk[key.id] = True
        if len(self._lent_from_disk) > _LENT_KEYS_REMEMBERED:
            del self._lent_from_disk[next(iter(self._lent_from_disk))]
        return False

    def touch_blocks(self, keys: list[SnapshotKey]) -> None:
        """Record a use of `keys`, the first as the most recent, in RAM and on disk."""
        ram = self._memory.ram
        if ram is not None:
            with self._lock:
                for key in reversed(keys):
                    ram.get(key)  # in RAM too, the first becomes the most recently used
        if self._uses is not None:
            self._uses.add(keys)

    def _memory_tier(self) -> TierName:
        """A snapshot still waiting for its disk write counts for the disk when there is no RAM tier."""
        return "ram" if self._memory.ram is not None else "disk"

    def _get_memory(self, key: SnapshotKey, *, count_miss: bool = True) -> Snapshot | None:
        """RAM, else a snapshot waiting for its disk write; counts a hit. Lock held."""
        snapshot = self._memory.get(key)
        has_ram = self._memory.ram is not None
        if snapshot is None:
            if count_miss and has_ram:
                self._counters.ram_misses += 1
            return None
        self._counters.hits += 1
        if has_ram:
            self._counters.ram_hits += 1
        else:
            self._counters.disk_hits += 1
        return snapshot

    def _get_disk(self, key: SnapshotKey, epoch: int, *, count_miss: bool = True) -> Snapshot | None:
        """Read `key` from disk and promote it into RAM; counts a disk hit or miss."""
        disk = self._disk
        if disk is None:
            return None
        found: Snapshot | Miss | None = disk_call(
            "get", functools.partial(disk.read, touch=False), key, default=None
        )
        snapshot = found if isinstance(found, Snapshot) else None
        if snapshot is not None and self._uses is not None:
            self._uses.add([key])
        if found is not None and not isinstance(found, Snapshot) and found.lasting:
            # Gone, damaged or another secret's: the catalog stops offering it. A transient failure
            # (None, or Miss.UNAVAILABLE) leaves it there for the next lookup to try again.
            self._catalogs.forget(key)
        with self._lock:
            if snapshot is None:
                if count_miss:
                    self._counters.disk_misses += 1
                return None
            self._counters.hits += 1
            self._counters.disk_hits += 1
            self._memory.promote(snapshot, epoch)
        self._drain_if_foreground()
        return snapshot

    def _drain_if_foreground(self) -> None:
        """Without a writer thread, write the spills of a promotion's evictions now."""
        writes = self._memory.writes
        if writes is not None and not writes.background:
            writes.drain()

    def _count_miss(self, *, served: bool = False) -> None:
        """A lookup that found nothing in the local tiers, and was `served` by the remote one or
        missed there too. Lock held."""
        if served:
            self._counters.hits += 1
        else:
            self._counters.misses += 1
        if self._memory.ram is not None:
            self._counters.ram_misses += 1
        if self._disk is not None:
            self._counters.disk_misses += 1
