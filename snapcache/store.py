"""SnapshotStore: the façade over the RAM and disk tiers — put, get, longest-prefix lookup, spill, promote.

The pieces it steps through: the RAM tier (ram_tier), the write-behind queue to the disk
(_write_behind), the disk tier (disk_tier) and the store's copies of its catalogs (_disk_catalogs),
arguments checked once (_store_inputs), and what it reports (_store_report).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy.typing as npt

from snapcache._disk_catalogs import DiskCatalogs
from snapcache._store_inputs import (
    DEFAULT_DIRECTORY,
    Default,
    copy_logits,
    copy_state,
    resolve_secret,
    store_path,
)
from snapcache._store_report import Counters, StoreEntry, StoreStats, memory_row, merge_entries
from snapcache._write_behind import PendingWrite, WriteBehind
from snapcache.errors import InvalidArgument, KeyMismatch, StoreUnavailable
from snapcache.key import (
    SnapshotKey,
    TokenArray,
    Tokens,
    as_token_array,
    rolling_hash,
    rolling_prefix_hashes,
    validate_budget,
    validate_fingerprint,
    validate_priority,
    validate_scope,
)
from snapcache.prefix_index import PrefixIndex, iter_prefix_matches
from snapcache.ram_tier import RamTier
from snapcache.snapshot import Buffer, Snapshot
from snapcache.tier import EntryInfo, TierName, in_eviction_order

if TYPE_CHECKING:
    from snapcache._disk_repair import CheckReport
    from snapcache.cache_dir import DirectoryReport
    from snapcache.disk_tier import Change, DiskTier, Miss

_E = TypeVar("_E", bound=EntryInfo)

__all__ = ["DEFAULT_DIRECTORY", "SnapshotStore", "StoreEntry", "StoreStats"]

log = logging.getLogger("snapcache")

# Snapshots waiting for the background writer outside the RAM tier may hold at most
# min(ram_bytes * _PENDING_SHARE, _MAX_PENDING_BYTES) (or the one being written) before `put` waits:
# with the writer's compression buffer, the process then stays within the RAM budget plus a tenth.
_PENDING_SHARE = 0.05
_MAX_PENDING_BYTES = 256 << 20


class SnapshotStore:
    """Snapshots in RAM and on disk, found by exact key or by longest stored prefix of a prompt.

    `directory` omitted: the user cache directory (or `SNAPCACHE_DIR`); `None`: RAM only.
    `ram_bytes=0` keeps nothing in RAM (disk only). `disk_bytes` is recorded in the directory as its
    budget (evicting down to it at once); `None` uses the budget recorded there, else 8 GiB, so that
    a tool opening the directory does not shrink what an application keeps in it. `secret`
    (default: `SNAPCACHE_SECRET`) signs the files so that ones written without it are refused.
    Writes to disk happen on a background thread unless `background_writes=False`; `flush()` waits
    for them and `close()` leaves every RAM entry on disk (save those the disk refuses). Opening
    reclaims temporary and orphan files that crashed writers left, once they are older than 10
    minutes. Thread-safe.

    Priority decides admission as well as eviction: a put of priority p evicts only entries of
    priority p or lower, in either tier. A snapshot that cannot fit in RAM without evicting a higher
    priority is kept out of RAM (and still written to disk when the disk tier is on); one that cannot
    fit on disk so is not written there. A snapshot kept by no tier is dropped with a logged warning.

    Snapshots waiting for their disk write stay in memory until written, also those the RAM tier
    does not hold (evicted, kept out, too large for it, or `ram_bytes=0`). Beyond the RAM budget they
    hold at most a twentieth of `ram_bytes` (256 MiB at most), or the one snapshot in flight: `put`
    waits for the writer otherwise. `stats().pending_write_bytes` reports them. An entry evicted from
    RAM that the disk already holds is simply dropped from RAM, never queued again.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | Default | None = DEFAULT_DIRECTORY,
        *,
        ram_bytes: int = 512 << 20,
        disk_bytes: int | None = None,
        secret: bytes | str | None = None,
        allow_shared_dir: bool = False,
        background_writes: bool = True,
    ) -> None:
        ram_bytes = validate_budget("ram_bytes", ram_bytes)
        if disk_bytes is not None:
            disk_bytes = validate_budget("disk_bytes", disk_bytes)
        path = store_path(directory)
        if path is not None and disk_bytes == 0:
            path = None
        if path is None and ram_bytes == 0:
            raise InvalidArgument("ram_bytes=0 needs a disk tier: give a directory and disk_bytes > 0")

        self._lock = threading.Condition(threading.Lock())
        self._counters = Counters()
        self._closed = False
        self._evicted: list[Snapshot] = []
        self._ram = RamTier(ram_bytes, on_evict=self._evicted.append) if ram_bytes else None
        # Keys held in RAM or waiting for their disk write; the disk keeps its own catalog.
        self._memory_index = PrefixIndex()
        # RAM keys whose snapshot this store knows the disk to hold: evicting them writes nothing.
        self._on_disk: set[SnapshotKey] = set()
        self._remove_epoch = 0
        self._directory = path
        self._catalogs = DiskCatalogs(self._lock)
        self._disk: DiskTier | None = None
        self._writes: WriteBehind | None = None
        if path is not None:
            from snapcache.disk_tier import DiskTier

            self._disk = DiskTier(
                path,
                disk_bytes,
                secret=resolve_secret(secret),
                allow_shared_dir=allow_shared_dir,
                on_change=self._on_disk_change,
            )
            self._catalogs.attach(self._disk)
            self._writes = WriteBehind(
                self._lock,
                write=self._write_to_disk,
                settle=self._settle_write,
                undo=self._undo_write,
                held_in_ram=self._holds,
                limit_bytes=min(int(ram_bytes * _PENDING_SHARE), _MAX_PENDING_BYTES),
                background=background_writes,
            )
        _open_stores.add(self)

    # -- public API ---------------------------------------------------------------------------------

    @property
    def directory(self) -> Path | None:
        """The disk tier's directory, or None for a RAM-only store."""
        return self._directory

    @staticmethod
    def default_directory() -> Path:
        """Where a store opened without a directory keeps its files: $SNAPCACHE_DIR, else the user
        cache directory."""
        from snapcache.cache_dir import default_cache_dir

        return Path(default_cache_dir())

    @staticmethod
    def inspect_directory(
        directory: str | os.PathLike[str] | None = None, *, allow_shared_dir: bool = False
    ) -> DirectoryReport:
        """What `directory` (default: `default_directory()`) holds and whether a store could open
        there, found without creating or changing anything."""
        from snapcache.cache_dir import inspect_store_dir

        path = SnapshotStore.default_directory() if directory is None else Path(directory)
        return inspect_store_dir(path, allow_shared_dir)

    @staticmethod
    def eviction_order(entries: Iterable[_E]) -> list[_E]:
        """`entries` in the order the tiers evict: lowest priority, then least recently used, first."""
        return in_eviction_order(entries)

    def put(
        self,
        key: SnapshotKey,
        tokens: Tokens,
        state_bytes: Buffer,
        priority: int = 0,
        logits: npt.ArrayLike | None = None,
    ) -> Snapshot | None:
        """Store a copy of `state_bytes` under `key`; None if no tier keeps it.

        With background writes, a snapshot RAM does not keep is handed to the disk writer and
        returned; should the disk refuse it too, it is dropped then with a logged warning.
        Raises KeyMismatch when `tokens` do not hash to `key`.
        """
        if not isinstance(key, SnapshotKey):
            raise InvalidArgument(f"key must be a SnapshotKey, got {type(key).__name__}")
        priority = validate_priority(priority)
        array = as_token_array(tokens)
        if not key.matches(array):
            raise KeyMismatch(f"the {len(array)} tokens given do not hash to the key")
        snapshot = Snapshot(key, array, copy_state(state_bytes), copy_logits(logits), priority)
        self._check_open()

        ram, writes = self._ram, self._writes
        with self._lock:
            if writes is not None:
                writes.wait_for_room(snapshot.nbytes, lambda: self._closed)
            if self._closed:  # closed while this put waited, or just before it took the lock
                raise StoreUnavailable("the store is closed")
            in_ram = False
            self._on_disk.discard(key)  # whatever the disk holds under this key is older
            if ram is not None:
                in_ram = ram.put(snapshot)
                if not in_ram:
                    ram.remove(key)  # an older state under the same key must not outlive this one
            if key.is_block:
                pass  # found by exact key only, never by prefix
            elif in_ram or writes is not None:
                self._memory_index.add(key, rolling_hash(array))
            else:
                self._memory_index.remove(key)
            if writes is not None:
                writes.add(snapshot, spill=False)
            self._handle_evictions()
        if writes is None:
            if not in_ram:
                assert ram is not None
                too_large = snapshot.nbytes > ram.budget_bytes
                why = (
                    "larger than the RAM budget"
                    if too_large
                    else "no room without evicting a higher priority"
                )
                self._drop(snapshot, f"{why} and there is no disk tier")
                return None
            return snapshot
        if not writes.background:
            writes.drain()
            disk = self._disk
            assert disk is not None
            with self._lock:
                in_memory = ram is not None and key in ram
            if not in_memory and not self._disk_call("contains", disk.__contains__, key, default=False):
                return None
        return snapshot

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot stored under exactly `key` (RAM first, then disk), or None."""
        if not isinstance(key, SnapshotKey):
            raise InvalidArgument(f"key must be a SnapshotKey, got {type(key).__name__}")
        self._check_open()
        with self._lock:
            snapshot = self._get_memory(key)
            if snapshot is not None:
                return snapshot
            epoch = self._remove_epoch
        snapshot = self._get_disk(key, epoch)
        if snapshot is None:
            with self._lock:
                self._counters.misses += 1
        return snapshot

    def held_priority(self, key: SnapshotKey) -> int | None:
        """The priority of what is stored under `key`, or None: no load, no hit counted, nothing
        marked as used (for skipping what a put would store again)."""
        snapshot = self._peek_memory(key)
        if snapshot is not None:
            return snapshot.priority
        if self._disk is None:
            return None
        priority: int | None = self._disk_call("read the index", self._disk.held_priority, key, default=None)
        return priority

    def get_block(self, key: SnapshotKey) -> tuple[Snapshot, TierName] | None:
        """The block stored under `key` and the tier that served it, or None; promoted like a get, but
        not counted as a hit or miss (a restore counts once, not per block), and its use on disk is
        recorded by `touch_blocks`, for many blocks at once."""
        if not isinstance(key, SnapshotKey) or not key.is_block:
            raise InvalidArgument(f"not the key of a block: {key!r}")
        self._check_open()
        with self._lock:
            snapshot = None if self._ram is None else self._ram.get(key)
            if snapshot is None and self._writes is not None:
                snapshot = self._writes.get(key)
            if snapshot is not None:
                return snapshot, "ram" if self._ram is not None else "disk"
            epoch = self._remove_epoch
        disk = self._disk
        if disk is None:
            return None
        read = functools.partial(disk.read, touch=False)  # touch_blocks records the uses at once
        found: Snapshot | Miss | None = self._disk_call("get", read, key, default=None)
        if not isinstance(found, Snapshot):
            return None
        with self._lock:
            self._promote(found, epoch)
        if self._writes is not None and not self._writes.background:
            self._writes.drain()
        return found, "disk"

    def touch_blocks(self, keys: list[SnapshotKey]) -> None:
        """Record a use of the blocks `get_block` served, the first of `keys` as the most recent (so
        that the first blocks of a prompt, which every longer prefix needs, are evicted last)."""
        if self._ram is not None:
            with self._lock:
                for key in reversed(keys):
                    self._ram.get(key)  # in RAM too, the first becomes the most recently used
        if self._disk is not None and keys:
            self._disk_call("record uses", self._disk.touch, keys, default=None)

    def stored_tokens(self, key: SnapshotKey) -> TokenArray | None:
        """The tokens of the snapshot under `key`, without loading its state: no hit is counted and
        nothing is promoted (for explaining a miss). None if absent or unreadable."""
        snapshot = self._peek_memory(key)
        if snapshot is not None:
            return snapshot.tokens
        if self._disk is None:
            return None
        found: TokenArray | None = self._disk_call("read tokens", self._disk.stored_tokens, key, default=None)
        return found

    def lookup(self, model_fingerprint: str, scope: str, prompt_tokens: Tokens) -> Snapshot | None:
        """The snapshot of the longest stored prefix of `prompt_tokens` in this fingerprint and scope.

        None when nothing matches.
        """
        found = self.lookup_with_tier(model_fingerprint, scope, prompt_tokens)
        return None if found is None else found[0]

    def lookup_with_tier(
        self, model_fingerprint: str, scope: str, prompt_tokens: Tokens
    ) -> tuple[Snapshot, TierName] | None:
        """Like `lookup`, with the tier that served the snapshot: "ram" or "disk".

        A snapshot still waiting for its disk write is served from memory: "ram" when the store has
        a RAM tier, else "disk" (the tier it is bound for, as the hit counters count it).
        """
        validate_fingerprint(model_fingerprint)
        validate_scope(scope)
        query = as_token_array(prompt_tokens)
        self._check_open()
        indexes = [self._memory_index]
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
                    self._count_miss()
                    return None
                snapshot = self._get_memory(key, count_miss=False)
                if snapshot is not None:
                    return snapshot, "ram" if self._ram is not None else "disk"
                epoch = self._remove_epoch
            snapshot = self._get_disk(key, epoch, count_miss=False)
            if snapshot is not None:
                if self._ram is not None:
                    with self._lock:
                        self._counters.ram_misses += 1
                return snapshot, "disk"
            tried.add(key)  # vanished or corrupt on disk: try the next best

    def remove(self, key: SnapshotKey) -> bool:
        """Forget `key` in every tier; True if any tier held it."""
        if not isinstance(key, SnapshotKey):
            raise InvalidArgument(f"key must be a SnapshotKey, got {type(key).__name__}")
        self._check_open()
        with self._lock:
            found = self._ram is not None and self._ram.remove(key)
            if self._writes is not None and self._writes.discard(key):
                found = True
            self._on_disk.discard(key)
            self._memory_index.remove(key)
            self._remove_epoch += 1
        if self._disk is not None:
            found = self._disk_call("remove", self._disk.remove, key, default=False) or found
            self._catalogs.forget(key)
        return found

    def entries(
        self, model_fingerprint: str | None = None, scope: str | None = None, *, blocks: bool = False
    ) -> list[EntryInfo]:
        """One row per stored snapshot (a StoreEntry), optionally only of one fingerprint and/or scope.

        With `blocks`, also one row per shared block (`key.is_block`) of that fingerprint and scope.
        """
        self._check_open()

        def wanted(key: SnapshotKey) -> bool:
            return (
                (blocks or not key.is_block)
                and (model_fingerprint is None or key.model_fingerprint == model_fingerprint)
                and (scope is None or key.user_scope == scope)
            )

        rows: dict[SnapshotKey, EntryInfo] = {}
        with self._lock:
            if self._ram is not None:
                rows.update((row.key, row) for row in self._ram.entries() if wanted(row.key))
            if self._writes is not None:
                for snapshot in self._writes.snapshots():
                    if snapshot.key not in rows and wanted(snapshot.key):
                        rows[snapshot.key] = memory_row(snapshot)
        disk_rows: list[EntryInfo] = []
        if self._disk is not None:
            disk_scope = None if blocks else scope
            found = self._disk_call("entries", self._disk.entries, model_fingerprint, disk_scope, default=[])
            disk_rows = [row for row in found if wanted(row.key)]
        return merge_entries(rows, disk_rows)

    def stats(self) -> StoreStats:
        """Hit and miss counters and what each tier holds now."""
        disk = self._disk
        disk_used = disk_budget = disk_entries = disk_evictions = 0
        if disk is not None and not self._closed:
            disk_used, disk_budget = disk.used_bytes, disk.budget_bytes
            disk_entries, disk_evictions = len(disk), disk.evictions
        with self._lock:
            c = self._counters
            ram = self._ram
            ram_evictions = 0 if ram is None else ram.evictions
            return StoreStats(
                hits=c.hits,
                misses=c.misses,
                ram_hits=c.ram_hits,
                disk_hits=c.disk_hits,
                ram_misses=c.ram_misses,
                disk_misses=c.disk_misses,
                ram_used_bytes=0 if ram is None else ram.used_bytes,
                disk_used_bytes=disk_used,
                ram_budget_bytes=0 if ram is None else ram.budget_bytes,
                disk_budget_bytes=disk_budget,
                ram_entries=0 if ram is None else len(ram),
                disk_entries=disk_entries,
                evictions=ram_evictions + disk_evictions,
                ram_evictions=ram_evictions,
                disk_evictions=disk_evictions,
                spills=c.spills,
                promotions=c.promotions,
                dropped=c.dropped,
                write_errors=c.write_errors,
                pending_write_bytes=0 if self._writes is None else self._writes.outside_ram_bytes(),
            )

    def flush(self) -> None:
        """Wait until every write queued so far has reached the disk (or failed with a warning)."""
        if self._writes is not None:
            self._writes.flush()

    def check(
        self, repair: bool = True, *, verify: bool = False, grace_seconds: float | None = None
    ) -> CheckReport:
        """Compare the disk index with the files and, with `repair`, remove what is broken.

        `verify` also reads and verifies every file; temporary and orphan files younger than
        `grace_seconds` (default: 10 minutes) are left to the writers that may still own them. Waits
        for queued writes first. Returns a report (`ok`, `problems`, and the names found);
        InvalidArgument for a store without a disk tier.
        """
        if self._disk is None:
            raise InvalidArgument("this store has no disk tier to check")
        self._check_open()
        self.flush()
        if grace_seconds is None:
            return self._disk.check(repair, verify=verify)
        return self._disk.check(repair, verify=verify, grace_seconds=grace_seconds)

    def close(self) -> None:
        """Flush, leave every RAM entry on disk (when the disk tier is on) and release the tiers.

        Once closed, no get or lookup promotes into RAM: what RAM holds at the final write-out is
        what it held when close began, less evictions already queued as writes.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        _open_stores.discard(self)
        disk, ram, writes = self._disk, self._ram, self._writes
        if writes is not None:
            writes.stop()
        if disk is not None:
            if ram is not None:
                with self._lock:
                    held = ram.snapshots()  # least valuable first: the most valuable stay
                for snapshot in held:
                    if not self._disk_call("contains", disk.__contains__, snapshot.key, default=True):
                        self._write_to_disk(snapshot)
            disk.close()
        if ram is not None:
            with self._lock:
                ram.close()

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "RAM only" if self._directory is None else str(self._directory)
        return f"SnapshotStore({where})"

    # -- reading ------------------------------------------------------------------------------------

    def _peek_memory(self, key: SnapshotKey) -> Snapshot | None:
        """What RAM or the write queue holds under `key`, without marking it as used or counting."""
        if not isinstance(key, SnapshotKey):
            raise InvalidArgument(f"key must be a SnapshotKey, got {type(key).__name__}")
        self._check_open()
        with self._lock:
            snapshot = None if self._ram is None else self._ram.peek(key)
            if snapshot is None and self._writes is not None:
                snapshot = self._writes.get(key)
        return snapshot

    def _get_memory(self, key: SnapshotKey, *, count_miss: bool = True) -> Snapshot | None:
        """RAM, else a snapshot waiting for its disk write; counts a hit. Call with the lock held."""
        snapshot = None if self._ram is None else self._ram.get(key)
        if snapshot is None and self._writes is not None:
            snapshot = self._writes.get(key)
        if snapshot is None:
            if count_miss and self._ram is not None:
                self._counters.ram_misses += 1
            return None
        self._counters.hits += 1
        # Without a RAM tier, a snapshot still waiting for its write counts for the disk.
        if self._ram is not None:
            self._counters.ram_hits += 1
        else:
            self._counters.disk_hits += 1
        return snapshot

    def _get_disk(self, key: SnapshotKey, epoch: int, *, count_miss: bool = True) -> Snapshot | None:
        """Read `key` from disk and promote it into RAM; counts a disk hit or miss."""
        disk = self._disk
        if disk is None:
            return None
        found: Snapshot | Miss | None = self._disk_call("get", disk.read, key, default=None)
        snapshot = found if isinstance(found, Snapshot) else None
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
            self._promote(snapshot, epoch)
        if self._writes is not None and not self._writes.background:
            self._writes.drain()  # spills of the promotion's evictions
        return snapshot

    def _promote(self, snapshot: Snapshot, epoch: int) -> None:
        """Copy a disk hit into RAM. Call with the lock held.

        Never once close() began (its final write-out would miss what the promotion evicts), nor
        after a remove() since the read began (the promotion would undo it).
        """
        ram, key = self._ram, snapshot.key
        if ram is None or self._closed or epoch != self._remove_epoch or key in ram:
            return
        if ram.put(snapshot):
            self._counters.promotions += 1
            if not key.is_block:
                self._memory_index.add(key, rolling_hash(snapshot.tokens))
            self._on_disk.add(key)
        self._handle_evictions()

    def _count_miss(self) -> None:
        """A lookup that found nothing anywhere. Call with the lock held."""
        self._counters.misses += 1
        if self._ram is not None:
            self._counters.ram_misses += 1
        if self._disk is not None:
            self._counters.disk_misses += 1

    def _on_disk_change(self, change: Change) -> None:
        """A committed disk transaction of ours: the catalogs follow it, and RAM keys whose disk
        copy it removed (evicted, replaced) are no longer known to be on disk."""
        self._catalogs.apply(change)
        if change.removed:
            with self._lock:
                for row in change.removed:
                    with contextlib.suppress(InvalidArgument):  # a row no put could have written
                        self._on_disk.discard(row.key())

    # -- writing ------------------------------------------------------------------------------------

    def _handle_evictions(self) -> None:
        """Spill what the RAM tier just evicted, unless the disk holds it already. Lock held."""
        evicted = self._evicted[:]
        self._evicted.clear()
        writes = self._writes
        for snapshot in evicted:
            key = snapshot.key
            if writes is None:
                self._memory_index.remove(key)
            elif writes.mark_spill(key):
                continue  # its write is still queued: that write is now the spill
            elif key in self._on_disk:
                self._on_disk.discard(key)
                self._memory_index.remove(key)  # the disk's catalog serves it from now on
            else:
                writes.add(snapshot, spill=True)

    def _holds(self, job: PendingWrite) -> bool:
        """Whether RAM holds the very snapshot `job` writes. Lock held."""
        return self._ram is not None and self._ram.peek(job.snapshot.key) is job.snapshot

    def _settle_write(self, job: PendingWrite, stored: bool, current: bool) -> None:
        """A queued write is done. Lock held."""
        key = job.snapshot.key
        if stored and job.spill:
            self._counters.spills += 1
        if not current:
            return  # a newer snapshot under the key waits for its own write
        if self._holds(job):
            if stored:
                self._on_disk.add(key)
            return
        if self._ram is None or key not in self._ram:
            self._memory_index.remove(key)
            if not stored:
                self._counters.dropped += 1

    def _undo_write(self, key: SnapshotKey) -> None:
        """remove() ran while `key` was being written: remove what the write left on disk."""
        disk = self._disk
        assert disk is not None
        self._disk_call("remove", disk.remove, key, default=False)
        self._catalogs.forget(key)

    def _write_to_disk(self, snapshot: Snapshot) -> bool:
        """disk.put with failures logged and counted; True if the disk kept it."""
        disk = self._disk
        assert disk is not None
        try:
            stored = disk.put(snapshot)
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

    def _drop(self, snapshot: Snapshot, why: str) -> None:
        log.warning(
            "snapcache: dropped snapshot %s (%d bytes): %s", snapshot.key.id[:16], snapshot.nbytes, why
        )
        with self._lock:
            self._counters.dropped += 1

    def _disk_call(self, what: str, call: Callable[..., Any], *args: Any, default: Any) -> Any:
        """A read of the disk tier: an unavailable disk is a logged miss, never an exception."""
        try:
            return call(*args)
        except (StoreUnavailable, OSError) as exc:
            log.warning("snapcache: disk %s failed: %s", what, exc)
            return default

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store is closed")


# Stores still open at interpreter exit are closed then, so that queued writes reach the disk.
_open_stores: weakref.WeakSet[SnapshotStore] = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:
            log.exception("snapcache: closing a store at exit failed")
