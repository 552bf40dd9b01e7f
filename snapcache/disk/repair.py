"""Repair of a disk tier's directory: the index checked against the files, debris reclaimed, a damaged
index quarantined and rebuilt from the files' headers.

Debris is what interrupted writes leave: temporary files, and snapshot files no index row names (a
crash between the rename and the commit). Both are reclaimed once older than a grace period, since a
younger one may belong to a write still in flight in another process.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from snapcache.disk import files
from snapcache.disk.index import DiskIndex, IndexDamaged, IndexRow
from snapcache.errors import CorruptSnapshot, StoreUnavailable
from snapcache.formats.pack_file import read_member_tokens, read_pack_head
from snapcache.formats.snapshot_file import FileHeader, read_header
from snapcache.key import SnapshotKey, TokenArray, rolling_hash

logger = logging.getLogger("snapcache")

# Temporary and orphan files younger than this are left alone: another process may be writing them.
DEFAULT_GRACE_S = 600.0

Verdict = Literal["ok", "corrupt", "unauthenticated"]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What a check of the disk tier found; with `repaired`, every listed problem was removed.

    `ok` is True when nothing needing repair was found. Intact files failing only their MAC under
    this store's secret (`unauthenticated_files`, only with verify) are not problems: another
    configuration may own them, so repair keeps them.
    """

    entries: int
    missing_files: tuple[str, ...]  # key ids whose row names a file that does not exist
    orphan_files: tuple[str, ...]  # snapshot files no row names
    temp_files: tuple[str, ...]  # temporary files left by interrupted writes
    corrupt_files: tuple[str, ...]  # files failing verification (only with verify=True)
    repaired: bool
    unauthenticated_files: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing needing repair was found."""
        return not self.problems

    @property
    def problems(self) -> int:
        """How many problems were found (repaired or not)."""
        return (
            len(self.missing_files) + len(self.orphan_files) + len(self.temp_files) + len(self.corrupt_files)
        )


@dataclass(slots=True)
class Survey:
    """The problems found in one pass over the index and the files."""

    rows: list[IndexRow]
    missing: list[IndexRow] = field(default_factory=list)
    temp: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    corrupt: list[IndexRow] = field(default_factory=list)
    unauthenticated: list[IndexRow] = field(default_factory=list)


def survey(
    index: DiskIndex, folder: Path, grace_s: float, verdict: Callable[[IndexRow], Verdict] | None
) -> Survey:
    """Compare the index with the files; `verdict` (when given) verifies every file."""
    rows = index.rows()
    names = set(files.list_folder(folder))
    found = Survey(rows)
    for row in rows:
        if row.file_name not in names:
            current = index.get(row.key_id)  # a concurrent put may have replaced it
            if current is not None and not (folder / current.file_name).exists():
                found.missing.append(current)
    found.temp, found.orphans = find_debris(folder, names, {row.file_name for row in rows}, grace_s)
    if verdict is not None:
        for row in rows:
            if row.file_name in names:
                kind = verdict(row)
                if kind == "corrupt":
                    found.corrupt.append(row)
                elif kind == "unauthenticated":
                    found.unauthenticated.append(row)
    return found


def report_of(found: Survey, directory: Path, *, repaired: bool) -> CheckReport:
    """The report of a check that found `found` in `directory` (and, with `repaired`, removed every
    problem), logged when it found files to repair or authenticated otherwise."""
    report = CheckReport(
        entries=len(found.rows) - (len(found.missing) + len(found.corrupt) if repaired else 0),
        missing_files=tuple(row.key_id for row in found.missing),
        orphan_files=tuple(found.orphans),
        temp_files=tuple(found.temp),
        corrupt_files=tuple(row.file_name for row in found.corrupt),
        repaired=repaired,
        unauthenticated_files=tuple(row.file_name for row in found.unauthenticated),
    )
    if found.unauthenticated:
        logger.warning(
            "disk tier check of %s: %d file(s) authenticated under another secret (or none) kept",
            directory,
            len(found.unauthenticated),
        )
    if not report.ok:
        logger.warning(
            "disk tier check of %s: %d missing, %d orphan, %d temporary, %d corrupt file(s)%s",
            directory,
            len(found.missing),
            len(found.orphans),
            len(found.temp),
            len(found.corrupt),
            ", repaired" if repaired else "",
        )
    return report


def find_debris(
    folder: Path, names: set[str], named: set[str], grace_s: float
) -> tuple[list[str], list[str]]:
    """Temporary files, and snapshot files no row names, older than `grace_s` seconds."""
    cutoff = time.time() - grace_s
    temp = sorted(n for n in names if files.is_temp_name(n) and files.older_than(folder / n, cutoff))
    orphans = sorted(
        n
        for n in names
        if (n.endswith((files.SNAPSHOT_SUFFIX, files.PACK_SUFFIX)))
        and n not in named
        and files.older_than(folder / n, cutoff)
    )
    return temp, orphans


def reclaim_debris(index: DiskIndex, folder: Path, grace_s: float) -> int:
    """Delete the debris `find_debris` reports; how many files went. Called at open, under the lock."""
    names = set(files.list_folder(folder))
    if not names:
        return 0
    temp, orphans = find_debris(folder, names, index.file_names(), grace_s)
    for name in (*temp, *orphans):
        files.unlink(folder / name)
    if temp or orphans:
        logger.info(
            "reclaimed %d temporary and %d orphan file(s) left by interrupted writes in %s",
            len(temp),
            len(orphans),
            folder,
        )
    return len(temp) + len(orphans)


def open_or_rebuild(directory: Path, mac_key: bytes | None) -> DiskIndex:
    """Open the index; move a damaged one to quarantine/; rebuild a new one from the files.

    Call with the directory's open lock held.
    """
    index_path = directory / files.INDEX_NAME
    try:
        if index_path.exists() and not index_path.is_file():
            raise IndexDamaged(f"{index_path} is not a file")
        files.create_private(index_path)
        index = DiskIndex(index_path)
    except IndexDamaged as exc:
        moved = quarantine(directory, index_path)
        logger.warning(
            "the snapshot index of %s is damaged (%s); moved it to %s and rebuilding it from the "
            "snapshot files",
            directory,
            exc,
            moved,
        )
        files.create_private(index_path)
        index = DiskIndex(index_path)
        rebuild = True
    else:
        rebuild = index.created
    if rebuild:
        try:
            rebuild_index(index, directory, mac_key)
        except BaseException:
            index.close()
            raise
    return index


def quarantine(directory: Path, index_path: Path) -> Path:
    """Move the index and its journal files into quarantine/ under a time-stamped name."""
    folder = directory / files.QUARANTINE_DIR
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
    target = folder / f"{index_path.name}.{stamp}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        for suffix in files.INDEX_SUFFIXES:
            source = index_path.with_name(index_path.name + suffix)
            if source.exists() or source.is_symlink():
                os.replace(source, target.with_name(target.name + suffix))
    except OSError as exc:
        raise StoreUnavailable(
            f"the snapshot index {index_path} is damaged and cannot be moved aside: {exc.strerror or exc}"
        ) from None
    return target


@dataclass(frozen=True, slots=True)
class _Recovered:
    """One snapshot a file's checked head (and tokens) vouch for."""

    key: SnapshotKey
    tokens: TokenArray
    store_id: str
    priority: int
    created_at: float
    state_bytes: int
    file_bytes: int  # the file's size, or a pack member's share of it
    authenticated: bool


