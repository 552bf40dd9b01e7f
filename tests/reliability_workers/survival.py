"""The parent's side of a kill -9 test: start a worker, kill it, and look at what its directory holds."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from reliability_workers.disk_files import snapshot_bytes
from reliability_workers.journal import read_journal
from reliability_workers.payload import FINGERPRINT, KEYS, SCOPE, problem_with, tokens_for
from reliability_workers.procs import worker_env
from reliability_workers.reports import IN_FLIGHT_DEBRIS, check_problems
from snapcache import SnapshotKey, SnapshotStore
from snapcache.disk.disk_tier import DiskTier


def start_worker(command: list[str], log: Path) -> subprocess.Popen[str]:
    """Start a worker that prints "ready" once its store is open; its stderr goes to `log`."""
    with open(log, "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, env=worker_env())
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.communicate()
        pytest.fail(f"worker did not start:\n{log.read_text()[-4000:]}")
    return proc


def wait_for_acknowledged(
    journal: Path, count: int, proc: subprocess.Popen[str], timeout: float = 60
) -> None:
    """Wait until the worker's journal shows `count` calls that returned (so a kill hits a busy writer)."""
    deadline = time.monotonic() + timeout
    while sum(1 for event in read_journal(journal) if event[0] in ("kept", "refused")) < count:
        assert proc.poll() is None, "the worker died on its own"
        assert time.monotonic() < deadline, f"the worker acknowledged fewer than {count} calls in {timeout} s"
        time.sleep(0.01)


def kill_9(proc: subprocess.Popen[str], log: Path) -> None:
    """SIGKILL a worker that must still be running."""
    assert proc.poll() is None, f"the worker died on its own:\n{log.read_text()[-4000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def repair_debris(directory: Path, budget_bytes: int) -> int:
    """check(repair=True) right after a kill: nothing may be missing or corrupt, only the files of
    writes in flight (temporary, or written but not committed, or freed by a commit but not yet
    deleted); afterwards the directory checks clean. Returns how many such files were removed."""
    tier = DiskTier(directory, budget_bytes)
    try:
        first = tier.check(repair=True, verify=True, grace_seconds=0)
        assert check_problems(first, allowed=IN_FLIGHT_DEBRIS) == [], first
        second = tier.check(repair=False, verify=True, grace_seconds=0)
        assert second.ok, second
    finally:
        tier.close()
    return sum(len(getattr(first, name)) for name in IN_FLIGHT_DEBRIS)


KEY_NUMBERS = {SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens_for(i)).id: str(i) for i in range(KEYS)}


def served_snapshots(directory: Path, budget_bytes: int, scale: int = 1) -> set[str]:
    """The numbers of the crash writers' snapshots a fresh store serves from `directory`, each
    checked byte for byte (payload.state_for at `scale`); the files stay within the budget."""
    found = set()
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=budget_bytes) as store:
        for row in store.entries():
            assert row.key.id in KEY_NUMBERS, f"{row.key.id[:12]} is no snapshot any writer puts"
            snap = store.get(row.key)
            assert snap is not None, f"listed entry {KEY_NUMBERS[row.key.id]} is not served"
            assert problem_with(snap, scale=scale) is None
            found.add(KEY_NUMBERS[row.key.id])
    assert snapshot_bytes(directory) <= budget_bytes
    return found
