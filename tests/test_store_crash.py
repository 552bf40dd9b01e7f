"""kill -9 in the middle of writes: the directory opens, check() finds only debris, served bytes are right."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from snapcache.store import SnapshotStore

REPO = Path(__file__).resolve().parents[1]
FP = "fp-crash"
SCOPE = "crash"
ROUNDS = 4

# The child writes snapshot after snapshot; its state bytes follow from the tokens alone, so the
# parent can verify whatever survives. It prints "ready" once the store is open.
CHILD = textwrap.dedent(
    """
    import hashlib, sys
    import numpy as np
    from snapcache.key import SnapshotKey
    from snapcache.store import SnapshotStore

    def state_for(tokens):
        seed = int.from_bytes(hashlib.blake2b(tokens.tobytes(), digest_size=8).digest(), "little")
        rng = np.random.default_rng(seed)
        return rng.bytes(int(rng.integers(50_000, 400_000)))

    directory, start = sys.argv[1], int(sys.argv[2])
    store = SnapshotStore(directory, ram_bytes=2 << 20, disk_bytes=12 << 20)
    print("ready", flush=True)
    i = start
    while True:
        tokens = np.arange(i, i + 1 + i % 50, dtype="<i4")
        key = SnapshotKey.for_tokens("fp-crash", "crash", tokens)
        store.put(key, tokens, state_for(tokens), priority=i % 3)
        i += 1
    """
)


def state_for(tokens: np.ndarray) -> bytes:
    seed = int.from_bytes(
        hashlib.blake2b(np.asarray(tokens, "<i4").tobytes(), digest_size=8).digest(), "little"
    )
    rng = np.random.default_rng(seed)
    return rng.bytes(int(rng.integers(50_000, 400_000)))


@pytest.mark.slow
def test_kill_9_mid_writes_leaves_only_debris_and_right_bytes(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    rng = random.Random(20240601)
    for round_ in range(ROUNDS):
        child = subprocess.Popen(
            [sys.executable, str(script), str(directory), str(round_ * 100_000)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == b"ready", child.stderr.read() if child.stderr else b""
            time.sleep(rng.uniform(0.3, 1.5))
            assert child.poll() is None, "the writer died on its own"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            for pipe in (child.stdout, child.stderr):
                if pipe is not None:
                    pipe.close()
        assert child.returncode == -signal.SIGKILL

    with SnapshotStore(directory, ram_bytes=0, disk_bytes=12 << 20) as store:
        report = store.check(repair=True, verify=True, grace_seconds=0)
        print(f"\nafter {ROUNDS} kills: {report}")
        # Only what writes in flight leave behind: temporary files and files whose row never committed.
        assert report.missing_files == ()
        assert report.corrupt_files == ()
        assert store.check(repair=False, verify=True, grace_seconds=0).ok
        rows = store.entries()
        assert len(rows) >= ROUNDS  # every round got some snapshots onto the disk
        assert store.stats().disk_used_bytes <= 12 << 20
        for row in rows:
            snap = store.get(row.key)
            assert snap is not None
            assert row.key.matches(snap.tokens)
            assert bytes(snap.state) == state_for(snap.tokens)
        # Longest-prefix lookup serves them too.
        first = store.get(rows[0].key)
        assert first is not None
        found = store.lookup(FP, SCOPE, np.concatenate([first.tokens, np.zeros(3, dtype="<i4")]))
        assert found is not None
        assert found.key == first.key
