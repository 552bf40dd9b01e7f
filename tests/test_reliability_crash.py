"""SIGKILL a writer at random moments during puts and evictions: the store always reopens clean."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_workers.disk_files import snapshot_bytes
from reliability_workers.payload import problem_with
from reliability_workers.procs import WORKERS, worker_env
from reliability_workers.reports import IN_FLIGHT_DEBRIS, check_problems

from snapcache import SnapshotStore
from snapcache.disk_tier import DiskTier

KILLS = 20
DISK_BYTES = 48 << 10  # a few snapshots: almost every put evicts


def start_writer(directory: Path, mode: str, seed: int, progress: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WORKERS / "crash_writer.py"),
            str(directory),
            str(DISK_BYTES),
            mode,
            str(seed),
            str(progress),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"writer did not start:\n{err}")
    return proc


def verify_directory(directory: Path) -> tuple[int, dict[str, int]]:
    """Repair in-flight debris only, then check clean and verify every entry; returns (entries, debris)."""
    tier = DiskTier(directory, DISK_BYTES)
    try:
        first = tier.check(repair=True, verify=True, grace_seconds=0)
        assert check_problems(first, allowed=IN_FLIGHT_DEBRIS) == [], first
        debris = {name: len(getattr(first, name)) for name in IN_FLIGHT_DEBRIS}
        second = tier.check(repair=False, verify=True, grace_seconds=0)
        assert second.ok, second
    finally:
        tier.close()
    assert snapshot_bytes(directory) <= DISK_BYTES
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK_BYTES) as store:
        rows = store.entries()
        for row in rows:
            snap = store.get(row.key)
            assert snap is not None, f"listed entry {row.key.id[:12]} is not served"
            assert problem_with(snap) is None
    return len(rows), debris


def test_twenty_sigkills_during_writes_and_evictions(tmp_path: Path) -> None:
    directory = tmp_path / "crashy"
    rng = random.Random(1234)
    served = 0
    debris_total = {name: 0 for name in IN_FLIGHT_DEBRIS}
    progress = tmp_path / "puts-done"
    for kill in range(KILLS):
        mode = "sync" if kill % 2 == 0 else "background"
        proc = start_writer(directory, mode, kill, progress)
        time.sleep(rng.uniform(0.05, 0.6))
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        entries, debris = verify_directory(directory)
        served += entries
        for name, count in debris.items():
            debris_total[name] += count
    puts = progress.stat().st_size
    print(
        f"\n{KILLS} SIGKILLs after {puts} puts: {served} snapshots served and verified in all;"
        f" debris repaired: {debris_total}"
    )
    assert served > 0
    # The budget holds about ten snapshots, so nearly every one of these puts evicted another.
    assert puts > 10 * KILLS
