"""Snapshots as compressed files under a byte budget, indexed in SQLite, shared by processes.

Directory layout::

    index.sqlite3          one row per snapshot; a committed row is the commit point of a put
    index.sqlite3.lock     held while a process opens (and, if need be, rebuilds) the index
    snapshots/<key id>-<random>.snap
    snapshots/.tmp-<random>.partial    a write in flight (or left by a crash)
    quarantine/index.sqlite3.<time>    a damaged index, moved aside

A put writes a temporary file, fsyncs it, renames it to a fresh name, fsyncs the directory and only
then commits the row; files it replaced or evicted are deleted after the commit. Readers tolerate a
file vanishing under them (a miss). A file that fails verification is deleted, logged, and a miss;
an intact file authenticated under another secret (or none) is a miss that stays, since processes
configured otherwise may share the directory. A damaged index is moved to quarantine/ and rebuilt
from the headers of the snapshot files, as is a missing one when files exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import logging
import math
import os
import re
import secrets
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snapcache import codec
from snapcache._disk_format import EncodedFile, FileHeader, MacMismatch, decode, encode, mac_key, read_header
from snapcache._disk_index import CatalogRow, Change, DiskIndex, IndexDamaged, IndexRow
from snapcache.cache_dir import prepare_cache_dir
from snapcache.errors import CorruptSnapshot, InvalidArgument, KeyMismatch, StoreUnavailable
from snapcache.key import SnapshotKey, rolling_hash, validate_budget, validate_priority
from snapcache.snapshot import Snapshot
from snapcache.tier import EntryInfo, TierName

logger = logging.getLogger("snapcache")

INDEX_NAME = "index.sqlite3"
LOCK_NAME = INDEX_NAME + ".lock"
FILES_DIR = "snapshots"
QUARANTINE_DIR = "quarantine"
_INDEX_SUFFIXES = ("", "-wal", "-shm", "-journal")
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".partial"
# The budget of a directory that records none, for a store given none.
DEFAULT_BUDGET_BYTES = 8 << 30
# check() leaves younger temp and orphan files alone: another process may be writing them.
DEFAULT_GRACE_S = 600.0
_FILE_NAME = re.compile(r"[0-9a-f]{64}-[0-9a-f]{12}\.snap")
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Files this process found authenticated otherwise: warned about once, not on every lookup.
_MAX_WARNED = 10_000
_warned_unauthenticated: set[str] = set()
_warned_lock = threading.Lock()

__all__ = ["Catalog", "CatalogRow", "Change", "CheckReport", "DiskTier", "Miss"]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What check() found; with `repaired`, every listed problem was removed."""

    entries: int
    missing_files: tuple[str, ...]  # key ids whose row names a file that does not exist
    orphan_files: tuple[str, ...]  # snapshot files no row names
    temp_files: tuple[str, ...]  # temporary files left by interrupted writes
    corrupt_files: tuple[str, ...]  # files failing verification (only with verify=True)
    repaired: bool
    # Intact files failing only their MAC under this tier's secret (only with verify=True): another
    # configuration may own them, so repair keeps them and `ok` does not count them.
    unauthenticated_files: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing needing repair was found."""
        return not (self.missing_files or self.orphan_files or self.temp_files or self.corrupt_files)


class Miss(enum.Enum):
    """Why `DiskTier.read` found no snapshot."""

    ABSENT = "absent"  # no row, or its file is gone
    DISCARDED = "discarded"  # the file failed verification and was removed
    UNAUTHENTICATED = "unauthenticated"  # intact, but written under another secret (or none); kept
    UNAVAILABLE = "unavailable"  # the file or the index could not be read now; may work later

    @property
    def lasting(self) -> bool:
        """True when asking again (without a new put) cannot find the snapshot."""
        return self is not Miss.UNAVAILABLE


@dataclass(frozen=True, slots=True)
class Catalog:
    """The lookup fields of one fingerprint and scope, and the generation they were read at."""

    generation: int
    rows: list[CatalogRow]  # (token_count, prefix_hash, rolling_hash)


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
        compression_level: int = codec.DEFAULT_LEVEL,
        shuffle: bool = codec.DEFAULT_SHUFFLE,
        on_change: Callable[[Change], None] | None = None,
    ) -> None:
        if budget_bytes is not None:
            budget_bytes = validate_budget("budget_bytes", budget_bytes)
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise InvalidArgument("secret must be non-empty bytes or None")
        self._level = codec.validate_level(compression_level)
        self._shuffle = bool(shuffle)
        self._mac_key = None if secret is None else mac_key(secret)
        self.directory = prepare_cache_dir(Path(directory), allow_shared_dir)
        self._files = self.directory / FILES_DIR
        try:
            self._files.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {self._files}: {exc.strerror or exc}") from None
        self._on_change = on_change
        with _open_lock(self.directory / LOCK_NAME):
            self._index = self._open_or_rebuild(self.directory / INDEX_NAME)
        self._store_id = self._index.store_id
        self._lock = threading.Lock()
        self._evictions = 0
        self._closed = False
        self._budget = self._settle_budget(budget_bytes)

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
        """Write `snapshot` durably; False (nothing evicted) when its file exceeds the whole budget.

        Raises StoreUnavailable when the file cannot be written (a full disk, say); then no partial
        file and no row remain.
        """
        index = self._open_index()
        key = snapshot.key
        if not key.matches(snapshot.tokens):
            raise KeyMismatch("the snapshot's tokens do not hash to its key")
        priority = validate_priority(snapshot.priority)
        if type(snapshot.priority) is not int:  # a numpy integer: the header and index want an int
            snapshot = dataclasses.replace(snapshot, priority=priority)
        if not math.isfinite(snapshot.created_at):
            raise InvalidArgument(f"created_at must be a finite time, got {snapshot.created_at!r}")
        encoded = encode(
            snapshot,
            store_id=self._store_id,
            level=self._level,
            shuffle=self._shuffle,
            mac_secret=self._mac_key,
        )
        if encoded.size > self._budget:
            return False
        file_name = f"{key.id}-{secrets.token_hex(6)}.snap"
        path = self._files / file_name
        self._write_file(path, encoded)
        now = time.time()
        row = IndexRow.of(
            key,
            rolling_hash=rolling_hash(snapshot.tokens),
            priority=snapshot.priority,
            file_name=file_name,
            file_bytes=encoded.size,
            state_bytes=encoded.state_bytes,
            created_at=snapshot.created_at,
            last_used_at=now,
        )
        try:
            change = index.put(row, self._budget)
        except BaseException:
            _unlink(path)
            raise
        if change is None:
            _unlink(path)
            return False
        for old in change.removed:
            self._unlink_row_file(old)
        evicted = sum(1 for old in change.removed if old.key_id != key.id)
        if evicted:
            with self._lock:
                self._evictions += evicted
            logger.debug("disk tier evicted %d snapshot(s)", evicted)
        self._announce(change)
        return True

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The verified snapshot under `key`, or None; a file failing verification is deleted."""
        found = self.read(key)
        return found if isinstance(found, Snapshot) else None

    def read(self, key: SnapshotKey) -> Snapshot | Miss:
        """Like `get`, but a miss says why: whether asking again later may find the snapshot."""
        index = self._open_index()
        try:
            row = index.get(key.id)
            for _attempt in range(3):
                if row is None:
                    return Miss.ABSENT
                if not _FILE_NAME.fullmatch(row.file_name):
                    self._discard(row, "the index names an invalid file", unlink=False)
                    return Miss.DISCARDED
                try:
                    data = _read_file(self._files / row.file_name)
                except FileNotFoundError:
                    current = index.get(key.id)
                    if current is not None and current.file_name != row.file_name:
                        row = current  # a concurrent put replaced it
                        continue
                    if current is not None:
                        logger.warning("snapshot file %s vanished; dropping its row", row.file_name)
                        self._announce(index.delete(row.key_id, row.file_name))
                    return Miss.ABSENT
                except OSError as exc:
                    logger.warning("cannot read snapshot file %s: %s", row.file_name, exc)
                    return Miss.UNAVAILABLE
                try:
                    snapshot = self._verify(row, data, key)
                except MacMismatch as exc:
                    _warn_unauthenticated(self._files / row.file_name, str(exc))
                    return Miss.UNAUTHENTICATED
                except CorruptSnapshot as exc:
                    self._discard(row, str(exc))
                    return Miss.DISCARDED
                try:
                    index.touch(row.key_id, row.file_name, time.time())
                except StoreUnavailable as exc:  # a full disk, a busy writer: the hit still stands
                    logger.debug("could not record the use of %s: %s", row.file_name, exc)
                return snapshot
        except StoreUnavailable as exc:
            logger.warning("disk tier index unavailable, treating the lookup as a miss: %s", exc)
        return Miss.UNAVAILABLE

    def remove(self, key: SnapshotKey) -> bool:
        change = self._open_index().delete(key.id)
        if change is None:
            return False
        for row in change.removed:
            self._unlink_row_file(row)
        self._announce(change)
        return True

    def entries(self, model_fingerprint: str | None = None, scope: str | None = None) -> list[EntryInfo]:
        """Committed entries, optionally only those of one fingerprint and/or scope."""
        result = []
        for row in self._open_index().rows(model_fingerprint, scope):
            try:
                key = row.key()
            except InvalidArgument:
                continue
            result.append(
                EntryInfo(
                    key=key,
                    tier="disk",
                    priority=row.priority,
                    nbytes=row.file_bytes,
                    state_bytes=row.state_bytes,
                    created_at=row.created_at,
                    last_used_at=row.last_used_at,
                    rolling_hash=row.rolling_hash,
                )
            )
        return result

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
        index = self._open_index()
        rows = index.rows()
        try:
            names = set(os.listdir(self._files))
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {self._files}: {exc.strerror or exc}") from None
        named = {row.file_name for row in rows}
        cutoff = time.time() - grace_seconds

        missing = []
        for row in rows:
            if row.file_name not in names:
                current = index.get(row.key_id)  # a concurrent put may have replaced it
                if current is not None and not (self._files / current.file_name).exists():
                    missing.append(current)
        temp = sorted(
            name for name in names if name.startswith(TEMP_PREFIX) and self._older_than(name, cutoff)
        )
        orphans = sorted(
            name
            for name in names
            if name.endswith(".snap") and name not in named and self._older_than(name, cutoff)
        )
        corrupt: list[IndexRow] = []
        unauthenticated: list[IndexRow] = []
        if verify:
            for row in rows:
                if row.file_name in names:
                    verdict = self._verdict(row)
                    if verdict == "corrupt":
                        corrupt.append(row)
                    elif verdict == "unauthenticated":
                        unauthenticated.append(row)

        if repair:
            for row in missing:
                self._announce(index.delete(row.key_id, row.file_name))
            for name in (*temp, *orphans):
                _unlink(self._files / name)
            for row in corrupt:
                self._discard(row, "failed verification during check")
        report = CheckReport(
            entries=len(rows) - (len(missing) + len(corrupt) if repair else 0),
            missing_files=tuple(row.key_id for row in missing),
            orphan_files=tuple(orphans),
            temp_files=tuple(temp),
            corrupt_files=tuple(row.file_name for row in corrupt),
            repaired=repair,
            unauthenticated_files=tuple(row.file_name for row in unauthenticated),
        )
        if unauthenticated:
            logger.warning(
                "disk tier check of %s: %d file(s) authenticated under another secret (or none) kept",
                self.directory,
                len(unauthenticated),
            )
        if not report.ok:
            logger.warning(
                "disk tier check of %s: %d missing, %d orphan, %d temporary, %d corrupt file(s)%s",
                self.directory,
                len(missing),
                len(orphans),
                len(temp),
                len(corrupt),
                ", repaired" if repair else "",
            )
        return report

    # -- internals -----------------------------------------------------------------------------

    def _settle_budget(self, budget_bytes: int | None) -> int:
        """The budget to use, recording (and enforcing now) one given, else the one recorded.

        A directory shared by processes has one budget: a store opened without one must not evict
        down to a default what a store given a larger budget keeps.
        """
        try:
            if budget_bytes is None:
                recorded = self._index.recorded_budget()
                return DEFAULT_BUDGET_BYTES if recorded is None else recorded
            change = self._index.record_budget(budget_bytes)
        except StoreUnavailable as exc:  # a full disk, a busy writer: puts will still keep the budget
            logger.warning("could not record the disk budget of %s: %s", self.directory, exc)
            return DEFAULT_BUDGET_BYTES if budget_bytes is None else budget_bytes
        if change is not None:
            for row in change.removed:
                self._unlink_row_file(row)
            self._evictions += len(change.removed)
            logger.info("disk tier evicted %d snapshot(s) to fit its budget", len(change.removed))
            self._announce(change)
        return budget_bytes

    def _open_index(self) -> DiskIndex:
        if self._closed:
            raise StoreUnavailable(f"the disk tier on {self.directory} is closed")
        return self._index

    def _write_file(self, path: Path, encoded: EncodedFile) -> None:
        temp = self._files / f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
        renamed = False
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY | _O_CLOEXEC, 0o600)
            try:
                for part in encoded.parts:
                    _write_all(fd, part)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
            renamed = True
            _fsync_dir(self._files)
        except OSError as exc:
            _unlink(temp)
            if renamed:
                _unlink(path)
            reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            raise StoreUnavailable(
                f"cannot write a snapshot of {encoded.size} bytes to {self._files}: {reason}"
            ) from None

    def _verify(self, row: IndexRow, data: memoryview, key: SnapshotKey) -> Snapshot:
        if len(data) != row.file_bytes:
            raise CorruptSnapshot(f"file is {len(data)} bytes, the index recorded {row.file_bytes}")
        try:
            snapshot = decode(
                data,
                key=key,
                store_id=self._store_id,
                mac_secret=self._mac_key,
                max_state_bytes=row.state_bytes,
            )
        except CorruptSnapshot:
            raise
        except (ValueError, ArithmeticError) as exc:  # a crafted file must still read as a miss
            raise CorruptSnapshot(f"file cannot be decoded: {exc}") from None
        if len(snapshot.state) != row.state_bytes:
            raise CorruptSnapshot("state size differs from the index")
        return snapshot

    def _verdict(self, row: IndexRow) -> str:
        """One of ok, corrupt, or unauthenticated (intact, but under another secret or none)."""
        try:
            key = row.key()
            if not _FILE_NAME.fullmatch(row.file_name):
                return "corrupt"
            self._verify(row, _read_file(self._files / row.file_name), key)
        except FileNotFoundError:
            return "ok"  # replaced or removed meanwhile: nothing to verify
        except MacMismatch:
            return "unauthenticated"
        except (CorruptSnapshot, InvalidArgument, OSError):
            return "corrupt"
        return "ok"

    def _discard(self, row: IndexRow, reason: str, *, unlink: bool = True) -> None:
        logger.warning(
            "snapshot file %s (key %s) is unusable and was removed: %s",
            row.file_name,
            row.key_id,
            reason,
        )
        try:
            change = self._index.delete(row.key_id, row.file_name)
        except StoreUnavailable as exc:
            logger.warning("could not drop the index row of %s: %s", row.file_name, exc)
        else:
            self._announce(change)
        if unlink:
            _unlink(self._files / row.file_name)

    def _announce(self, change: Change | None) -> None:
        if change is not None and self._on_change is not None:
            self._on_change(change)

    # -- opening, and rebuilding a lost index --------------------------------------------------------

    def _open_or_rebuild(self, index_path: Path) -> DiskIndex:
        """Open the index; move a damaged one to quarantine/; rebuild a new one from the files."""
        try:
            if index_path.exists() and not index_path.is_file():
                raise IndexDamaged(f"{index_path} is not a file")
            _create_private(index_path)
            index = DiskIndex(index_path)
        except IndexDamaged as exc:
            moved = self._quarantine(index_path)
            logger.warning(
                "the snapshot index of %s is damaged (%s); moved it to %s and rebuilding it from the "
                "snapshot files",
                self.directory,
                exc,
                moved,
            )
            _create_private(index_path)
            index = DiskIndex(index_path)
            rebuild = True
        else:
            rebuild = index.created
        if rebuild:
            try:
                self._rebuild(index)
            except BaseException:
                index.close()
                raise
        return index

    def _quarantine(self, index_path: Path) -> Path:
        """Move the index and its journal files into quarantine/ under a time-stamped name."""
        folder = self.directory / QUARANTINE_DIR
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
        target = folder / f"{index_path.name}.{stamp}"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            for suffix in _INDEX_SUFFIXES:
                source = index_path.with_name(index_path.name + suffix)
                if source.exists() or source.is_symlink():
                    os.replace(source, target.with_name(target.name + suffix))
        except OSError as exc:
            raise StoreUnavailable(
                f"the snapshot index {index_path} is damaged and cannot be moved aside: {exc.strerror or exc}"
            ) from None
        return target

    def _rebuild(self, index: DiskIndex) -> None:
        """Re-insert a row for every snapshot file whose head and tokens check out.

        Files intact but authenticated under another secret (or none) get their rows too: processes
        configured otherwise may share the directory, and get() checks the MAC before serving. Only
        files that verify here decide which store the index now belongs to.
        """
        found: dict[str, tuple[str, FileHeader, float]] = {}  # key id -> newest file
        unusable = 0
        for name, header, mtime in self._scan_files():
            if header is None or not name.startswith(header.key.id + "-"):  # moved to another key's name
                unusable += 1
                continue
            newest = found.get(header.key.id)
            if newest is None or mtime > newest[2]:
                found[header.key.id] = (name, header, mtime)
        if not (found or unusable):
            return  # a new directory
        # The files name the store that wrote them; planted files of another store stay orphans.
        voters = [h for _, h, _ in found.values() if h.authenticated] or [h for _, h, _ in found.values()]
        votes = Counter(header.store_id for header in voters)
        store_id = max(votes, key=lambda sid: (votes[sid], sid)) if votes else index.store_id
        rows = [
            IndexRow.of(
                header.key,
                rolling_hash=rolling_hash(header.tokens),
                priority=header.priority,
                file_name=name,
                file_bytes=header.file_bytes,
                state_bytes=header.state_bytes,
                created_at=header.created_at,
                last_used_at=mtime,
            )
            for name, header, mtime in found.values()
            if header.store_id == store_id
        ]
        index.rebuild(rows, store_id)
        logger.warning(
            "rebuilt the snapshot index of %s from its files: %d snapshot(s) recovered, %d file(s) "
            "left out (damaged, foreign or superseded)",
            self.directory,
            len(rows),
            unusable + len(found) - len(rows),
        )

    def _scan_files(self) -> Iterator[tuple[str, FileHeader | None, float]]:
        """Each snapshot file's name, checked head (None if unusable) and modification time."""
        try:
            names = sorted(os.listdir(self._files))
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {self._files}: {exc.strerror or exc}") from None
        for name in names:
            if not _FILE_NAME.fullmatch(name):
                continue
            try:
                with open(self._files / name, "rb") as file:
                    info = os.fstat(file.fileno())
                    header = read_header(file, info.st_size, mac_secret=self._mac_key)
            # CorruptSnapshot and InvalidArgument are ValueErrors; ArithmeticError backs up a
            # crafted header the checks did not foresee.
            except (ValueError, ArithmeticError, OSError):
                yield name, None, 0.0
                continue
            yield name, header, info.st_mtime

    def _unlink_row_file(self, row: IndexRow) -> None:
        if _FILE_NAME.fullmatch(row.file_name):
            _unlink(self._files / row.file_name)

    def _older_than(self, name: str, cutoff: float) -> bool:
        try:
            return (self._files / name).stat().st_mtime < cutoff
        except OSError:
            return False


