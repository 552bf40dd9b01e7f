"""Worker: puts (and sometimes removes) snapshots in a loop until it is killed.

Usage: crash_writer.py DIRECTORY DISK_BYTES MODE SEED PROGRESS_FILE
MODE "sync": disk only, every put written on the calling thread; "background": a RAM tier and the
background writer. Prints "ready" once the store is open; the budget is small, so most puts evict.
Appends one byte to PROGRESS_FILE after every put returns, so the parent knows how far it got.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from payload import FINGERPRINT, SCOPE, state_for, tokens_for

from snapcache import SnapshotKey, SnapshotStore


def main() -> None:
    directory, disk_bytes, mode, seed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    progress = os.open(sys.argv[5], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if mode == "sync":
        store = SnapshotStore(directory, ram_bytes=0, disk_bytes=disk_bytes, background_writes=False)
    else:
        store = SnapshotStore(directory, ram_bytes=16 << 10, disk_bytes=disk_bytes)
    print("ready", flush=True)
    rng = random.Random(seed)
    while True:
        tokens = tokens_for(rng.randrange(200))
        key = SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens)
        if rng.random() < 0.1:
            store.remove(key)
        else:
            store.put(key, tokens, state_for(tokens), priority=rng.randrange(3))
            os.write(progress, b".")


if __name__ == "__main__":
    main()