def rebuild_index(index: DiskIndex, directory: Path, mac_key: bytes | None) -> None:
    """Re-insert a row for every snapshot whose file's head and tokens check out.

    Files intact but authenticated under another secret (or none) get their rows too: processes
    configured otherwise may share the directory, and reads check the MAC before serving. Only
    files that verify here decide which store the index now belongs to. A key held by several files
    goes to the newest; a pack that is not the newest for every one of its blocks is left out whole
    (then an orphan), so that its rows' shares still add up to its size.
    """
    newest: dict[str, tuple[str, float]] = {}  # key id -> the newest file holding it
    found: dict[str, tuple[list[_Recovered], float]] = {}  # file name -> its snapshots
    unusable = 0
    for name, recovered, mtime in _scan_files(directory / files.FILES_DIR, mac_key):
        if recovered is None:
            unusable += 1
            continue
        found[name] = (recovered, mtime)
        for snapshot in recovered:
            held = newest.get(snapshot.key.id)
            if held is None or mtime > held[1]:
                newest[snapshot.key.id] = (name, mtime)
    kept = {
        name: entry
        for name, entry in found.items()
        if all(newest[snapshot.key.id][0] == name for snapshot in entry[0])
    }
    if not (found or unusable):
        return  # a new directory
    # The files name the store that wrote them; planted files of another store stay orphans.
    everything = [snapshot for recovered, _ in kept.values() for snapshot in recovered]
    voters = [h for h in everything if h.authenticated] or everything
    votes = Counter(header.store_id for header in voters)
    store_id = max(votes, key=lambda sid: (votes[sid], sid)) if votes else index.store_id
    rows = [
        IndexRow.of(
            snapshot.key,
            rolling_hash=rolling_hash(snapshot.tokens),
            priority=snapshot.priority,
            file_name=name,
            file_bytes=snapshot.file_bytes,
            state_bytes=snapshot.state_bytes,
            created_at=snapshot.created_at,
            last_used_at=mtime,
        )
        for name, (recovered, mtime) in kept.items()
        if recovered[0].store_id == store_id
        for snapshot in recovered
    ]
    index.rebuild(rows, store_id)
    logger.warning(
        "rebuilt the snapshot index of %s from its files: %d snapshot(s) recovered, %d file(s) "
        "left out (damaged, foreign or superseded)",
        directory,
        len(rows),
        unusable + len(found) - len({row.file_name for row in rows}),
    )


