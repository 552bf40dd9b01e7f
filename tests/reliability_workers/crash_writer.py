"""Worker: puts (and sometimes removes) snapshots in a loop until it is killed, journalling each call.

Usage: crash_writer.py DIRECTORY DISK_BYTES MODE SEED JOURNAL
MODE "sync": disk only, every put written on the calling thread; "background": a small RAM tier and
the background writer, flushed now and then; "large": the same with states of 65 to 390 KB and a
2 MiB RAM tier (most puts spill). Prints "ready" once the store is open. Snapshot numbers below
PROTECTED are put at PROTECTED_PRIORITY, the others at a lower one (payload.py). Every call goes into
JOURNAL (journal.py) before it starts and after it returns.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from journal import Journal
from payload import (
    FINGERPRINT,
    KEYS,
    LARGE_SCALE,
    PROTECTED,
    PROTECTED_PRIORITY,
    SCOPE,
    state_for,
    tokens_for,
)

from snapcache import SnapshotKey, SnapshotStore

REMOVE_SHARE = 0.1
FLUSH_SHARE = 0.2
PROTECTED_SHARE = 0.25  # of the calls, besides those that pick a protected number at random


def open_store(directory: Path, disk_bytes: int, mode: str) -> SnapshotStore:
    if mode == "sync":
        return SnapshotStore(directory, ram_bytes=0, disk_bytes=disk_bytes, background_writes=False)
    ram_bytes = 2 << 20 if mode == "large" else 16 << 10
    return SnapshotStore(directory, ram_bytes=ram_bytes, disk_bytes=disk_bytes)


def main() -> None:
    directory, disk_bytes, mode, seed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    journal = Journal(sys.argv[5])
    scale = LARGE_SCALE if mode == "large" else 1
    store = open_store(directory, disk_bytes, mode)
    print("ready", flush=True)
    rng = random.Random(seed)
    while True:
        index = rng.randrange(PROTECTED) if rng.random() < PROTECTED_SHARE else rng.randrange(KEYS)
        tokens = tokens_for(index)
        key = SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens)
        if rng.random() < REMOVE_SHARE:
            journal.note("remove", index)
            store.remove(key)
            journal.note("removed", index)
        else:
            priority = PROTECTED_PRIORITY if index < PROTECTED else rng.randrange(PROTECTED_PRIORITY)
            journal.note("put", index, priority)
            kept = store.put(key, tokens, state_for(tokens, scale=scale), priority=priority)
            journal.note("kept" if kept is not None else "refused", index)
        if mode != "sync" and rng.random() < FLUSH_SHARE:
            store.flush()
            journal.note("flushed")


if __name__ == "__main__":
    main()
