"""Pack files opened for a read of a disk tier: each head read and checked once, then any of its
blocks read with one positioned read and verified (the format is in formats.pack_file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from snapcache.disk import files
from snapcache.errors import CorruptSnapshot
from snapcache.formats.pack_file import PackHead, decode_member, read_pack_head
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

# A pack opened for reading: its checked head and its descriptor.
OpenPack = tuple[PackHead, int]


class OpenPacks:
    """Pack files opened for one read, each head read and checked once; closed together."""

    def __init__(self, folder: Path, mac_key: bytes | None) -> None:
        self._folder = folder
        self._mac_key = mac_key
        self._opened: dict[str, OpenPack | OSError | CorruptSnapshot] = {}
        self._handles: list[BinaryIO] = []

    def open(self, names: set[str]) -> None:
        """Open `names`: `get` then gives each one's head and descriptor, or why it cannot be read;
        a file gone is left out."""
        for name in sorted(names):
            try:
                handle = open(self._folder / name, "rb", buffering=0)  # noqa: SIM115 (closed in close())
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._opened[name] = exc
                continue
            self._handles.append(handle)
            try:
                size = os.fstat(handle.fileno()).st_size
                head = read_pack_head(handle, size, mac_secret=self._mac_key)
            except OSError as exc:
                self._opened[name] = exc
            except (ValueError, ArithmeticError) as exc:  # CorruptSnapshot, or a crafted header
                self._opened[name] = exc if isinstance(exc, CorruptSnapshot) else CorruptSnapshot(str(exc))
            else:
                self._opened[name] = (head, handle.fileno())

    def get(self, name: str) -> OpenPack | OSError | CorruptSnapshot | None:
        return self._opened.get(name)

    def close(self) -> None:
        for handle in self._handles:
            handle.close()
        self._handles.clear()


def read_member(
    pack: OpenPack,
    key: SnapshotKey,
    *,
    state_bytes: int,
    store_id: str,
    state_into: memoryview | None = None,
) -> Snapshot:
    """The block `key` of an open pack, verified against the sizes and store its index row records
    (`state_into`: see `decode_member`). Raises MacMismatch for a pack authenticated otherwise,
    CorruptSnapshot for damage, OSError when it cannot be read."""
    head, fd = pack
    member = head.member(key)
    if member is None:
        raise CorruptSnapshot("the pack does not hold the block its row names")
    if member.state_bytes != state_bytes or head.store_id != store_id:
        raise CorruptSnapshot("the pack's block differs from its row")
    data = files.read_range(fd, member.offset, member.size)
    try:
        return decode_member(head, member, data, state_into=state_into)
    except CorruptSnapshot:
        raise
    except (ValueError, ArithmeticError) as exc:  # a crafted file must still read as a miss
        raise CorruptSnapshot(f"pack member cannot be decoded: {exc}") from None
