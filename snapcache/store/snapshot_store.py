"""SnapshotStore: the façade over the RAM, disk and remote tiers — put, get, longest-prefix lookup,
spill, promote.

The façade checks arguments (once, with store.inputs), opens (store.opening) and closes the store,
and steps through its pieces: the puts (store.local_puts; compressed once for the disk and the
remote tier, store.shared_payloads); what memory holds and on what
terms (store.memory: the RAM tier, the write-behind queue to the disk, admission and spills); reads
walking the tiers behind one contract (store.reads, store.read_tiers); the writes to the disk
(store.disk_writes), the disk tier (disk.disk_tier) and the store's copies of its catalogs
(store.catalogs); what it reports (store.report, store.entry_rows); flushing and closing
(store.closing). It stays whole at about 460 lines: it is the public surface, one short method per
public call with the docstring a caller reads, each handing the work to those modules.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import numpy.typing as npt

from snapcache.errors import InvalidArgument, StoreUnavailable
from snapcache.formats.compression import COMPRESSIONS, Compression
from snapcache.key import (
    SnapshotKey,
    TokenArray,
    Tokens,
    as_token_array,
    validate_budget,
    validate_fingerprint,
    validate_scope,
)
from snapcache.snapshot import Buffer, Snapshot
from snapcache.store.catalogs import DiskCatalogs
from snapcache.store.closing import close_tiers, flush_tiers
from snapcache.store.deferred_puts import DeferredPuts
from snapcache.store.entry_rows import disk_figures, follow_disk, local_entries
from snapcache.store.inputs import (
    DEFAULT_DIRECTORY,
    Default,
    check_block_keys,
    check_key,
    resolve_compression,
)
from snapcache.store.local_puts import LocalPuts, put_everywhere, snapshot_to_put
from snapcache.store.memory import StoreMemory
from snapcache.store.opening import DiskParts, close_at_exit, closed_already, open_disk, open_tiers_args
from snapcache.store.reads import TierReads, disk_call
from snapcache.store.report import Counters, StoreEntry, StoreStats, store_stats
from snapcache.store.shared_payloads import share_payloads
from snapcache.tier_contract import EntryInfo, TierName, in_eviction_order

if TYPE_CHECKING:
    from snapcache.disk import Change, CheckReport, DirectoryReport
    from snapcache.remote import RemoteStats, RemoteTier

_E = TypeVar("_E", bound=EntryInfo)

__all__ = ["DEFAULT_DIRECTORY", "SnapshotStore", "StoreEntry", "StoreStats"]

log = logging.getLogger("snapcache")


class SnapshotStore:
    """Snapshots in RAM and on disk, found by exact key or by longest stored prefix of a prompt.

    `directory` omitted: the user cache directory (or `SNAPCACHE_DIR`); `None`: RAM only.
    `ram_bytes=0` keeps nothing in RAM (disk only). `disk_bytes` is recorded in the directory as its
    budget (evicting down to it at once); `None` uses the budget recorded there, else 8 GiB, so that
    a tool opening the directory does not shrink what an application keeps in it. `secret`
    (default: `SNAPCACHE_SECRET`) signs the files so that ones written without it are refused.
    Writes to disk, and the uses of disk entries a read records, happen on background threads unless
    `background_writes=False`; `flush()` waits for them and `close()` leaves every RAM entry on disk
    (save those the disk refuses). Opening
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

    `remote` (default: `SNAPCACHE_REMOTE`) adds a tier shared by machines: a redis:// URL, or a
    `RemoteTier` for other settings (the store closes it). Every put is also sent there in the
    background; a get or lookup that misses locally asks it, and a remote hit is copied into the
    local tiers. `remote_budget_bytes` bounds what a URL's tier holds in Redis (default 4 GiB).
    `held_priority`, `stored_tokens` and `entries` answer for the local tiers alone.
    A remote fault is a miss (see `remote.tier`), never an exception.

    `compression` (default: `SNAPCACHE_COMPRESSION`, else "auto") is how the disk tier stores
    states: "auto" stores a model's states raw unless zstd saves a quarter of their bytes (f16 K/V
    saves a sixth, and reads at the disk's speed raw), "zstd" always compresses, "none" never does.
    Files written under any setting read under every other; the remote tier always compresses.
    """

    # The values `compression` takes.
    COMPRESSIONS: tuple[Compression, ...] = COMPRESSIONS

    def __init__(
        self,
        directory: str | os.PathLike[str] | Default | None = DEFAULT_DIRECTORY,
        *,
        ram_bytes: int = 512 << 20,
        disk_bytes: int | None = None,
        secret: bytes | str | None = None,
        allow_shared_dir: bool = False,
        background_writes: bool = True,
        remote: str | RemoteTier | None = None,
        remote_budget_bytes: int | None = None,
        compression: Compression | None = None,
    ) -> None:
        ram_bytes = validate_budget("ram_bytes", ram_bytes)
        if disk_bytes is not None:
            disk_bytes = validate_budget("disk_bytes", disk_bytes)
        self._compression = resolve_compression(compression)
        path, mac_secret, self._remote = open_tiers_args(
            directory, ram_bytes, disk_bytes, secret, remote, remote_budget_bytes
        )

        self._lock = threading.Condition(threading.Lock())
        self._counters = Counters()
        self._closed = False
        self._memory = StoreMemory(ram_bytes, self._counters, closed=lambda: self._closed)
        self._ram = self._memory.ram
        self._memory_index = self._memory.index
        self._directory = path
        self._catalogs = DiskCatalogs(self._lock)
        parts = DiskParts()
        if path is not None:
            parts = open_disk(
                path,
                disk_bytes,
                ram_bytes,
                secret=mac_secret,
                allow_shared_dir=allow_shared_dir,
                compression=self._compression,
                background=background_writes,
                lock=self._lock,
                memory=self._memory,
                catalogs=self._catalogs,
                counters=self._counters,
                on_change=self._on_disk_change,
            )
        self._disk, self._writes, self._disk_writes = parts.disk, parts.writes, parts.disk_writes
        self._uses = parts.uses
        self._puts = LocalPuts(
            self._lock, self._memory, self._counters, self._disk, self._writes, lambda: self._closed
        )
        self._reads = TierReads(
            self._lock,
            self._memory,
            self._disk,
            self._catalogs,
            self._counters,
            remote=self._remote,
            copy_in=self._puts.copy_in,
            uses=self._uses,
        )
        # With a disk and a remote tier, a put is compressed once for both.
        self._payloads = share_payloads(self._disk, self._remote)
        self._deferred = DeferredPuts(background=background_writes)
        close_at_exit(self)

    # -- public API ---------------------------------------------------------------------------------

    @property
    def directory(self) -> Path | None:
        """The disk tier's directory, or None for a RAM-only store."""
        return self._directory

    @property
    def compression(self) -> Compression:
        """How the disk tier stores states: "auto", "zstd" or "none" (see formats.compression)."""
        return self._compression

    @staticmethod
    def default_directory() -> Path:
        """Where a store opened without a directory keeps its files: $SNAPCACHE_DIR, else the user
        cache directory."""
        from snapcache.disk import default_cache_dir

        return Path(default_cache_dir())

    @staticmethod
    def inspect_directory(
        directory: str | os.PathLike[str] | None = None, *, allow_shared_dir: bool = False
    ) -> DirectoryReport:
        """What `directory` (default: `default_directory()`) holds and whether a store could open
        there, found without creating or changing anything."""
        from snapcache.disk import inspect_store_dir

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
        *,
        owned: bool = False,
    ) -> Snapshot | None:
        """Store a copy of `state_bytes` under `key`; None if no tier keeps it.

        `owned`: the caller hands `state_bytes` over and never writes it again, so the store keeps it
        without a copy (so it does `bytes`, which nobody can write).

        With background writes, a snapshot RAM does not keep is handed to the disk writer and
        returned; should the disk refuse it too, it is dropped then with a logged warning.
        Raises KeyMismatch when `tokens` do not hash to `key`.
        """
        snapshot = snapshot_to_put(key, tokens, state_bytes, priority, logits, time.time(), owned=owned)
        self._check_open()
        return put_everywhere(self._puts, [snapshot], self._remote, self._payloads)[0]

    def put_many(
        self, items: Sequence[tuple[SnapshotKey, Tokens, Buffer, int]], *, owned: bool = False
    ) -> list[Snapshot | None]:
        """`put(key, tokens, state_bytes, priority, owned=owned)` of each of `items`, queued for the
        disk together: the blocks of one save then go into one pack file (up to 64 blocks or 16 MiB
        each).

        Each item is dated a microsecond before the one before it, so that the first count as the
        most recently used (as a restore records a prompt's blocks): a prompt's last blocks are
        evicted first."""
        now = time.time()
        snapshots = [
            snapshot_to_put(key, tokens, state_bytes, priority, None, now - i * 1e-6, owned=owned)
            for i, (key, tokens, state_bytes, priority) in enumerate(items)
        ]
        self._check_open()
        return put_everywhere(self._puts, snapshots, self._remote, self._payloads)

    def defer(self, job: Callable[[], object]) -> None:
        """Run `job`, which makes puts into this store, off the caller's path: on the store's own
        thread, after the jobs deferred before it; now with `background_writes=False`.

        Every other call of the store waits for the jobs deferred before it, so the store answers as
        if `job` had run here: a save hands over the copying of a capture it owns and returns. A job
        that raises is logged; a process that dies first loses it like a write in flight."""
        self._check_open()
        self._deferred.add(job)

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot stored under exactly `key` (RAM first, then disk), or None."""
        self._check_key(key)
        return self._reads.get(key)

    def held_priority(self, key: SnapshotKey) -> int | None:
        """The priority of what is stored under `key`, or None: no load, no hit counted, nothing
        marked as used (for skipping what a put would store again)."""
        self._check_key(key)
        return self._reads.held_priority(key)

    def get_block(self, key: SnapshotKey) -> tuple[Snapshot, TierName] | None:
        """The block stored under `key` and the tier that served it, or None: `get_blocks` of one."""
        found = self.get_blocks([key])
        return found[0] if found else None

    def get_blocks(self, keys: Sequence[SnapshotKey]) -> list[tuple[Snapshot, TierName]]:
        """The blocks stored under `keys`, each with the tier that served it, up to the first that is
        missing (or fails to read); promoted like a get, but not counted as hits or misses (a restore
        counts once, not per block). Those on disk are read together, on the codec's threads; their
        uses are recorded by `touch_blocks`, for many blocks at once."""
        self._check_block_keys(keys)
        return self._reads.get_blocks(keys)

    def copy_blocks(
        self,
        keys: Sequence[SnapshotKey],
        copy: Callable[[int, memoryview], None],
        *,
        keep: Callable[[int, memoryview], None] | None = None,
    ) -> list[TierName]:
        """Hand the state of each block under `keys` to `copy(i, state)` for a restore to copy from,
        up to the first block that is missing (or fails to read); return the tier that served each
        one handed over. Their uses are recorded as `touch_blocks` records them.

        `copy` must be done with `state` when it returns: a block read from disk is decoded into a
        buffer that is reused, not into memory of its own. Calls come from the codec's threads,
        several at once for different blocks (blocks after a missing one may be handed over too);
        an exception from `copy` is raised here. A block read from disk is promoted into RAM only
        when a restore read it from disk before: the first restore after a restart, whose prefix
        then stays in the model's context, neither waits for nor fills RAM.

        `keep`, when given, takes instead of `copy` each state whose bytes stay as they are after it
        returns (a block RAM holds, or one fetched from the remote tier for this call): it may hold
        on to them and copy them later, all together, in the order that suits it. Those calls come
        from this thread."""
        self._check_block_keys(keys)
        return self._reads.copy_blocks(keys, copy, keep)

    def touch_blocks(self, keys: list[SnapshotKey]) -> None:
        """Record a use of the blocks `get_blocks` served, the first of `keys` as the most recent (so
        that the first blocks of a prompt, which every longer prefix needs, are evicted last)."""
        self._deferred.wait()
        self._reads.touch_blocks(keys)

    def stored_tokens(self, key: SnapshotKey) -> TokenArray | None:
        """The tokens of the snapshot under `key`, without loading its state: no hit is counted and
        nothing is promoted (for explaining a miss). None if absent or unreadable."""
        self._check_key(key)
        return self._reads.stored_tokens(key)

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
        return self._reads.longest_prefix(model_fingerprint, scope, query)

    def remove(self, key: SnapshotKey) -> bool:
        """Forget `key` in every tier; True if any tier held it."""
        self._check_key(key)
        with self._lock:
            found = self._memory.forget(key)
        if self._disk is not None:
            found = disk_call("remove", self._disk.remove, key, default=False) or found
            self._catalogs.forget(key)
        if self._remote is not None:
            found = self._remote.remove(key) or found
        return found

    def entries(
        self, model_fingerprint: str | None = None, scope: str | None = None, *, blocks: bool = False
    ) -> list[EntryInfo]:
        """One row per stored snapshot (a StoreEntry), optionally only of one fingerprint and/or scope.

        With `blocks`, also one row per shared block (`key.is_block`) of that fingerprint and scope.
        """
        self._check_open()
        return local_entries(self._lock, self._memory, self._disk, model_fingerprint, scope, blocks)

    def stats(self) -> StoreStats:
        """Hit and miss counters and what each tier holds now."""
        self._deferred.wait()
        figures = disk_figures(None if self._closed else self._disk)
        with self._lock:
            pending = 0 if self._writes is None else self._writes.outside_ram_bytes()
            return store_stats(self._counters, self._ram, figures, pending)

    def flush(self) -> None:
        """Wait until every write queued so far has reached the disk and the remote tier, and every
        use recorded so far the disk index (or failed with a warning)."""
        self._deferred.wait()
        flush_tiers(writes=self._writes, uses=self._uses, remote=self._remote)

    def remote_stats(self) -> RemoteStats | None:
        """What the remote tier holds (one round trip) and how it fared; None without one."""
        return None if self._remote is None else self._remote.stats()

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
        self._deferred.stop()  # its puts land before the store closes to them
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        closed_already(self)
        close_tiers(
            self._lock,
            ram=self._ram,
            disk=self._disk,
            writes=self._writes,
            uses=self._uses,
            disk_writes=self._disk_writes,
            remote=self._remote,
        )

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

    # -- wiring and checks ---------------------------------------------------------------------------

    def _on_disk_change(self, change: Change) -> None:
        """A committed disk transaction of ours: the catalogs and what memory knows follow it."""
        follow_disk(change, self._lock, self._catalogs, self._memory)

    def _check_open(self) -> None:
        """The store still open, once the puts deferred before this call are done (see `defer`)."""
        self._deferred.wait()
        if self._closed:
            raise StoreUnavailable("the store is closed")

    def _check_block_keys(self, keys: Sequence[SnapshotKey]) -> None:
        """Block key arguments of a read, and the store still open."""
        check_block_keys(keys)
        self._check_open()

    def _check_key(self, key: SnapshotKey) -> None:
        """A key argument of a read, and the store still open."""
        check_key(key)
        self._check_open()
