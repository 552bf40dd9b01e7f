"""Several processes and threads share one small store directory: no errors, no wrong bytes, budgets hold."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest
from reliability_workers.disk_files import snapshot_bytes
from reliability_workers.payload import FINGERPRINT, SCOPE, problem_with, query_for, state_for, tokens_for
from reliability_workers.procs import WORKERS, worker_env
from reliability_workers.reports import check_problems

from snapcache import SnapshotKey, SnapshotStore

PROCESSES = 4
THREADS_PER_PROCESS = 2
SECONDS = 4.0
IN_PROCESS_THREADS = 8
DISK_BYTES = 64 << 10
RAM_BYTES = 24 << 10


def test_four_processes_of_two_threads_share_one_directory(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKERS / "churn.py"),
                str(directory),
                str(SECONDS),
                str(THREADS_PER_PROCESS),
                str(seed),
                str(RAM_BYTES),
                str(DISK_BYTES),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=worker_env(),
        )
        for seed in range(PROCESSES)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"worker failed:\n{err}"
        results.append(json.loads(out.strip().splitlines()[-1]))

    problems = [p for r in results for p in r["problems"]]
    assert problems == []
    totals = {name: sum(r["counts"][name] for r in results) for name in results[0]["counts"]}
    stats = {name: sum(r["stats"][name] for r in results) for name in results[0]["stats"]}
    print(f"\n{PROCESSES} processes x {THREADS_PER_PROCESS} threads, {SECONDS:.0f} s: {totals} {stats}")
    # Every kind of operation ran, and some reads were served (and verified) from the shared directory.
    assert all(totals[name] > 0 for name in ("put", "get", "lookup", "remove"))
    assert totals["get_hit"] + totals["lookup_hit"] > 0
    # The small budgets made the disk evict, and reads went through the shared files.
    assert stats["disk_evictions"] > 0
    assert stats["disk_hits"] > 0

    assert snapshot_bytes(directory) <= DISK_BYTES
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK_BYTES) as store:
        assert check_problems(store.check(repair=False)) == []
        stats = store.stats()
        assert stats.disk_used_bytes <= DISK_BYTES
        assert stats.disk_entries > 0
        for row in store.entries():
            snap = store.get(row.key)
            assert snap is not None
            assert problem_with(snap) is None


def test_eight_threads_share_one_store(tmp_path: Path) -> None:
    directory = tmp_path / "one"
    store = SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES)
    problems: list[str] = []
    ops_per_thread = 400

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(ops_per_thread):
                index = rng.randrange(120)
                tokens = tokens_for(index)
                key = SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens)
                op = rng.random()
                if op < 0.4:
                    store.put(key, tokens, state_for(tokens), priority=rng.randrange(3))
                elif op < 0.7:
                    snap = store.get(key)
                    if snap is not None and (problem_with(snap) or snap.key != key):
                        problems.append(problem_with(snap) or "get served another key")
                elif op < 0.95:
                    query = query_for(index, rng.randrange(60))
                    snap = store.lookup(FINGERPRINT, SCOPE, query)
                    if snap is not None and problem_with(snap, query):
                        problems.append(str(problem_with(snap, query)))
                else:
                    store.remove(key)
        except BaseException:
            problems.append(traceback.format_exc())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(IN_PROCESS_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    try:
        assert problems == []
        store.flush()
        stats = store.stats()
        assert stats.ram_used_bytes <= RAM_BYTES
        assert stats.disk_used_bytes <= DISK_BYTES
        assert stats.evictions > 0
        assert check_problems(store.check(repair=False)) == []
    finally:
        store.close()
    assert snapshot_bytes(directory) <= DISK_BYTES


@pytest.mark.parametrize("ram_bytes", [0, RAM_BYTES])
def test_a_reopened_store_serves_only_verified_bytes(tmp_path: Path, ram_bytes: int) -> None:
    """After the churn, a fresh store serves every listed entry with the right bytes."""
    directory = tmp_path / "reopen"
    with SnapshotStore(directory, ram_bytes=ram_bytes, disk_bytes=DISK_BYTES) as store:
        for index in range(60):
            tokens = tokens_for(index)
            store.put(SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens), tokens, state_for(tokens))
    with SnapshotStore(directory, ram_bytes=ram_bytes, disk_bytes=DISK_BYTES) as store:
        rows = store.entries()
        assert rows
        for row in rows:
            snap = store.get(row.key)
            assert snap is not None
            assert problem_with(snap) is None
    assert snapshot_bytes(directory) <= DISK_BYTES
