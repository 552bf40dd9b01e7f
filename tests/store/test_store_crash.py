"""kill -9 in the middle of large writes through RAM and the background writer: every put a flush
covered is served with its bytes, and check() finds only the files of writes in flight."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest
from reliability_workers.journal import Owed, read_journal
from reliability_workers.payload import FINGERPRINT, LARGE_SCALE, SCOPE, problem_with, tokens_for
from reliability_workers.procs import worker_command
from reliability_workers.survival import (
    kill_9,
    repair_debris,
    served_snapshots,
    start_worker,
    wait_for_acknowledged,
)

from snapcache.store import SnapshotStore

ROUNDS = 4
# Room for every snapshot the writer puts (300 of at most 390 KB): nothing is evicted, all is owed.
DISK_BYTES = 128 << 20
# The writer thread's put (its file, and the one it replaces) and a remove on the calling thread.
IN_FLIGHT_FILES = 3


@pytest.mark.slow
def test_kill_9_mid_writes_loses_no_flushed_put(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    owed = Owed(evictable_below=0)
    rng = random.Random(20240601)
    figures = []
    for round_ in range(ROUNDS):
        log, journal = tmp_path / f"writer-{round_}.log", tmp_path / f"journal-{round_}"
        proc = start_worker(
            worker_command("crash_writer.py", directory, DISK_BYTES, "large", round_, journal), log
        )
        wait_for_acknowledged(journal, 2, proc)
        time.sleep(rng.uniform(0.2, 1.2))
        kill_9(proc, log)
        debris = repair_debris(directory, DISK_BYTES)
        assert debris <= IN_FLIGHT_FILES
        acknowledged = owed.replay(read_journal(journal), write_behind=True)
        served = served_snapshots(directory, DISK_BYTES, scale=LARGE_SCALE)
        assert owed.problems(served) == [], f"round {round_}"
        figures.append((acknowledged, len(owed.owed), len(served), debris))
    print(f"\n{ROUNDS} kills, (acknowledged, owed, served, debris) after each: {figures}")
    assert len(owed.owed) >= ROUNDS  # the rounds got snapshots onto the disk

    # Longest-prefix lookup serves them too: a snapshot's tokens and three more find that snapshot.
    index = int(min(owed.owed, key=int))
    query = np.concatenate([tokens_for(index), np.zeros(3, dtype="<i4")])
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK_BYTES) as store:
        found = store.lookup(FINGERPRINT, SCOPE, query)
    assert found is not None
    assert problem_with(found, query, scale=LARGE_SCALE) is None
    assert len(found.tokens) == len(tokens_for(index))
