"""Blocks of one prompt with their own state bytes, for the tests of block reads, pack files and uses."""

from __future__ import annotations

import numpy as np

from snapcache.key import block_keys
from snapcache.snapshot import Snapshot

BLOCK_BYTES = 30_000


def block_snapshots(n: int, *, seed: int = 0, priority: int = 0) -> list[Snapshot]:
    """`n` blocks of one prompt, each with its own state bytes."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 32_000, 64 * n, dtype=np.int32)
    keys = block_keys("fp-a", "default", tokens, n)
    return [
        Snapshot(
            key,
            tokens[64 * i : 64 * (i + 1)],
            rng.integers(0, 256, BLOCK_BYTES, dtype=np.uint8).tobytes(),
            priority=priority,
        )
        for i, key in enumerate(keys)
    ]
