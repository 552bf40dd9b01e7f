"""What goes from the disk tier: rows dropped and the files no row names any more deleted, each change
announced to the tier's listener; an unusable file discarded; `check`'s repairs; what the budget
recorded at opening evicts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from snapcache.disk import files
from snapcache.disk.index import Change, DiskIndex, IndexRow
from snapcache.disk.repair import CheckReport, Verdict, report_of, survey
from snapcache.errors import StoreUnavailable

logger = logging.getLogger("snapcache")

__all__ = ["Removals"]


class Removals:
    """Removals from the index `index` and the files folder `folder`; `on_change` hears of each change.

    `open_index` is the tier's: it raises once the tier is closed, for what a caller asks; a row found
    unusable is dropped through `index` itself."""

    def __init__(
        self,
        index: DiskIndex,
        open_index: Callable[[], DiskIndex],
        folder: Path,
        on_change: Callable[[Change], None] | None,
    ) -> None:
        self._index = index
        self._open_index = open_index
        self._files = folder
        self._on_change = on_change

    def remove(self, key_id: str) -> bool:
        """Drop the row of `key_id` and delete what no row names any more; True if there was one."""
        change = self._open_index().delete(key_id)
        if change is None:
            return False
        self.unlink_files(change.freed)
        self.announce(change)
        return True

    def check(
        self,
        directory: Path,
        *,
        repair: bool,
        verdict: Callable[[IndexRow], Verdict] | None,
        grace_seconds: float,
    ) -> CheckReport:
        """Compare the index with the files (`verdict`, when given, verifies each); with `repair`,
        delete what is broken or left over, leaving alone files younger than `grace_seconds`."""
        index = self._open_index()
        found = survey(index, self._files, grace_seconds, verdict)
        if repair:
            for row in found.missing:
                self.announce(index.delete(row.key_id, row.file_name))
            for name in (*found.temp, *found.orphans):
                files.unlink(self._files / name)
            for row in found.corrupt:
                self.discard(row, "failed verification during check")
        return report_of(found, directory, repaired=repair)

    def settle_budget(self, budget_bytes: int | None, default: int) -> tuple[int, int]:
        """The budget to use, recording (and enforcing now) one given, else the one recorded (else
        `default`), and the entries it evicted.

        A directory shared by processes has one budget: a store opened without one must not evict
        down to a default what a store given a larger budget keeps.
        """
        try:
            if budget_bytes is None:
                recorded = self._index.recorded_budget()
                return (default if recorded is None else recorded), 0
            change = self._index.record_budget(budget_bytes)
        except StoreUnavailable as exc:  # a full disk, a busy writer: puts will still keep the budget
            logger.warning("could not record the disk budget of %s: %s", self._files.parent, exc)
            return (default if budget_bytes is None else budget_bytes), 0
        if change is None:
            return budget_bytes, 0
        self.unlink_files(change.freed)
        logger.info("disk tier evicted %d snapshot(s) to fit its budget", len(change.removed))
        self.announce(change)
        return budget_bytes, len(change.removed)

    def discard(self, row: IndexRow, reason: str, *, unlink: bool = True) -> None:
        """Drop `row`, whose file is unusable (logged), and delete the file unless `unlink` is False."""
        logger.warning(
            "snapshot file %s (key %s) is unusable and its row was dropped: %s",
            row.file_name,
            row.key_id,
            reason,
        )
        try:
            change = self._index.delete(row.key_id, row.file_name)
        except StoreUnavailable as exc:
            logger.warning("could not drop the index row of %s: %s", row.file_name, exc)
            change = None
        else:
            self.announce(change)
        if not unlink:
            return
        if files.is_pack_name(row.file_name):  # other blocks may still be read from it
            self.unlink_files(change.freed if change is not None else ())
        else:
            files.unlink(self._files / row.file_name)

    def announce(self, change: Change | None) -> None:
        """Tell the listener of `change` (nothing for None)."""
        if change is not None and self._on_change is not None:
            self._on_change(change)

    def unlink_files(self, names: Sequence[str]) -> None:
        """Delete the files `names`, which no row names any more."""
        for name in names:
            if files.is_stored_name(name):
                files.unlink(self._files / name)
