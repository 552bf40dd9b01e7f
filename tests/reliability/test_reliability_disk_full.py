"""A full disk: put degrades to RAM with a warning, leaves nothing partial, and writing resumes with space."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_workers.payload import FINGERPRINT, SCOPE, large_state_for, tokens_for
from small_filesystem import mounted

from snapcache import SnapshotKey, SnapshotStore
from snapcache.disk.disk_tier import DiskTier

FS_BYTES = 2 << 20
STATE_BYTES = 200 << 10
RAM_BYTES = 16 << 20
DISK_BYTES = 64 << 20  # far more than the filesystem holds: the disk fills before the budget does


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem; skipped where none can be mounted (the injected ENOSPC tests still run)."""
    with mounted(tmp_path, FS_BYTES) as mount_point:
        yield mount_point


def key_and_tokens(index: int) -> tuple[SnapshotKey, object]:
    tokens = tokens_for(index)
    return SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens), tokens


def committed_and_clean(directory: Path) -> int:
    """Every file left is a committed, verifying snapshot: no temp file, no orphan. Returns the count."""
    partial = [p.name for p in (directory / "snapshots").iterdir() if not p.name.endswith(".snap")]
    assert partial == []
    tier = DiskTier(directory, DISK_BYTES)
    try:
        report = tier.check(repair=False, verify=True, grace_seconds=0)
        assert report.ok, report
        return report.entries
    finally:
        tier.close()


@pytest.mark.parametrize("headroom", [2 * STATE_BYTES + (100 << 10), 0], ids=["room-for-two", "no-room"])
def test_a_real_full_filesystem(
    small_filesystem: Path, caplog: pytest.LogCaptureFixture, headroom: int
) -> None:
    directory = small_filesystem / "cache"
    balloon = small_filesystem / "balloon"
    store = SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES)
    try:
        # Leave room for about two snapshots (or none at all, not even for the index), then put ten.
        free = shutil.disk_usage(small_filesystem).free
        with open(balloon, "wb") as file:
            try:
                file.write(b"\x00" * (free - headroom))
                file.flush()
                os.fsync(file.fileno())
            except OSError as exc:  # filling the very last block may fail: that is the point
                if exc.errno != errno.ENOSPC:
                    raise
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            for index in range(10):
                key, tokens = key_and_tokens(index)
                assert store.put(key, tokens, large_state_for(tokens, STATE_BYTES)) is not None
            store.flush()
        stats = store.stats()
        assert stats.write_errors > 0
        assert any("full" in r.getMessage() or "space" in r.getMessage().lower() for r in caplog.records)
        # Every snapshot is still served, from RAM, with its bytes.
        for index in range(10):
            key, tokens = key_and_tokens(index)
            snap = store.get(key)
            assert snap is not None
            assert bytes(snap.state) == large_state_for(tokens, STATE_BYTES)
        on_disk_when_full = committed_and_clean(directory)
        assert on_disk_when_full < 10

        # What did reach the disk is served by another process' store even while the disk is full.
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK_BYTES) as reader:
            served = [reader.get(key_and_tokens(i)[0]) for i in range(10)]
            assert sum(s is not None for s in served) == on_disk_when_full

        # Space returns: the next writes reach the disk again.
        balloon.unlink()
        errors_before = store.stats().write_errors
        for index in range(10, 14):
            key, tokens = key_and_tokens(index)
            store.put(key, tokens, large_state_for(tokens, STATE_BYTES))
        store.flush()
        assert store.stats().write_errors == errors_before
        on_disk = {row.key for row in store.entries() if "disk" in getattr(row, "tiers", (row.tier,))}
        for index in range(10, 14):
            assert key_and_tokens(index)[0] in on_disk
    finally:
        store.close()
    committed_and_clean(directory)


def test_injected_enospc_degrades_to_ram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "cache"
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        monkeypatch.setattr(os, "fsync", full_disk)
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            for index in range(5):
                key, tokens = key_and_tokens(index)
                assert store.put(key, tokens, large_state_for(tokens, 4096)) is not None
            store.flush()
        assert store.stats().write_errors == 5
        assert any("full" in r.getMessage() for r in caplog.records)
        assert store.stats().disk_entries == 0
        assert list((directory / "snapshots").iterdir()) == []  # no temp file, no partial snapshot
        for index in range(5):
            key, tokens = key_and_tokens(index)
            snap = store.get(key)
            assert snap is not None
            assert bytes(snap.state) == large_state_for(tokens, 4096)

        monkeypatch.setattr(os, "fsync", real_fsync)
        for index in range(5, 8):
            key, tokens = key_and_tokens(index)
            store.put(key, tokens, large_state_for(tokens, 4096))
        store.flush()
        assert store.stats().write_errors == 5
        assert store.stats().disk_entries == 3
    # close() wrote the RAM copies that the full disk had refused.
    assert committed_and_clean(directory) == 8
