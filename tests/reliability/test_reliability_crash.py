"""SIGKILL a writer at random moments during puts, removes and evictions: every acknowledged put survives.

Twenty kills over two store directories, written by turns on the calling thread (a put returns once
its file and row are on disk) and through the background writer (a put is on disk once a later
flush returns). Each worker journals every call (reliability_workers/journal.py). After each kill the
parent repairs only the debris of writes in flight, at most what the threads writing at the kill
could leave, and then asks a fresh store for every snapshot: each one owed is served with its bytes,
none removed comes back, nothing never written appears. The "roomy" directory's budget holds every
snapshot, so everything acknowledged is owed; the "tight" one holds the protected snapshots and a
few others, so it evicts on almost every put, and only the protected ones (which no put of a lower
priority may evict) are owed there.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from reliability_workers.disk_files import snapshot_bytes
from reliability_workers.journal import Owed, read_journal
from reliability_workers.payload import BASE_LENGTH, MAX_STATE, MIN_STATE, PROTECTED, PROTECTED_PRIORITY
from reliability_workers.procs import worker_command
from reliability_workers.survival import (
    kill_9,
    repair_debris,
    served_snapshots,
    start_worker,
    wait_for_acknowledged,
)

KILLS = 20
BUDGETS = {"roomy": 4 << 20, "tight": 256 << 10}
# A file holds a state of MIN_STATE to MAX_STATE bytes, its tokens and a header (payload.py).
MAX_FILE_BYTES = MAX_STATE + 4 * BASE_LENGTH + 1024
# Files one thread's write in flight can leave: its own (temporary or uncommitted), and those its
# commit freed but did not delete yet: the file it replaced and, in the tight directory, those it
# evicted to make room (each at least MIN_STATE bytes).
EVICTED_BY_ONE_PUT = -(-MAX_FILE_BYTES // MIN_STATE)


def in_flight_files(directory: str, mode: str) -> int:
    """The most files the writes in flight at a kill may leave: one put per writing thread, and with
    the background writer also a remove on the calling thread (the file its commit freed)."""
    per_put = 2 + (EVICTED_BY_ONE_PUT if directory == "tight" else 0)
    return per_put + (1 if mode == "background" else 0)


def test_twenty_sigkills_lose_no_acknowledged_put(tmp_path: Path) -> None:
    assert BUDGETS["tight"] * 2 // 3 > PROTECTED * MAX_FILE_BYTES
    owed = {name: Owed(evictable_below=0 if name == "roomy" else PROTECTED_PRIORITY) for name in BUDGETS}
    rng = random.Random(1234)
    lines = []
    totals = {"acknowledged": 0, "debris": 0}
    last_served: dict[str, set[str]] = {}
    for kill in range(KILLS):
        name = ("roomy", "tight")[kill % 2]
        mode = ("sync", "background")[kill // 2 % 2]
        directory, budget, journal = tmp_path / name, BUDGETS[name], tmp_path / f"journal-{kill}"
        log = tmp_path / f"writer-{kill}.log"
        proc = start_worker(worker_command("crash_writer.py", directory, budget, mode, kill, journal), log)
        wait_for_acknowledged(journal, 3, proc)
        time.sleep(rng.uniform(0.05, 0.5))
        kill_9(proc, log)

        debris = repair_debris(directory, budget)
        assert debris <= in_flight_files(name, mode), (kill, debris)
        acknowledged = owed[name].replay(read_journal(journal), write_behind=mode != "sync")
        found = last_served[name] = served_snapshots(directory, budget)
        assert owed[name].problems(found) == [], f"kill {kill} ({name}, {mode})"
        totals["acknowledged"] += acknowledged
        totals["debris"] += debris
        lines.append(
            f"{kill:>4} {name:<6} {mode:<10} {acknowledged:>12} {len(owed[name].owed):>5} {len(found):>6}"
            f" {debris:>6}"
        )
    print("\nkill dir    writes     acknowledged  owed served debris\n" + "\n".join(lines))
    print(
        f"{KILLS} SIGKILLs after {totals['acknowledged']} acknowledged puts: every owed snapshot served"
        f" with its bytes; {totals['debris']} files of writes in flight removed"
    )
    for name, kept in owed.items():
        assert kept.acknowledged > KILLS, name  # the kills hit busy writers
    # The tight directory is full and serves fewer snapshots than it kept and was not asked to
    # remove: it evicted as the writers went.
    assert snapshot_bytes(tmp_path / "tight") > BUDGETS["tight"] - 2 * MAX_FILE_BYTES
    assert len(owed["tight"].alive) > len(last_served["tight"])
