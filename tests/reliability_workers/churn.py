"""Worker: several threads put, get, lookup and remove on one shared store directory for a while.

Usage: churn.py DIRECTORY SECONDS THREADS SEED RAM_BYTES DISK_BYTES
Prints one JSON line: operation counts and every problem seen (wrong bytes, exceptions).
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import traceback
from pathlib import Path

from payload import FINGERPRINT, SCOPE, problem_with, query_for, state_for, tokens_for

from snapcache import SnapshotKey, SnapshotStore

KEYS = 160


def run(directory: Path, seconds: float, threads: int, seed: int, ram_bytes: int, disk_bytes: int) -> dict:
    counts = {"put": 0, "get": 0, "get_hit": 0, "lookup": 0, "lookup_hit": 0, "remove": 0}
    problems: list[str] = []
    lock = threading.Lock()
    store = SnapshotStore(directory, ram_bytes=ram_bytes, disk_bytes=disk_bytes)
    deadline = time.monotonic() + seconds

    def work(thread_seed: int) -> None:
        rng = random.Random(thread_seed)
        local = dict.fromkeys(counts, 0)
        try:
            while time.monotonic() < deadline:
                index = rng.randrange(KEYS)
                tokens = tokens_for(index)
                key = SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens)
                op = rng.random()
                if op < 0.4:
                    store.put(key, tokens, state_for(tokens), priority=rng.randrange(3))
                    local["put"] += 1
                elif op < 0.7:
                    snap = store.get(key)
                    local["get"] += 1
                    if snap is not None:
                        local["get_hit"] += 1
                        problem = problem_with(snap)
                        if problem is None and snap.key != key:
                            problem = "get served another key"
                        if problem:
                            with lock:
                                problems.append(problem)
                elif op < 0.95:
                    query = query_for(index, rng.randrange(0, 60))
                    snap = store.lookup(FINGERPRINT, SCOPE, query)
                    local["lookup"] += 1
                    if snap is not None:
                        local["lookup_hit"] += 1
                        problem = problem_with(snap, query)
                        if problem:
                            with lock:
                                problems.append(problem)
                else:
                    store.remove(key)
                    local["remove"] += 1
        except BaseException:
            with lock:
                problems.append(traceback.format_exc())
        with lock:
            for name, value in local.items():
                counts[name] += value

    workers = [threading.Thread(target=work, args=(seed * 100 + i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stats: dict[str, int] = {}
    try:
        store.flush()
        snapshot = store.stats()
        stats = {
            name: getattr(snapshot, name) for name in ("disk_hits", "disk_evictions", "spills", "promotions")
        }
        store.close()
    except BaseException:
        problems.append(traceback.format_exc())
    return {"counts": counts, "stats": stats, "problems": problems}


if __name__ == "__main__":
    directory, seconds, threads, seed, ram_bytes, disk_bytes = sys.argv[1:7]
    result = run(Path(directory), float(seconds), int(threads), int(seed), int(ram_bytes), int(disk_bytes))
    print(json.dumps(result))
