"""Snapshot files that are intact but authenticated otherwise: under another secret, or none.

Processes configured otherwise may share a directory, so such a file is a miss that stays. A disk tier
remembers the ones it found, so that a put under its own secret replaces them rather than counting
them as held, and warns about each file once per process, not on every lookup.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from snapcache.disk import files
from snapcache.disk.index import IndexRow
from snapcache.errors import CorruptSnapshot
from snapcache.formats.pack_file import read_pack_head
from snapcache.formats.snapshot_file import read_header

logger = logging.getLogger("snapcache")

# Files remembered (per tier) and warned about (per process): a bound, then forgotten and found again.
_MAX_REMEMBERED = 10_000
_warned: set[str] = set()
_warned_lock = threading.Lock()


class OtherAuthentication:
    """The files of one disk tier found authenticated otherwise than under its secret, `mac_key`."""

    def __init__(self, folder: Path, mac_key: bytes | None) -> None:
        self._folder = folder
        self._mac_key = mac_key
        # By key id, the file name: kept for a reader with the right secret, but not held for this one.
        self._found: dict[str, str] = {}
        # Files whose head has been checked since one was found (key id, file name).
        self._heads_checked: set[tuple[str, str]] = set()

    def found(self, row: IndexRow, reason: str) -> None:
        """Log (once per file per process) and remember that `row`'s file failed authentication."""
        _warn_once(self._folder / row.file_name, reason)
        self._remember(row)

    def replaced(self, key_id: str) -> None:
        """A put under this tier's secret replaced whatever file `key_id` had."""
        self._found.pop(key_id, None)

    def held(self, row: IndexRow) -> bool:
        """Whether `row` counts as held for this tier, or a put under its secret should replace it.

        While a file found authenticated otherwise has not been replaced (a new secret, a forgery),
        the head of each other file asked about is checked too, once, so that a writer with the
        secret stores again what it could not read.
        """
        if self._mac_key is None or not self._found:
            return True
        if self._found.get(row.key_id) == row.file_name:
            return False
        checked = (row.key_id, row.file_name)
        if checked in self._heads_checked:
            return True
        if len(self._heads_checked) >= _MAX_REMEMBERED:
            self._heads_checked.clear()
        self._heads_checked.add(checked)
        if self._head_authenticated(row):
            return True
        self._remember(row)
        return False

    def _remember(self, row: IndexRow) -> None:
        if self._mac_key is None:
            return  # without a secret, nothing this tier could write would replace the file
        if len(self._found) >= _MAX_REMEMBERED:
            self._found.clear()
        self._found[row.key_id] = row.file_name

    def _head_authenticated(self, row: IndexRow) -> bool:
        """Whether `row`'s file head carries a valid MAC under this tier's secret; True when it cannot
        be read: damage is left for a read or `check` to deal with."""
        try:
            if files.is_pack_name(row.file_name):
                with (self._folder / row.file_name).open("rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    return read_pack_head(handle, size, mac_secret=self._mac_key).authenticated
            if not files.is_snapshot_name(row.file_name):
                return True
            with (self._folder / row.file_name).open("rb") as handle:
                return read_header(handle, row.file_bytes, mac_secret=self._mac_key).authenticated
        except (OSError, CorruptSnapshot):
            return True


def _warn_once(path: Path, reason: str) -> None:
    """Log once per file per process: a misconfigured reader must not flood the log."""
    name = str(path)
    with _warned_lock:
        if name in _warned:
            return
        if len(_warned) >= _MAX_REMEMBERED:
            _warned.clear()
        _warned.add(name)
    logger.warning(
        "snapshot file %s is a miss and was kept: %s (check the secret: SNAPCACHE_SECRET or secret=)",
        path.name,
        reason,
    )
