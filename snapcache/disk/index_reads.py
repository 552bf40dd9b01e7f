"""A disk tier's reads through its index: a key's row looked up, the file it names read and checked
(disk.reads), and what a failed read does to the rows.

A file that vanished under a read is read again from the row a concurrent put replaced it with, or
its rows are dropped (a miss). A file that fails verification is discarded (its row dropped, the
file deleted unless other blocks of its pack remain); one intact but authenticated under another
secret, or none, is a miss that stays and is remembered (`OtherAuthentication`). A failure that may
pass (an unreadable file, a busy or damaged index) is a miss that says so.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence

from snapcache.disk import files
from snapcache.disk.auth import OtherAuthentication
from snapcache.disk.index import Change, DiskIndex, IndexRow
from snapcache.disk.packs import OpenPack
from snapcache.disk.reads import StoredFiles
from snapcache.errors import CorruptSnapshot, StoreUnavailable
from snapcache.formats.snapshot_file import MacMismatch
from snapcache.formats.threads import map_in_parallel
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

__all__ = ["IndexedReads", "Miss", "index_unavailable"]

logger = logging.getLogger("snapcache")


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


# What drops a row whose file failed (the tier's): the row, why, and whether to delete the file.
Discard = Callable[[IndexRow, str, bool], None]


class IndexedReads:
    """The reads of one disk tier: its index (`open_index`, which raises once the tier is closed),
    its files, the files it found authenticated otherwise, and how it drops rows (`discard`) and
    reports the rows a read removed (`announce`)."""

    def __init__(
        self,
        open_index: Callable[[], DiskIndex],
        stored: StoredFiles,
        other_authentication: OtherAuthentication,
        *,
        discard: Discard,
        announce: Callable[[Change | None], None],
    ) -> None:
        self._open_index = open_index
        self._stored = stored
        self._other_authentication = other_authentication
        self._discard = discard
        self._announce = announce

    def read(self, key: SnapshotKey, *, touch: bool) -> Snapshot | Miss:
        """See `DiskTier.read`."""
        index = self._open_index()
        try:
            found = self._read_row(index, key, index.get(key.id))
            if isinstance(found, Miss):
                return found
            snapshot, row = found
            if touch:
                try:
                    index.touch(row.key_id, row.file_name, time.time())
                except StoreUnavailable as exc:  # a full disk, a busy writer: the hit still stands
                    logger.debug("could not record the use of %s: %s", row.file_name, exc)
            return snapshot
        except StoreUnavailable as exc:
            return index_unavailable(exc)

    def lend_many(
        self,
        keys: Sequence[SnapshotKey],
        use: Callable[[int, memoryview], None] | None,
        *,
        keep: Sequence[bool],
    ) -> list[Snapshot | Miss | None]:
        """See `DiskTier.lend_many`."""
        index = self._open_index()
        try:
            rows = index.get_many([key.id for key in keys])
        except StoreUnavailable as exc:
            return [index_unavailable(exc)] * len(keys)
        packs = self._stored.open_packs()

        def read_one(i: int) -> Snapshot | Miss | None:
            key = keys[i]
            row = rows.get(key.id)
            into = None if keep[i] or row is None else files.decode_buffer(row.state_bytes)
            try:
                opened = None if row is None else packs.get(row.file_name)
                if opened is not None and row is not None:
                    found = self._read_member(key, row, opened, state_into=into)
                else:
                    found = self._read_row(index, key, row, state_into=into)
            except StoreUnavailable as exc:
                return index_unavailable(exc)
            if isinstance(found, Miss):
                return found
            if use is not None:
                use(i, memoryview(found[0].state))
            return found[0] if keep[i] else None

        try:
            # Each pack's head is read and checked once, before its members are read in parallel.
            packs.open({row.file_name for row in rows.values() if files.is_pack_name(row.file_name)})
            return map_in_parallel(read_one, range(len(keys)))
        finally:
            packs.close()

    def _read_row(
        self,
        index: DiskIndex,
        key: SnapshotKey,
        row: IndexRow | None,
        *,
        state_into: memoryview | None = None,
    ) -> tuple[Snapshot, IndexRow] | Miss:
        """The snapshot in the file `row` names, verified, and the row it came from; a file a
        concurrent put replaced is read again from the new row. `state_into`: see `decode`."""
        for _attempt in range(3):
            if row is None:
                return Miss.ABSENT
            if not files.is_stored_name(row.file_name):
                self._discard(row, "the index names an invalid file", False)
                return Miss.DISCARDED
            try:
                return self._stored.read(row, key, state_into=state_into), row
            except FileNotFoundError:
                row = self._vanished(index, key, row)
                if row is None:
                    return Miss.ABSENT
            except CorruptSnapshot as exc:
                return self._refused(row, exc)
            except OSError as exc:
                logger.warning("cannot read file %s: %s", row.file_name, exc)
                return Miss.UNAVAILABLE
        return Miss.UNAVAILABLE  # replaced again and again while read: asking later may find it

    def _vanished(self, index: DiskIndex, key: SnapshotKey, row: IndexRow) -> IndexRow | None:
        """`row`'s file is gone: the row a concurrent put replaced it with, to read instead, or None
        (a miss) once the rows still naming the file are dropped."""
        current = index.get(key.id)
        if current is not None and current.file_name != row.file_name:
            return current
        if current is not None:
            logger.warning("snapshot file %s vanished; dropping its rows", row.file_name)
            self._announce(index.delete_file(row.file_name))
        return None

    def _read_member(
        self,
        key: SnapshotKey,
        row: IndexRow,
        opened: OpenPack | OSError | CorruptSnapshot,
        *,
        state_into: memoryview | None = None,
    ) -> tuple[Snapshot, IndexRow] | Miss:
        """The block `row` names in its pack, whose head `opened` holds (or the error reading it)."""
        try:
            return self._stored.member(row, key, opened, state_into=state_into), row
        except CorruptSnapshot as exc:
            return self._refused(row, exc)
        except OSError as exc:
            logger.warning("cannot read pack file %s: %s", row.file_name, exc)
            return Miss.UNAVAILABLE

    def _refused(self, row: IndexRow, exc: CorruptSnapshot) -> Miss:
        """The miss of a snapshot that failed verification: one authenticated otherwise is kept (and
        remembered), a damaged one dropped."""
        if isinstance(exc, MacMismatch):
            self._other_authentication.found(row, str(exc))
            return Miss.UNAUTHENTICATED
        self._discard(row, str(exc), True)
        return Miss.DISCARDED


def index_unavailable(exc: StoreUnavailable) -> Miss:
    """A read the index could not answer: logged, and a miss that may not last."""
    logger.warning("disk tier index unavailable, treating the lookup as a miss: %s", exc)
    return Miss.UNAVAILABLE
