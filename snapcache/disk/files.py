"""The files of a disk tier's directory: their names, durable writes, reads, and the open lock.

Directory layout::

    index.sqlite3          one row per snapshot; a committed row is the commit point of a put
    index.sqlite3.lock     held while a process opens (and, if need be, repairs) the index
    snapshots/<key id>-<random>.snap   one snapshot
    snapshots/pack-<random>.pack       the blocks of one save (formats.pack_file)
    snapshots/.tmp-<random>.partial    a write in flight (or left by a crash)
    quarantine/index.sqlite3.<time>    a damaged index, moved aside
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from snapcache.errors import StoreUnavailable

if TYPE_CHECKING:
    from snapcache.formats.pack_file import EncodedPack
    from snapcache.formats.snapshot_file import EncodedFile
    from snapcache.key import SnapshotKey

logger = logging.getLogger("snapcache")

INDEX_NAME = "index.sqlite3"
LOCK_NAME = INDEX_NAME + ".lock"
FILES_DIR = "snapshots"
QUARANTINE_DIR = "quarantine"
INDEX_SUFFIXES = ("", "-wal", "-shm", "-journal")
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".partial"
SNAPSHOT_SUFFIX = ".snap"
PACK_SUFFIX = ".pack"
_FILE_NAME = re.compile(r"[0-9a-f]{64}-[0-9a-f]{12}\.snap")
_PACK_NAME = re.compile(r"pack-[0-9a-f]{32}\.pack")
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Files up to this size may be read into a per-thread buffer that is reused (see read_file), and
# states up to it decoded into another (see decode_buffer): a 64-token block of an 8B-class model,
# 128 KiB of state per token, is 8 MiB.
REUSED_BUFFER_BYTES = 16 << 20
_reads = threading.local()
_PREADV = getattr(os, "preadv", None)


def new_file_name(key: SnapshotKey) -> str:
    """A fresh name for a file holding `key`: a put never overwrites a file a reader may hold."""
    return f"{key.id}-{secrets.token_hex(6)}{SNAPSHOT_SUFFIX}"


def new_pack_name() -> str:
    """A fresh name for a pack file."""
    return f"pack-{secrets.token_hex(16)}{PACK_SUFFIX}"


def is_snapshot_name(name: str) -> bool:
    """True for a name `new_file_name` could have made (never a path leaving the folder)."""
    return _FILE_NAME.fullmatch(name) is not None


def is_pack_name(name: str) -> bool:
    """True for a name `new_pack_name` could have made."""
    return _PACK_NAME.fullmatch(name) is not None


def is_stored_name(name: str) -> bool:
    """True for the name of a snapshot file or a pack file."""
    return is_snapshot_name(name) or is_pack_name(name)


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def write_file(folder: Path, name: str, encoded: EncodedFile | EncodedPack) -> None:
    """Write `encoded` to folder/name durably: a temporary file, fsync, rename, fsync the folder.

    Raises StoreUnavailable (a full disk, say); then neither file remains.
    """
    temp = folder / f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
    path = folder / name
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
        _fsync_dir(folder)
    except OSError as exc:
        unlink(temp)
        if renamed:
            unlink(path)
        reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise StoreUnavailable(
            f"cannot write a snapshot of {encoded.size} bytes to {folder}: {reason}"
        ) from None


def read_file(path: Path, *, reuse: bool = False) -> memoryview:
    """The bytes of `path`; shorter than expected when the file shrank while read.

    `reuse`: a file of at most REUSED_BUFFER_BYTES is read into this thread's own buffer, which the
    next such read overwrites (a file decoded at once into memory of its own, or copied out): a
    restore of many blocks then touches the same few pages instead of fresh ones for each.
    """
    with open(path, "rb", buffering=0) as file:
        return read_range(file.fileno(), 0, os.fstat(file.fileno()).st_size, reuse=reuse)


def read_range(fd: int, offset: int, size: int, *, reuse: bool = True) -> memoryview:
    """`size` bytes of the open file `fd` from `offset`, into this thread's reused read buffer when
    they fit and `reuse` (see read_file); shorter when the file ends sooner."""
    reused = reuse and size <= REUSED_BUFFER_BYTES
    data = _thread_buffer("read", size) if reused else np.empty(size, np.uint8).data
    filled = 0
    while filled < size:
        if _PREADV is not None:  # positioned reads: threads share one descriptor
            count = _PREADV(fd, [data[filled:]], offset + filled)
        else:
            chunk = os.pread(fd, size - filled, offset + filled)
            count = len(chunk)
            data[filled : filled + count] = chunk
        if not count:
            break
        filled += count
    return data[:filled]


def decode_buffer(size: int) -> memoryview:
    """This thread's reusable buffer to decode a state of at most REUSED_BUFFER_BYTES into (a block
    that is copied elsewhere at once), `size` bytes of it; a larger size gets new memory."""
    if size > REUSED_BUFFER_BYTES:
        return np.empty(size, dtype=np.uint8).data
    return _thread_buffer("decode", size)


def _thread_buffer(purpose: str, size: int) -> memoryview:
    """`size` bytes of this thread's reusable buffer for `purpose`, grown when too small."""
    buffer: memoryview | None = getattr(_reads, purpose, None)
    if buffer is None or buffer.nbytes < size:
        # numpy's empty buffer skips the zero-fill a bytearray would pay for.
        buffer = np.empty(max(size, 1 << 18), dtype=np.uint8).data
        setattr(_reads, purpose, buffer)
    return buffer[:size]


def unlink(path: Path) -> None:
    """Delete `path`; one already gone is fine, another failure is logged."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not delete %s: %s", path, exc)


def older_than(path: Path, cutoff: float) -> bool:
    """True when `path` was last modified before `cutoff` (False when it cannot be read)."""
    try:
        return path.stat().st_mtime < cutoff
    except OSError:
        return False


def list_folder(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        raise StoreUnavailable(f"cannot list {folder}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def open_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (POSIX): one process at a time opens or repairs the index."""
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


def create_private(index_path: Path) -> None:
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
