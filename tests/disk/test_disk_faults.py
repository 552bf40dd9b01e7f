"""A full disk or a failing write: StoreUnavailable, no partial file, no row, and writes resume later."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from small_filesystem import mounted

from snapcache.disk import files as disk_files
from snapcache.disk.disk_tier import FILES_DIR, DiskTier
from snapcache.disk.index import DiskIndex
from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

MB = 1 << 20


def make_snapshot(seed: int, state_bytes: int = 200_000) -> Snapshot:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 1000, 20, dtype=np.int32)
    state = rng.integers(0, 256, state_bytes, dtype=np.uint8).tobytes()
    return Snapshot(SnapshotKey.for_tokens("fp", "default", tokens), tokens, state)


def files_in(tier: DiskTier) -> list[str]:
    return sorted(os.listdir(tier.directory / FILES_DIR))


def assert_consistent(tier: DiskTier, expected: list[Snapshot]) -> None:
    """Exactly the expected entries: one verified file each, nothing else in the directory."""
    assert {row.key for row in tier.entries()} == {s.key for s in expected}
    assert len(files_in(tier)) == len(expected)
    assert tier.check(repair=False, verify=True, grace_seconds=0).ok
    for snap in expected:
        got = tier.get(snap.key)
        assert got is not None
        assert bytes(got.state) == bytes(snap.state)


def failing(real: Callable[..., object], *, after: int, error: int) -> Callable[..., object]:
    calls = {"n": 0}

    def fake(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(error, os.strerror(error))
        return real(*args)

    return fake


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[DiskTier]:
    t = DiskTier(tmp_path / "cache", 64 * MB)
    yield t
    t.close()


@pytest.mark.parametrize(("function", "after"), [("write", 0), ("write", 2), ("fsync", 0)])
def test_enospc_while_writing_leaves_nothing(
    tier: DiskTier, monkeypatch: pytest.MonkeyPatch, function: str, after: int
) -> None:
    kept = make_snapshot(1)
    assert tier.put(kept)
    monkeypatch.setattr(os, function, failing(getattr(os, function), after=after, error=errno.ENOSPC))
    with pytest.raises(StoreUnavailable, match="disk is full") as info:
        tier.put(make_snapshot(2))
    assert isinstance(info.value, OSError)
    monkeypatch.undo()
    assert_consistent(tier, [kept])
    again = make_snapshot(2)
    assert tier.put(again)  # writes resume
    assert_consistent(tier, [kept, again])


def test_other_io_error_names_the_reason(tier: DiskTier, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", failing(os.fsync, after=0, error=errno.EIO))
    with pytest.raises(StoreUnavailable, match=os.strerror(errno.EIO)):
        tier.put(make_snapshot(1))
    monkeypatch.undo()
    assert_consistent(tier, [])


def test_failed_rename_leaves_nothing(tier: DiskTier, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "replace", failing(os.replace, after=0, error=errno.EROFS))
    with pytest.raises(StoreUnavailable):
        tier.put(make_snapshot(1))
    monkeypatch.undo()
    assert_consistent(tier, [])


def test_failed_directory_sync_removes_the_renamed_file(
    tier: DiskTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(directory: Path) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(disk_files, "_fsync_dir", broken)
    with pytest.raises(StoreUnavailable):
        tier.put(make_snapshot(1))
    monkeypatch.undo()
    assert_consistent(tier, [])


def test_failed_index_commit_removes_the_file(tier: DiskTier, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = make_snapshot(1)
    tier.put(kept)

    def full(self: DiskIndex, rows: object, budget: int) -> None:
        raise StoreUnavailable("snapshot index: cannot write: database or disk is full")

    monkeypatch.setattr(DiskIndex, "put_file", full)
    with pytest.raises(StoreUnavailable):
        tier.put(make_snapshot(2))
    monkeypatch.undo()
    assert_consistent(tier, [kept])


# -- a real, small filesystem ----------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB filesystem; skipped where mounting is not permitted."""
    with mounted(tmp_path, 4 * MB) as mount_point:
        yield mount_point


def test_real_full_disk(small_fs: Path) -> None:
    tier = DiskTier(small_fs / "cache", 64 * MB)  # the budget is not what stops it: the disk is
    first = make_snapshot(1, state_bytes=500_000)
    assert tier.put(first)
    free = shutil.disk_usage(small_fs).free
    filler = small_fs / "filler"
    filler.write_bytes(bytes(free - 200_000))  # leave 200 kB: too little for the next snapshot

    second = make_snapshot(2, state_bytes=500_000)
    with pytest.raises(StoreUnavailable, match="disk is full"):
        tier.put(second)
    assert_consistent(tier, [first])

    filler.unlink()
    assert tier.put(second)  # space freed: writes resume
    assert_consistent(tier, [first, second])

    # Fill the disk for real with snapshots alone: every put either commits fully or leaves nothing.
    stored = [first, second]
    for seed in range(3, 40):
        snap = make_snapshot(seed, state_bytes=300_000)
        try:
            assert tier.put(snap)
        except StoreUnavailable:
            break
        stored.append(snap)
    else:
        pytest.fail("a 4 MiB filesystem never filled up")
    assert_consistent(tier, stored)
    tier.remove(stored[0].key)
    tier.remove(stored[1].key)
    late = make_snapshot(99, state_bytes=300_000)
    assert tier.put(late)
    assert_consistent(tier, [*stored[2:], late])
    tier.close()
