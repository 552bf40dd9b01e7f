"""SnapshotStore costs: longest-prefix lookup among many snapshots, put on the caller's thread, disk hit.

- lookup: an 8,192-token prompt among 10,000 stored snapshots of 1,000 distinct lengths (10 token
  sequences, each stored at every length). "walk all lengths": the prompt shares only its first 16
  tokens with them, so every stored length is tried; "hit at once": the prompt extends one sequence,
  so the longest length matches. Target: median ≤ 1 ms.
- put: a 12 MB state into a store with both tiers; the time on the caller's thread (the disk write
  happens on the background writer). Target ≤ 5 ms.
- disk hit: `get` of a 12 MB snapshot from a disk-only store: read, decompress, verify. Target ≤ 40 ms.
  The state is a real Gemma-3-270M state when the demo model is installed, else f16-like data.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _common
import numpy as np
from _common import Table, fmt_bytes, fmt_seconds, make_parser, percentile, report

from snapcache.key import SnapshotKey, as_token_array
from snapcache.store import SnapshotStore

FP = "bench-store"
SCOPE = "bench"
VOCAB = 262_144
STATE_BYTES = 12_000_000


def samples(fn: Callable[[], object], count: int, between: Callable[[], object] | None = None) -> list[float]:
    out = []
    for _ in range(count):
        if between is not None:
            between()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def lookup_rows(table: Table, *, sequences: int, lengths: int, prompt: int, repeat: int, disk: bool) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, VOCAB, size=prompt, dtype=np.int32) for _ in range(sequences)]
    stored_lengths = np.unique(np.linspace(16, prompt, lengths).astype(int))
    walk_all = as_token_array(
        np.concatenate([docs[0][:16], rng.integers(0, VOCAB, prompt - 16, dtype=np.int32)])
    )
    hit_at_once = as_token_array(docs[3])
    state = b"s" * 16

    def fill(store: SnapshotStore) -> None:
        for doc in docs:
            for n in stored_lengths:
                tokens = doc[:n]
                store.put(SnapshotKey.for_tokens(FP, SCOPE, tokens), tokens, state)

    count = len(docs) * len(stored_lengths)
    with SnapshotStore(None, ram_bytes=1 << 30) as store:
        t0 = time.perf_counter()
        fill(store)
        fill_s = time.perf_counter() - t0
        for name, query, expect in (("walk all lengths", walk_all, 16), ("hit at once", hit_at_once, prompt)):
            found = store.lookup(FP, SCOPE, query)
            assert found is not None
            assert found.key.token_count == expect
            times = samples(lambda q=query: store.lookup(FP, SCOPE, q), repeat)
            table.add(
                f"RAM store, {name}",
                f"{count:,}",
                len(stored_lengths),
                f"{len(query):,}",
                fmt_seconds(statistics.median(times)),
                fmt_seconds(percentile(times, 90)),
                fmt_seconds(min(times)),
                "≤ 1 ms",
            )
    table.notes.append(f"filling the RAM store with {count:,} snapshots took {fill_s:.2f} s")
    if not disk:
        return
    # Disk-only: the lookup walks the store's cached catalog of the disk index. Written to a RAM
    # file system where there is one, since 10,000 fsyncs on a real disk take minutes.
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else None
    with tempfile.TemporaryDirectory(dir=base) as tmp, SnapshotStore(Path(tmp) / "c", ram_bytes=0) as store:
        fill(store)
        store.flush()
        for name, query, expect in (("walk all lengths", walk_all, 16), ("hit at once", hit_at_once, prompt)):
            found = store.lookup(FP, SCOPE, query)
            assert found is not None
            assert found.key.token_count == expect
            times = samples(lambda q=query: store.lookup(FP, SCOPE, q), repeat)
            table.add(
                f"disk-only store, {name}",
                f"{count:,}",
                len(stored_lengths),
                f"{len(query):,}",
                fmt_seconds(statistics.median(times)),
                fmt_seconds(percentile(times, 90)),
                fmt_seconds(min(times)),
                "≤ 1 ms",
            )
        # After another process changed the disk, the next lookup re-reads the catalog of its
        # fingerprint and scope (changes of this store's own making are applied in place).
        extra = docs[-1][: prompt - 1]
        with SnapshotStore(Path(tmp) / "c", ram_bytes=0, background_writes=False) as other:

            def change() -> None:
                other.put(SnapshotKey.for_tokens(FP, "other", extra), extra, state)

            times = samples(lambda: store.lookup(FP, SCOPE, walk_all), max(3, repeat // 50), between=change)
        table.add(
            "disk-only store, first lookup after another store wrote",
            f"{count:,}",
            len(stored_lengths),
            f"{len(walk_all):,}",
            fmt_seconds(statistics.median(times)),
            fmt_seconds(percentile(times, 90)),
            fmt_seconds(min(times)),
            "-",
        )


def real_or_synthetic_state(size: int, quick: bool) -> tuple[bytes, str]:
    if not quick:
        try:
            import bench_codec

            state = bench_codec.capture_gemma_state(1200)
        except Exception as exc:  # a benchmark falls back rather than fail
            print(f"note: could not capture a Gemma state ({exc}); using f16-like data", file=sys.stderr)
            state = None
        if state is not None:
            return state, "Gemma-3-270M state, 1,200 tokens"
    rng = np.random.default_rng(1)
    values = rng.normal(0.0, 1.0, size // 2).astype(np.float16)  # f16-like: compressible exponents
    return values.tobytes(), "f16-like random normal data"


def put_and_hit_rows(table: Table, *, repeat: int, quick: bool) -> None:
    state, what = real_or_synthetic_state(STATE_BYTES if not quick else 1_200_000, quick)
    tokens_of = [np.arange(i, i + 1_200, dtype=np.int32) for i in range(repeat)]
    keys = [SnapshotKey.for_tokens(FP, SCOPE, t) for t in tokens_of]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "c"
        with SnapshotStore(directory, ram_bytes=1 << 30, disk_bytes=4 << 30) as store:
            store.put(keys[0], tokens_of[0], state)  # warm-up
            store.flush()
            puts = []
            for key, tokens in zip(keys, tokens_of, strict=True):
                t0 = time.perf_counter()
                store.put(key, tokens, state)
                puts.append(time.perf_counter() - t0)
                store.flush()  # each put meets an idle writer, as between two prompts
            table.add(
                f"put {fmt_bytes(len(state))}, caller's thread",
                fmt_seconds(statistics.median(puts)),
                fmt_seconds(percentile(puts, 90)),
                fmt_seconds(min(puts)),
                "≤ 5 ms",
            )
        file_bytes = sum(p.stat().st_size for p in (directory / "snapshots").glob("*.snap")) / len(keys)
        with SnapshotStore(directory, ram_bytes=0) as store:
            hits = samples(lambda: store.get(keys[1]), repeat)
            snap = store.get(keys[1])
            assert snap is not None
            assert bytes(snap.state) == state
            table.add(
                f"disk hit {fmt_bytes(len(state))} (file {fmt_bytes(file_bytes)}): read, decompress, verify",
                fmt_seconds(statistics.median(hits)),
                fmt_seconds(percentile(hits, 90)),
                fmt_seconds(min(hits)),
                "≤ 40 ms",
            )
    table.notes.append(f"state: {what}")


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--no-disk-lookup", action="store_true", help="skip the disk-only lookup rows (slow to fill)"
    )
    args = parser.parse_args()
    quick = args.quick
    lookup = Table(
        "longest-prefix lookup",
        ["store, case", "snapshots", "lengths", "prompt", "median", "p90", "best", "target"],
    )
    if quick:
        lookup_rows(lookup, sequences=4, lengths=100, prompt=1_024, repeat=50, disk=not args.no_disk_lookup)
    else:
        lookup_rows(
            lookup, sequences=10, lengths=1_000, prompt=8_192, repeat=300, disk=not args.no_disk_lookup
        )
    io = Table("put and disk hit", ["operation", "median", "p90", "best", "target"])
    put_and_hit_rows(io, repeat=5 if quick else 15, quick=quick)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    io.notes.append(
        f"load average at the end: {load:.1f} on {os.cpu_count()} cores (other work skews the medians)"
    )
    report("bench_store", [lookup, io], args.json, quick=quick)


if __name__ == "__main__":
    _common  # noqa: B018 - imported for its sys.path setup
    main()
