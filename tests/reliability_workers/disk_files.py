"""What a store directory holds on disk, seen from outside the library."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

# The SQLite index and its journal files: bookkeeping, not snapshot bytes.
_INDEX_SUFFIXES = (".db", ".db-wal", ".db-shm", ".db-journal", ".sqlite", ".sqlite-wal", ".sqlite-shm")


def is_index_file(path: Path) -> bool:
    return path.name.endswith(_INDEX_SUFFIXES) or "index" in path.name


def snapshot_files(directory: Path) -> list[Path]:
    """Every regular file under `directory` except the index: snapshots, temp files, quarantine."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and not is_index_file(p))


def snapshot_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in snapshot_files(directory))


def files_of_key(directory: Path, key_id: str) -> list[Path]:
    """The file(s) whose name carries `key_id` (outside any quarantine folder), else the pack file
    the index names for it (a save's blocks share one)."""
    named = [p for p in snapshot_files(directory) if key_id in p.name and "quarantine" not in p.parts]
    if named or not (directory / "index.sqlite3").exists():
        return named
    with contextlib.closing(sqlite3.connect(directory / "index.sqlite3")) as conn:
        row = conn.execute("SELECT file_name FROM entries WHERE key_id = ?", (key_id,)).fetchone()
    path = directory / "snapshots" / str(row[0]) if row is not None else None
    return [path] if path is not None and path.is_file() else []


def garbage_over(path: Path) -> None:
    """Random bytes over the whole file (at least 4 KiB of them)."""
    path.write_bytes(os.urandom(max(path.stat().st_size, 4096)))


def garbage_inside(path: Path) -> None:
    """Random bytes over bytes 100 to 4096, the rest of the file kept."""
    data = bytearray(path.read_bytes())
    data[100:4096] = os.urandom(len(data[100:4096]))
    path.write_bytes(bytes(data))