def _scan_files(folder: Path, mac_key: bytes | None) -> Iterator[tuple[str, list[_Recovered] | None, float]]:
    """Each snapshot or pack file's name, what its checked head vouches for (None if unusable) and
    its modification time."""
    for name in files.list_folder(folder):
        if not files.is_stored_name(name):
            continue
        try:
            with open(folder / name, "rb") as file:
                info = os.fstat(file.fileno())
                if files.is_pack_name(name):
                    recovered = _pack_members(file, info.st_size, mac_key)
                else:
                    recovered = [_snapshot_file(name, read_header(file, info.st_size, mac_secret=mac_key))]
        # CorruptSnapshot and InvalidArgument are ValueErrors; ArithmeticError backs up a
        # crafted header the checks did not foresee.
        except (ValueError, ArithmeticError, OSError):
            yield name, None, 0.0
            continue
        yield name, recovered, info.st_mtime


def _snapshot_file(name: str, header: FileHeader) -> _Recovered:
    if not name.startswith(header.key.id + "-"):  # moved to another key's name
        raise CorruptSnapshot("the file's name is not its key's")
    return _Recovered(
        header.key,
        header.tokens,
        header.store_id,
        header.priority,
        header.created_at,
        header.state_bytes,
        header.file_bytes,
        header.authenticated,
    )


def _pack_members(file: BinaryIO, size: int, mac_key: bytes | None) -> list[_Recovered]:
    """The blocks of a pack whose head checks out, each with tokens that hash to its key."""
    head = read_pack_head(file, size, mac_secret=mac_key)
    recovered = []
    for member, share in zip(head.members, head.shares, strict=True):
        tokens = read_member_tokens(file, member)
        recovered.append(
            _Recovered(
                member.key,
                tokens,
                head.store_id,
                head.priority,
                head.created_at,
                member.state_bytes,
                share,
                head.authenticated,
            )
        )
    return recovered
