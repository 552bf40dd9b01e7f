"""Codec benchmark on real llama.cpp sequence states: zstd level x byte shuffle, and a disk-tier hit.

    python benchmarks/bench_codec.py [--tokens 1200] [--levels 1,3,6,9] [--json results.json]

States come from llama.cpp itself: Gemma-3-270M with its default f16 KV cache, the same model with
a q8_0 KV cache (flash attention on), and the test suite's tiny llama model. Captured states are
kept in a temporary directory so that a second run skips the prefills (--fresh to redo them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snapcache import codec  # noqa: E402
from snapcache.disk_tier import DiskTier  # noqa: E402
from snapcache.key import SnapshotKey  # noqa: E402
from snapcache.snapshot import Snapshot  # noqa: E402

STATE_CACHE = Path(tempfile.gettempdir()) / "snapcache-bench-states"
GGML_TYPE_Q8_0 = 8  # ggml_type enum: llama_cpp.GGML_TYPE_Q8_0


def prompt_text() -> str:
    """Deterministic real text: the documentation of a few standard-library modules."""
    import argparse as a
    import json as j
    import logging as lg
    import sqlite3 as s
    import zipfile as z

    return "\n\n".join((m.__doc__ or "") for m in (j, a, lg, s, z)) * 4


def capture_state(model_path: Path, n_tokens: int, **llama_kwargs: Any) -> bytes:
    """Prefill `n_tokens` of prompt_text() and return the raw llama_state_seq bytes of sequence 0."""
    import ctypes

    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(model_path),
        n_ctx=max(512, n_tokens + 64),
        n_threads=2,
        n_threads_batch=2,
        verbose=False,
        **llama_kwargs,
    )
    try:
        tokens = llm.tokenize(prompt_text().encode(), add_bos=True)[:n_tokens]
        llm.eval(tokens)
        ctx = llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0)
        return bytes(buffer)[:written]
    finally:
        llm.close()


def cached_state(name: str, model_path: Path, n_tokens: int, fresh: bool, **kwargs: Any) -> bytes:
    tag = hashlib.sha256(
        f"{model_path.resolve()}|{model_path.stat().st_size}|{n_tokens}|{sorted(kwargs.items())}".encode()
    ).hexdigest()[:16]
    path = STATE_CACHE / f"{name}-{tag}.bin"
    if path.exists() and not fresh:
        return path.read_bytes()
    print(f"capturing {name} ({n_tokens} tokens)...", file=sys.stderr, flush=True)
    state = capture_state(model_path, n_tokens, **kwargs)
    STATE_CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(state)
    return state


def gemma_path() -> Path | None:
    from snapcache.demo_model import default_model_path

    return default_model_path()


def capture_gemma_state(n_tokens: int = 1200, *, fresh: bool = False) -> bytes | None:
    """A real Gemma-3-270M state (f16 KV) of `n_tokens` tokens, or None without the demo model."""
    path = gemma_path()
    return None if path is None else cached_state("gemma-f16", path, n_tokens, fresh)


def real_states(n_tokens: int, fresh: bool) -> dict[str, bytes]:
    states: dict[str, bytes] = {}
    path = gemma_path()
    if path is None:
        print("Gemma demo model not installed: skipping Gemma states", file=sys.stderr)
    else:
        states["gemma f16 KV"] = cached_state("gemma-f16", path, n_tokens, fresh)
        states["gemma q8_0 KV"] = cached_state(
            "gemma-q8_0",
            path,
            n_tokens,
            fresh,
            type_k=GGML_TYPE_Q8_0,
            type_v=GGML_TYPE_Q8_0,
            flash_attn=True,
        )
    try:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_model import write_tiny_llama
    except ImportError:
        print("tests/tiny_model.py not found: skipping the tiny model", file=sys.stderr)
    else:
        STATE_CACHE.mkdir(parents=True, exist_ok=True)
        tiny = write_tiny_llama(STATE_CACHE / "tiny-llama-0.gguf", seed=0)
        states["tiny llama f16 KV"] = cached_state("tiny", tiny, min(n_tokens, 448), fresh)
    return states


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def codec_rows(name: str, state: bytes, levels: list[int], repeat: int) -> list[dict[str, Any]]:
    rows = []
    mb = len(state) / 1e6
    for level in levels:
        for shuffle in (False, True):
            payload = codec.compress(state, level=level, shuffle=shuffle)
            assert bytes(codec.decompress(payload, expected_size=len(state), shuffle=shuffle)) == state
            c = best_seconds(lambda: codec.compress(state, level=level, shuffle=shuffle), repeat)  # noqa: B023
            d = best_seconds(
                lambda: codec.decompress(payload, expected_size=len(state), shuffle=shuffle),  # noqa: B023
                repeat,
            )
            rows.append(
                {
                    "state": name,
                    "state_mb": round(mb, 2),
                    "level": level,
                    "shuffle": shuffle,
                    "ratio": round(len(state) / len(payload), 3),
                    "compress_mb_s": round(mb / c),
                    "decompress_mb_s": round(mb / d),
                    "compress_ms": round(c * 1e3, 1),
                    "decompress_ms": round(d * 1e3, 1),
                }
            )
    return rows


def thread_rows(name: str, state: bytes, level: int, repeat: int) -> list[dict[str, Any]]:
    """zstd with and without its worker threads, shuffled input."""
    shuffled = codec.shuffle2(state).data
    rows = []
    for threads in (0, 2):
        cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=threads)
        seconds = best_seconds(lambda: cctx.compress(shuffled), repeat)  # noqa: B023
        rows.append(
            {"state": name, "level": level, "threads": threads, "compress_ms": round(seconds * 1e3, 1)}
        )
    return rows


def checksum_rows(state: bytes, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for name, fn in (
        ("sha256", lambda: hashlib.sha256(state).digest()),
        ("blake2b", lambda: hashlib.blake2b(state).digest()),
        ("crc32", lambda: zlib.crc32(state)),
    ):
        seconds = best_seconds(fn, repeat)
        rows.append(
            {"checksum": name, "ms": round(seconds * 1e3, 2), "mb_s": round(len(state) / 1e6 / seconds)}
        )
    return rows


def disk_hit_row(name: str, state: bytes, level: int, repeat: int, secret: bytes | None) -> dict[str, Any]:
    """put and get through a real DiskTier: read, verify checksums (and MAC), decompress."""
    tokens = np.arange(1, 1201, dtype=np.int32)
    key = SnapshotKey.for_tokens("bench", "default", tokens)
    snapshot = Snapshot(key, tokens, state)
    with tempfile.TemporaryDirectory() as directory:
        tier = DiskTier(Path(directory) / "c", 1 << 30, compression_level=level, secret=secret)
        puts = []
        for _ in range(max(3, repeat // 3)):
            start = time.perf_counter()
            tier.put(snapshot)
            puts.append(time.perf_counter() - start)
        gets, cpu = [], []
        for _ in range(repeat):
            start, start_cpu = time.perf_counter(), time.thread_time()
            got = tier.get(key)
            gets.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
            assert got is not None
        assert bytes(got.state) == state
        file_bytes = tier.used_bytes
        tier.close()
    return {
        "state": name,
        "level": level,
        "mac": secret is not None,
        "file_mb": round(file_bytes / 1e6, 2),
        "put_ms_median": round(statistics.median(puts) * 1e3, 1),
        "get_ms_median": round(statistics.median(gets) * 1e3, 1),
        "get_ms_best": round(min(gets) * 1e3, 1),
        # CPU time of the calling thread: what the get costs when it has a core to itself.
        "get_cpu_ms_median": round(statistics.median(cpu) * 1e3, 1),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).rjust(widths[c]) for c in columns))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=1200, help="prompt tokens per captured state")
    parser.add_argument("--levels", default="1,3,6,9", help="zstd levels, comma-separated")
    parser.add_argument("--repeat", type=int, default=7, help="timing repetitions (best is kept)")
    parser.add_argument("--fresh", action="store_true", help="capture the states again")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    levels = [int(v) for v in args.levels.split(",")]

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"{os.cpu_count()} CPU cores, load average {load}: timings inflate when other work runs\n")
    states = real_states(args.tokens, args.fresh)
    if not states:
        sys.exit("no model available to capture a state from")
    results: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "states": {name: len(s) for name, s in states.items()},
        "defaults": {"level": codec.DEFAULT_LEVEL, "shuffle": codec.DEFAULT_SHUFFLE},
    }

    codec_table = [row for name, s in states.items() for row in codec_rows(name, s, levels, args.repeat)]
    print(f"codec (best of {args.repeat}; decompress includes the unshuffle)")
    print_table(codec_table)
    results["codec"] = codec_table

    largest_name, largest = max(states.items(), key=lambda item: len(item[1]))
    threads_table = [
        row for level in levels[:2] for row in thread_rows(largest_name, largest, level, args.repeat)
    ]
    print("zstd worker threads")
    print_table(threads_table)
    results["threads"] = threads_table

    print(f"checksums over {len(largest) / 1e6:.1f} MB")
    checksum_table = checksum_rows(largest, args.repeat)
    print_table(checksum_table)
    results["checksums"] = checksum_table

    disk_table = [
        disk_hit_row(largest_name, largest, codec.DEFAULT_LEVEL, max(args.repeat, 15), secret)
        for secret in (None, b"bench-secret")
    ]
    print("disk tier: put (encode + write + fsync + commit) and get (read + verify + decompress)")
    print_table(disk_table)
    results["disk"] = disk_table

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
