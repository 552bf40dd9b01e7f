"""The files of a disk tier read back and checked: a snapshot file, a block in a pack, their tokens,
and the verdict `check(verify=True)` gives each. Nothing here touches the index: what a failed read
does to it (a row dropped, a vanished file's rows removed) is the tier's business.

Every read is checked against what the index row records of it (file size, state size) and against
the key asked for; a file that fails raises CorruptSnapshot (MacMismatch when it is intact but
authenticated under another secret, or none), never hands over unchecked bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from snapcache.disk import files
from snapcache.disk.index import IndexRow
from snapcache.disk.packs import OpenPack, OpenPacks, read_member
from snapcache.disk.repair import Verdict
from snapcache.errors import CorruptSnapshot, InvalidArgument
from snapcache.formats.pack_file import read_member_tokens, read_pack_head
from snapcache.formats.snapshot_file import MacMismatch, decode, read_header
from snapcache.key import SnapshotKey, TokenArray
from snapcache.snapshot import Snapshot

__all__ = ["StoredFiles"]


class StoredFiles:
    """The snapshot and pack files of one disk tier's folder, read and verified."""

    def __init__(self, folder: Path, *, mac_key: bytes | None, store_id: str) -> None:
        self.folder = folder
        self._mac_key = mac_key
        self._store_id = store_id

    def open_packs(self) -> OpenPacks:
        """Packs to open for one read (see `OpenPacks`); the caller closes them."""
        return OpenPacks(self.folder, self._mac_key)

    def read(self, row: IndexRow, key: SnapshotKey, *, state_into: memoryview | None = None) -> Snapshot:
        """The snapshot in the file `row` names (a snapshot file, or a pack opened for this read
        alone), verified. Raises FileNotFoundError when the file is gone, OSError when it cannot be
        read, CorruptSnapshot when it fails. `state_into`: see `formats.snapshot_file.decode`."""
        if files.is_pack_name(row.file_name):
            packs = self.open_packs()
            try:
                packs.open({row.file_name})
                opened = packs.get(row.file_name)
                if opened is None:
                    raise FileNotFoundError(row.file_name)
                return self.member(row, key, opened, state_into=state_into)
            finally:
                packs.close()
        # Reused: decoding copies out everything the snapshot keeps.
        data = files.read_file(self.folder / row.file_name, reuse=True)
        return self._verified(row, data, key, state_into)

    def member(
        self, row: IndexRow, key: SnapshotKey, opened: OpenPack | OSError | CorruptSnapshot, *,
        state_into: memoryview | None = None,
    ) -> Snapshot:  # fmt: skip
        """The block `row` names in its pack, whose head `opened` holds (or the error reading it).
        Raises CorruptSnapshot when it fails, OSError when it cannot be read."""
        if isinstance(opened, Exception):
            raise opened
        return read_member(
            opened, key, state_bytes=row.state_bytes, store_id=self._store_id, state_into=state_into
        )

    def tokens(self, row: IndexRow, key: SnapshotKey) -> TokenArray | None:
        """The tokens of `key` in the checked header of the file `row` names, its payload unread;
        None when the file is gone, damaged or not authenticated under this tier's secret."""
        path = self.folder / row.file_name
        try:
            if files.is_pack_name(row.file_name):
                with path.open("rb", buffering=0) as handle:
                    size = os.fstat(handle.fileno()).st_size
                    head = read_pack_head(handle, size, mac_secret=self._mac_key)
                    member = head.member(key)
                    if member is None or not head.authenticated:
                        return None
                    return read_member_tokens(handle, member)
            if not files.is_snapshot_name(row.file_name):
                return None
            with path.open("rb") as handle:
                header = read_header(handle, row.file_bytes, mac_secret=self._mac_key)
        except (OSError, CorruptSnapshot):
            return None
        return header.tokens if header.key == key and header.authenticated else None

    def verdict(self, row: IndexRow) -> Verdict:
        """One of ok, corrupt, or unauthenticated (intact, but under another secret or none); ok
        for a file removed or replaced meanwhile (nothing left to verify)."""
        try:
            if not files.is_stored_name(row.file_name):
                return "corrupt"
            self.read(row, row.key())
        except FileNotFoundError:
            return "ok"
        except MacMismatch:
            return "unauthenticated"
        except (CorruptSnapshot, InvalidArgument, OSError):
            return "corrupt"
        return "ok"

    def _verified(
        self, row: IndexRow, data: memoryview, key: SnapshotKey, state_into: memoryview | None
    ) -> Snapshot:
        if len(data) != row.file_bytes:
            raise CorruptSnapshot(f"file is {len(data)} bytes, the index recorded {row.file_bytes}")
        try:
            snapshot = decode(
                data,
                key=key,
                store_id=self._store_id,
                mac_secret=self._mac_key,
                max_state_bytes=row.state_bytes,
                state_into=state_into,
            )
        except CorruptSnapshot:
            raise
        except (ValueError, ArithmeticError) as exc:  # a crafted file must still read as a miss
            raise CorruptSnapshot(f"file cannot be decoded: {exc}") from None
        if len(snapshot.state) != row.state_bytes:
            raise CorruptSnapshot("state size differs from the index")
        return snapshot
