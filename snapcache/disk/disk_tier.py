"""The disk tier: snapshots as compressed files under a byte budget, indexed in SQLite, shared by
processes.

A put writes a temporary file, fsyncs it, renames it to a fresh name, fsyncs the directory and only
then commits the row; files it replaced or evicted are deleted after the commit. Readers tolerate a
file vanishing under them (a miss). A file that fails verification is deleted, logged, and a miss;
an intact file authenticated under another secret (or none) is a miss that stays, since processes
configured otherwise may share the directory. Opening the tier (under the directory's lock) rebuilds
a damaged or missing index from the files and reclaims debris of interrupted writes (disk.repair).
The directory's layout is in disk.files; the file formats in formats.snapshot_file and
formats.pack_file; reading a file back and checking it in disk.reads, and what a failed read does to
the index's rows in disk.index_reads; checking a put and cutting a save into packs in disk.puts; what
goes (rows dropped, files deleted, `check`, the budget recorded at opening) in disk.removals; the uses
recorded in disk.uses; entries and catalogs in disk.listing. This module holds what ties them
together: the puts' transactions under the budget, and the reads.

`put_many` writes the blocks of one save (block keys, one priority, no logits) into pack files of up
to PACK_MEMBERS blocks (formats.pack_file): one file, one fsync and one header for many blocks, so that a
restore opens, reads and checks one header per pack rather than per block. A damaged block drops its
own row; its pack goes with its last row, and eviction frees whole files (disk.index).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from snapcache.disk import files
from snapcache.disk.auth import OtherAuthentication
from snapcache.disk.cache_dir import prepare_cache_dir
from snapcache.disk.disk_listing import Catalog, entries
from snapcache.disk.files import FILES_DIR, INDEX_NAME, LOCK_NAME, QUARANTINE_DIR, TEMP_PREFIX
from snapcache.disk.index import Change, DiskIndex, IndexRow
from snapcache.disk.index_reads import IndexedReads, Miss
from snapcache.disk.puts import checked, pack_rows, pack_runs
from snapcache.disk.reads import StoredFiles
from snapcache.disk.removals import Removals
from snapcache.disk.repair import DEFAULT_GRACE_S, CheckReport, open_or_rebuild, reclaim_debris
from snapcache.disk.uses import record_uses
from snapcache.errors import InvalidArgument, StoreUnavailable
from snapcache.formats import codec
from snapcache.formats.compression import DEFAULT_COMPRESSION, CodecChoice, Compression, PayloadSource
from snapcache.formats.pack_file import (
    PACK_MEMBERS,
    PACK_STATE_BYTES,
    EncodedPack,
    PackTooLarge,
    encode_pack,
)
from snapcache.formats.snapshot_file import EncodedFile, Encoding, mac_key
from snapcache.key import SnapshotKey, TokenArray, rolling_hash, validate_budget
from snapcache.snapshot import Buffer, Snapshot
from snapcache.tier_contract import CatalogRow, EntryInfo, TierName

logger = logging.getLogger("snapcache")

# The budget of a directory that records none, for a store given none.
DEFAULT_BUDGET_BYTES = 8 << 30

__all__ = [
    "DEFAULT_GRACE_S",
    "FILES_DIR",
    "INDEX_NAME",
    "PACK_MEMBERS",
    "QUARANTINE_DIR",
    "TEMP_PREFIX",
    "Catalog",
    "CatalogRow",
    "Change",
    "CheckReport",
    "DiskTier",
    "Miss",
]


class DiskTier:
    """The disk tier: see the module docstring.

    `on_change` is called after each transaction of this object that added or removed rows (outside
    any lock of the tier), with the catalog generation just before and after it: a reader holding a
    catalog of the `before` generation can apply the change and know it current at `after`.
    """

    name: TierName = "disk"

    def __init__(
        self,
        directory: Path,
        budget_bytes: int | None,
        *,
        secret: bytes | None = None,
        allow_shared_dir: bool = False,
        compression: Compression = DEFAULT_COMPRESSION,
        compression_level: int = codec.DEFAULT_LEVEL,
        shuffle: bool = codec.DEFAULT_SHUFFLE,
        on_change: Callable[[Change], None] | None = None,
        debris_grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        if budget_bytes is not None:
            budget_bytes = validate_budget("budget_bytes", budget_bytes)
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise InvalidArgument("secret must be non-empty bytes or None")
        codecs = CodecChoice(compression, level=compression_level, shuffle=shuffle)
        self._mac_key = None if secret is None else mac_key(secret)
        self.directory = prepare_cache_dir(Path(directory), allow_shared_dir)
        self._files = self.directory / FILES_DIR
        try:
            self._files.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {self._files}: {exc.strerror or exc}") from None
        self._other_authentication = OtherAuthentication(self._files, self._mac_key)
        with files.open_lock(self.directory / LOCK_NAME):
            self._index = open_or_rebuild(self.directory, self._mac_key)
            try:
                reclaim_debris(self._index, self._files, debris_grace_s)
            except StoreUnavailable as exc:  # the store still works; check() can try again
                logger.warning("could not reclaim debris in %s: %s", self._files, exc)
        self._removals = Removals(self._index, self._open_index, self._files, on_change)
        self._store_id = self._index.store_id
        self._encoding = Encoding(self._store_id, codecs, self._mac_key)
        self._stored = StoredFiles(self._files, mac_key=self._mac_key, store_id=self._store_id)
        self._reads = IndexedReads(
            self._open_index,
            self._stored,
            self._other_authentication,
            discard=lambda row, reason, unlink: self._removals.discard(row, reason, unlink=unlink),
            announce=self._removals.announce,
        )
        self._lock = threading.Lock()
        self._closed = False
        self._budget, self._evictions = self._removals.settle_budget(budget_bytes, DEFAULT_BUDGET_BYTES)
        # Where puts get their compressed states: a store with a remote tier shares them with it.
        self.payloads: PayloadSource | None = None

    # -- the Tier protocol -------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        """The budget in force: the one given, else the directory's recorded one, else 8 GiB."""
        return self._budget

    @property
    def used_bytes(self) -> int:
        """Sum of the sizes of the committed snapshot files."""
        return self._open_index().used_bytes()

    @property
    def evictions(self) -> int:
        """Entries this object evicted to make room."""
        return self._evictions

    def __len__(self) -> int:
        return self._open_index().count()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, SnapshotKey) and self._open_index().get(key.id) is not None

    def put(self, snapshot: Snapshot) -> bool:
        """Write `snapshot` durably; False (nothing changed) when it does not fit.

        It does not fit when its file exceeds the whole budget, or when room for it would take
        evicting a snapshot of higher priority (`tier.may_evict`). Raises StoreUnavailable when the
        file cannot be written (a full disk, say); then no partial file and no row remain. A block
        held in a pack is not written again: a higher priority is recorded on its row.
        """
        index = self._open_index()
        snapshot = checked(snapshot)
        key = snapshot.key
        if key.is_block:
            current = index.get(key.id)
            if (
                current is not None
                and files.is_pack_name(current.file_name)
                and self._other_authentication.held(current)
            ):
                if snapshot.priority > current.priority:
                    index.set_priority(key.id, current.file_name, snapshot.priority)
                return True
        encoded = self._encoding.encode(snapshot, self.payloads)
        if not self._admits([key.id], snapshot.priority, encoded.size):
            return False
        file_name = files.new_file_name(key)
        row = IndexRow.of(
            key,
            rolling_hash=rolling_hash(snapshot.tokens),
            priority=snapshot.priority,
            file_name=file_name,
            file_bytes=encoded.size,
            state_bytes=encoded.state_bytes,
            created_at=snapshot.created_at,
            last_used_at=time.time(),
        )
        return self._commit_file(file_name, encoded, [row])

    def put_many(self, snapshots: Sequence[Snapshot]) -> list[bool]:
        """`put` each of `snapshots`; whether each was kept. Runs of blocks of one priority that the
        tier does not hold yet go into pack files together, each pack kept or not as a whole. A
        packed block's last use is when it was made (`created_at`), not when it was written:
        `SnapshotStore.put_many` dates a save's first blocks as the most recent, as a restore's
        `touch` does, so that a prompt's last blocks are evicted before its first ones."""
        index = self._open_index()
        snapshots = [checked(snapshot) for snapshot in snapshots]
        held = index.get_many([s.key.id for s in snapshots if s.key.is_block])
        now = time.time()
        kept: list[bool] = []
        for run in pack_runs(snapshots, held, min(PACK_STATE_BYTES, self._budget // 8)):
            kept += self._put_run(run, [min(now, s.created_at) for s in run])
        return kept

    def _put_run(
        self, run: list[Snapshot], used_at: list[float], payloads: list[Buffer] | None = None
    ) -> list[bool]:
        """Write `run` as one pack (one snapshot: its own file), its rows' uses recorded at
        `used_at`; whether each was kept. A run whose header would be too large is halved."""
        if len(run) < 2:
            return [self.put(snapshot) for snapshot in run]
        encoding, source = self._encoding, self.payloads
        state_codec = encoding.codec_for(run[0])  # one model: one kind of state
        if payloads is None and source is not None:
            payloads = [source(snapshot, state_codec) for snapshot in run]
        try:
            encoded = encode_pack(
                run,
                store_id=encoding.store_id,
                state_codec=state_codec,
                mac_secret=encoding.mac_secret,
                payloads=payloads,
            )
        except PackTooLarge:  # long scopes: fewer blocks per pack
            half = len(run) // 2
            first, rest = (None, None) if payloads is None else (payloads[:half], payloads[half:])
            return self._put_run(run[:half], used_at[:half], first) + self._put_run(
                run[half:], used_at[half:], rest
            )
        if not self._admits([s.key.id for s in run], run[0].priority, encoded.size):
            return [False] * len(run)
        file_name = files.new_pack_name()
        rows = pack_rows(run, encoded, file_name, used_at)
        return [self._commit_file(file_name, encoded, rows)] * len(run)

    def _admits(self, key_ids: list[str], priority: int, file_bytes: int) -> bool:
        """Whether a file of `file_bytes` for `key_ids` at `priority` fits the budget, evicting only
        lower priorities; decided again when its rows commit (another process may write meanwhile)."""
        return file_bytes <= self._budget and self._open_index().admits(
            key_ids, priority, file_bytes, self._budget
        )

    def _commit_file(self, file_name: str, encoded: EncodedFile | EncodedPack, rows: list[IndexRow]) -> bool:
        """Write the file, then commit its rows (the commit point); False when they no longer fit."""
        index = self._open_index()
        path = self._files / file_name
        files.write_file(self._files, file_name, encoded)
        try:
            change = index.put_file(rows, self._budget)
        except BaseException:
            files.unlink(path)
            raise
        if change is None:  # too large, or no room without evicting a higher priority
            files.unlink(path)
            return False
        self._removals.unlink_files(change.freed)
        added = {row.key_id for row in rows}
        for row in rows:
            self._other_authentication.replaced(row.key_id)
        evicted = sum(1 for old in change.removed if old.key_id not in added)
        if evicted:
            with self._lock:
                self._evictions += evicted
            logger.debug("disk tier evicted %d snapshot(s)", evicted)
        self._removals.announce(change)
        return True

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The verified snapshot under `key`, or None; a file failing verification is deleted."""
        found = self.read(key)
        return found if isinstance(found, Snapshot) else None

    def read(self, key: SnapshotKey, *, touch: bool = True) -> Snapshot | Miss:
        """Like `get`, but a miss says why: whether asking again later may find the snapshot.

        `touch=False` leaves recording the use to a later `touch` of many keys at once.
        """
        return self._reads.read(key, touch=touch)

    def read_many(self, keys: Sequence[SnapshotKey]) -> list[Snapshot | Miss]:
        """`read(key, touch=False)` of each of `keys`, in order: the rows come from one index query,
        and the files are read, verified and decoded on the codec's threads (a restore's blocks,
        whose uses `touch` then records at once)."""
        found = self.lend_many(keys, None, keep=[True] * len(keys))
        return [Miss.ABSENT if result is None else result for result in found]

    def lend_many(
        self,
        keys: Sequence[SnapshotKey],
        use: Callable[[int, memoryview], None] | None,
        *,
        keep: Sequence[bool],
    ) -> list[Snapshot | Miss | None]:
        """Like `read_many`, and each state read is handed to `use(i, state)` on the thread that
        decoded it. The state of key i is decoded into new memory and returned when `keep[i]`, else
        into that thread's reused buffer (valid only until `use` returns), and None is returned for
        it: a block that is copied into an assembled blob at once needs no memory of its own.

        An exception from `use` is raised here, after every thread has ended."""
        return self._reads.lend_many(keys, use, keep=keep)

    def touch(self, keys: list[SnapshotKey], *, patient: bool = False) -> None:
        """Record a use of each of `keys` in one transaction, the first as the most recent. A writer
        in another process makes it give up after a short wait (50 ms); `patient` tries again for up
        to 2 s, for a caller that nothing waits for (see `store.deferred_uses`)."""
        record_uses(self._open_index(), keys, patient=patient)

    def held_priority(self, key: SnapshotKey) -> int | None:
        """The priority recorded for `key`, or None when the index has no row for it or, with a
        secret, its file is not authenticated under it (a put under the secret replaces it then; a
        store without a secret never replaces signed files). See `OtherAuthentication.held`."""
        row = self._open_index().get(key.id)
        if row is None or not self._other_authentication.held(row):
            return None
        return row.priority

    def stored_tokens(self, key: SnapshotKey) -> TokenArray | None:
        """The tokens in the checked header of `key`'s file, without reading its payload; None if absent
        or damaged (the damage is left for a read or `check` to deal with)."""
        try:
            row = self._open_index().get(key.id)
        except StoreUnavailable:
            return None
        return None if row is None else self._stored.tokens(row, key)

    def remove(self, key: SnapshotKey) -> bool:
        return self._removals.remove(key.id)

    def entries(self, model_fingerprint: str | None = None, scope: str | None = None) -> list[EntryInfo]:
        """Committed entries, optionally only those of one fingerprint and/or scope."""
        return entries(self._open_index(), model_fingerprint, scope)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._index.close()

    # -- beyond the protocol -------------------------------------------------------------------

    def data_version(self) -> int:
        """The catalog generation: it grows whenever rows are added, replaced or removed, by this or
        any other process, and only then (recording a use leaves it alone)."""
        return self._open_index().generation()

    def catalog(self, model_fingerprint: str, scope: str) -> Catalog:
        """The lookup fields of every entry of one fingerprint and scope, as raw rows (no keys built)."""
        generation, rows = self._open_index().catalog(model_fingerprint, scope)
        return Catalog(generation, rows)

    def check(
        self, repair: bool = True, *, verify: bool = False, grace_seconds: float = DEFAULT_GRACE_S
    ) -> CheckReport:
        """Compare the index with the files; with `repair`, delete what is broken or left over.

        Temporary and orphan files younger than `grace_seconds` are left alone (another process may
        be writing them). `verify` also reads and verifies every file.
        """
        verdict = self._stored.verdict if verify else None
        return self._removals.check(
            self.directory, repair=repair, verdict=verdict, grace_seconds=grace_seconds
        )

    # -- internals -----------------------------------------------------------------------------

    def _open_index(self) -> DiskIndex:
        if self._closed:
            raise StoreUnavailable(f"the disk tier on {self.directory} is closed")
        return self._index