@contextlib.contextmanager
def _open_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (POSIX): one process at a time opens or rebuilds the index."""
    try:
        import fcntl
    except ImportError:  # Windows: SQLite's own locking still keeps the index consistent
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreUnavailable(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _warn_unauthenticated(path: Path, reason: str) -> None:
    """Log once per file per process: a misconfigured reader must not flood the log."""
    name = str(path)
    with _warned_lock:
        if name in _warned_unauthenticated:
            return
        if len(_warned_unauthenticated) >= _MAX_WARNED:
            _warned_unauthenticated.clear()
        _warned_unauthenticated.add(name)
    logger.warning(
        "snapshot file %s is a miss and was kept: %s (check the secret: SNAPCACHE_SECRET or secret=)",
        path.name,
        reason,
    )


def _read_file(path: Path) -> memoryview:
    # numpy's empty buffer skips the zero-fill a bytearray would pay for.
    with open(path, "rb", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        data = np.empty(size, dtype=np.uint8).data
        filled = 0
        while filled < size:
            count = file.readinto(data[filled:])
            if not count:
                break
            filled += count
    return data[:filled]  # shorter when the file shrank while read: verification rejects it


def _write_all(fd: int, part: bytes | bytearray | memoryview) -> None:
    view = memoryview(part).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not delete %s: %s", path, exc)


def _create_private(index_path: Path) -> None:
    """Create the index file with mode 0600 before SQLite does: its journal files copy that mode."""
    try:
        fd = os.open(index_path, os.O_RDWR | os.O_CREAT | _O_BINARY | _O_CLOEXEC, 0o600)
        os.close(fd)
        if os.name == "posix":
            for suffix in ("", "-wal", "-shm"):
                path = index_path.with_name(index_path.name + suffix)
                if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
                    os.chmod(path, 0o600)
    except OSError as exc:
        raise StoreUnavailable(f"cannot create the index {index_path}: {exc.strerror or exc}") from None
