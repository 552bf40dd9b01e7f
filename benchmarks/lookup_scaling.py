"""Longest-prefix lookup latency as a store grows, beside llama-cpp-python's LlamaRAMCache lookup.

Both sides hold the same keys (token sequences) with tiny dummy states: the point is lookup cost.
The stored sequences look like conversations that share the query's system prompt (its first
quarter) and some of what follows, then diverge; their lengths are log-uniform between 16 tokens and
the prompt length; about 1% are exact prefixes of the query, so there is always a right answer.

snapcache: `SnapshotStore(None).lookup(fingerprint, scope, prompt)`.
LlamaRAMCache: `_find_longest_prefix_key(tuple(prompt))`, what `Llama.__call__` runs on every request
(it compares the prompt with every stored key, token by token).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import _common
import numpy as np
from _common import Table, fmt_ratio, fmt_seconds, make_parser, report, time_call

VOCAB = 262_144  # Gemma 3's vocabulary size: realistic token ids
FINGERPRINT = "lookup-benchmark"
SCOPE = "bench"
EXACT_SHARE = 0.01
# LlamaRAMCache keys are tuples of Python ints (8 bytes a token). Past this many stored tokens its
# lookup is extrapolated from the largest size measured: it is a plain scan over every key.
RAMCACHE_TOKEN_BUDGET = 50_000_000
DUMMY_STATE = b"\x00" * 16

FULL_SIZES = [100, 1_000, 10_000, 100_000]
FULL_PROMPTS = [512, 2_048, 16_384]
QUICK_SIZES = [100, 1_000]
QUICK_PROMPTS = [512, 2_048]


class _DummyState:
    """Stands in for llama_cpp.LlamaState: LlamaRAMCache only reads llama_state_size."""

    llama_state_size = len(DUMMY_STATE)


def _stored_sequence(rng: np.random.Generator, query: np.ndarray, exact: bool) -> np.ndarray:
    """One stored token sequence: a prefix of `query` (exact) or a conversation that diverges from it."""
    limit = len(query)
    length = int(math.exp(rng.uniform(math.log(16), math.log(limit))))
    length = max(2, min(length, limit - 1))
    if exact:
        return query[:length].copy()
    system = limit // 4
    shared = int(rng.integers(min(system, length - 1), length))  # in [min(system, len-1), len-1]
    tail = rng.integers(0, VOCAB, size=length - shared, dtype=np.int32)
    if tail[0] == query[shared]:
        tail[0] = (tail[0] + 1) % VOCAB
    return np.concatenate([query[:shared], tail])


def _measure_prompt(
    prompt_tokens: int, sizes: list[int], seed: int, table: Table, rows: list[dict[str, Any]]
) -> None:
    from llama_cpp.llama_cache import LlamaRAMCache

    from snapcache import SnapshotKey, SnapshotStore

    rng = np.random.default_rng(seed)
    query = rng.integers(0, VOCAB, size=prompt_tokens, dtype=np.int32)
    query_list = query.tolist()  # what a caller holds: llama-cpp-python tokenizes into lists
    pool = np.arange(VOCAB).astype(object)  # shared int objects, as one tokenizer's output would be

    ram_cache = LlamaRAMCache(capacity_bytes=1 << 62)
    ram_tokens = 0
    ram_complete = True  # every stored sequence is in ram_cache too
    keys: set[Any] = set()
    ram_measured: tuple[int, float] | None = None  # (size, seconds) of the largest measured size
    best_exact = 0
    distinct_lengths: set[int] = set()
    store = SnapshotStore(None, ram_bytes=1 << 40)
    try:
        count = 0
        for size in sizes:
            started = time.perf_counter()
            while count < size:
                exact = count < 4 or rng.random() < EXACT_SHARE
                tokens = _stored_sequence(rng, query, exact)
                key = SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens)
                if key in keys:
                    continue  # the same sequence drawn twice: both sides hold distinct entries
                keys.add(key)
                if exact:
                    best_exact = max(best_exact, len(tokens))
                distinct_lengths.add(len(tokens))
                store.put(key, tokens, DUMMY_STATE)
                if ram_complete and ram_tokens + len(tokens) <= RAMCACHE_TOKEN_BUDGET:
                    # Insert directly: __setitem__ re-sums every entry's size on each insert.
                    ram_cache.cache_state[tuple(pool[tokens].tolist())] = _DummyState()
                    ram_tokens += len(tokens)
                else:
                    ram_complete = False
                count += 1
            build_s = time.perf_counter() - started

            found = store.lookup(FINGERPRINT, SCOPE, query_list)
            found_len = 0 if found is None else found.key.token_count
            if found_len != best_exact:
                raise SystemExit(
                    f"snapcache found a {found_len}-token prefix, expected {best_exact} "
                    f"(prompt {prompt_tokens}, {size} snapshots)"
                )
            snap_s, snap_n = time_call(
                lambda: store.lookup(FINGERPRINT, SCOPE, query_list), min_time=0.3, min_iterations=5
            )

            estimated = len(ram_cache.cache_state) < size
            if not estimated:
                ram_s, ram_n = time_call(
                    lambda: ram_cache._find_longest_prefix_key(tuple(query_list)),
                    min_time=0.5,
                    min_iterations=1,
                    max_iterations=50,
                )
                ram_measured = (size, ram_s)
            else:
                assert ram_measured is not None
                ram_s = ram_measured[1] * size / ram_measured[0]
                ram_n = 0
            mark = "*" if estimated else ""
            table.add(
                f"{prompt_tokens:,}",
                f"{size:,}",
                f"{len(distinct_lengths):,}",
                fmt_seconds(snap_s),
                fmt_seconds(ram_s) + mark,
                fmt_ratio(ram_s, snap_s) + mark,
            )
            rows.append(
                {
                    "prompt_tokens": prompt_tokens,
                    "snapshots": size,
                    "distinct_lengths": len(distinct_lengths),
                    "longest_prefix_found": found_len,
                    "snapcache_lookup_s": snap_s,
                    "snapcache_iterations": snap_n,
                    "llamaramcache_lookup_s": ram_s,
                    "llamaramcache_iterations": ram_n,
                    "llamaramcache_extrapolated": estimated,
                    "speedup": ram_s / snap_s,
                    "build_s": build_s,
                }
            )
            print(f"  prompt {prompt_tokens:>6,} tokens, {size:>7,} snapshots: snapcache "
                  f"{fmt_seconds(snap_s)}, LlamaRAMCache {fmt_seconds(ram_s)}{mark}", file=sys.stderr)
    finally:
        store.close()
        ram_cache.cache_state.clear()


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="store sizes to measure (snapshots)")
    parser.add_argument("--prompts", type=int, nargs="+", help="prompt lengths to measure (tokens)")
    args = parser.parse_args(argv)
    sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES))
    prompts = args.prompts or (QUICK_PROMPTS if args.quick else FULL_PROMPTS)

    table = Table(
        "Longest-prefix lookup latency (median per lookup; dummy states)",
        ["prompt tokens", "snapshots", "distinct lengths", "snapcache", "LlamaRAMCache", "speed-up"],
    )
    rows: list[dict[str, Any]] = []
    for i, prompt_tokens in enumerate(prompts):
        _measure_prompt(prompt_tokens, sizes, seed=1234 + i, table=table, rows=rows)
    table.notes.append(
        "Stored sequences share the prompt's first quarter (a system prompt) and more, then diverge; "
        "1% are exact prefixes."
    )
    table.notes.append("Both sides look up from a Python list of token ids, as llama-cpp-python holds them.")
    if any(row["llamaramcache_extrapolated"] for row in rows):
        table.notes.append(
            "* LlamaRAMCache extrapolated linearly from the largest size measured: its lookup scans "
            f"every key, and past {RAMCACHE_TOKEN_BUDGET:,} stored tokens its keys (tuples of ints) "
            "outgrow this benchmark's memory."
        )
    report("lookup_scaling", [table], args.json, quick=args.quick, extra={"rows": rows})
    return 0


if __name__ == "__main__":
    _ = _common.ROOT  # keeps the sys.path setup of _common explicit
    sys.exit(main())
