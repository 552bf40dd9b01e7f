"""Codec benchmark on real llama.cpp sequence states: format 1's codec against blosc2, and checksums.

    python benchmarks/bench_codec.py [--tokens 1200] [--long-tokens 9344] [--levels 1,3] [--json PATH]

States come from llama.cpp itself: Gemma-3-270M with its default f16 KV cache (1,200 tokens, and a
9,344-token prompt: 35 MiB), the same model with a q8_0 KV cache (flash attention on), and the test
suite's tiny llama model. Captured states are kept in a temporary directory so that a second run
skips the prefills (--fresh to redo them); the long one takes a few minutes of prefill once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snapcache.formats import codec  # noqa: E402

STATE_CACHE = Path(tempfile.gettempdir()) / "snapcache-bench-states"
GGML_TYPE_Q8_0 = 8  # ggml_type enum: llama_cpp.GGML_TYPE_Q8_0


def prompt_text() -> str:
    """Deterministic real text: the documentation of a few standard-library modules."""
    import argparse as a
    import json as j
    import logging as lg
    import sqlite3 as s
    import zipfile as z

    return "\n\n".join((m.__doc__ or "") for m in (j, a, lg, s, z)) * 6


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
    from snapcache.llama.setup.demo_model import default_model_path

    return default_model_path()


def capture_gemma_state(n_tokens: int = 1200, *, fresh: bool = False) -> bytes | None:
    """A real Gemma-3-270M state (f16 KV) of `n_tokens` tokens, or None without the demo model."""
    path = gemma_path()
    return None if path is None else cached_state("gemma-f16", path, n_tokens, fresh)


def real_states(n_tokens: int, fresh: bool, *, gemma: bool = True, long_tokens: int = 0) -> dict[str, bytes]:
    states: dict[str, bytes] = {}
    path = gemma_path() if gemma else None
    if gemma and path is None:
        print("Gemma demo model not installed: skipping Gemma states", file=sys.stderr)
    if path is not None:
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
        if long_tokens:
            states[f"gemma f16 KV {long_tokens}"] = cached_state("gemma-f16", path, long_tokens, fresh)
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
    """Format 1's codec (level 1), then blosc2 at each level on 1 and 2 threads; each into one buffer."""
    rows = []
    mb = len(state) / 1e6
    out = np.empty(len(state), dtype=np.uint8)

    def row(codec_name: str, level: int, threads: int, payload: bytes, c: float, d: float) -> None:
        rows.append(
            {
                "state": name,
                "state_mb": round(mb, 2),
                "codec": codec_name,
                "level": level,
                "threads": threads,
                "ratio": round(len(state) / len(payload), 3),
                "compress_mb_s": round(mb / c),
                "decompress_gb_s": round(mb / d / 1e3, 2),
                "decompress_ms": round(d * 1e3, 1),
            }
        )

    payload = codec.compress_zstd_frame(state, level=1, shuffle=True)
    assert bytes(codec.decompress_zstd_frame(payload, expected_size=len(state), shuffle=True)) == state
    c = best_seconds(lambda: codec.compress_zstd_frame(state, level=1, shuffle=True), repeat)
    d = best_seconds(
        lambda: codec.decompress_zstd_frame(payload, expected_size=len(state), shuffle=True), repeat
    )
    row("zstd frame + numpy shuffle (format 1)", 1, 1, payload, c, d)
    for level in levels:
        for threads in (1, 2):
            payload = codec.compress(state, level=level, threads=threads)
            codec.decompress_into(payload, out.data, threads=threads)
            assert out.tobytes() == state
            c = best_seconds(lambda: codec.compress(state, level=level, threads=threads), repeat)  # noqa: B023
            d = best_seconds(
                lambda: codec.decompress_into(payload, out.data, threads=threads),  # noqa: B023
                repeat,
            )
            row("blosc2 zstd + shuffle (format 2)", level, threads, payload, c, d)
    return rows


def inner_codec_rows(name: str, state: bytes, repeat: int) -> list[dict[str, Any]]:
    """blosc2's own codecs, level 1, 2-byte shuffle, 2 threads: why zstd."""
    import blosc2

    rows = []
    mb = len(state) / 1e6
    out = np.empty(len(state), dtype=np.uint8)
    for codec_name in ("ZSTD", "LZ4", "BLOSCLZ"):
        params = {
            "codec": getattr(blosc2.Codec, codec_name),
            "clevel": 1,
            "filters": [blosc2.Filter.SHUFFLE],
            "typesize": 2,
            "nthreads": 2,
        }
        payload = blosc2.compress2(state, **params)
        d = best_seconds(lambda: blosc2.decompress2(payload, dst=out, nthreads=2), repeat)  # noqa: B023
        rows.append(
            {
                "state": name,
                "blosc2_codec": codec_name.lower(),
                "ratio": round(len(state) / len(payload), 3),
                "decompress_gb_s": round(mb / d / 1e3, 2),
            }
        )
    return rows


def checksum_rows(state: bytes, repeat: int) -> list[dict[str, Any]]:
    import blake3
    import xxhash

    rows = []
    for name, fn in (
        ("sha256 (hashlib)", lambda: hashlib.sha256(state).digest()),
        ("blake2b (hashlib)", lambda: hashlib.blake2b(state).digest()),
        ("blake3 (blake3, 1 thread)", lambda: blake3.blake3(state).digest()),
        ("xxh3_128 (xxhash)", lambda: xxhash.xxh3_128_digest(state)),
        ("crc32 (zlib)", lambda: zlib.crc32(state)),
    ):
        seconds = best_seconds(fn, repeat)
        rows.append(
            {"checksum": name, "ms": round(seconds * 1e3, 2), "gb_s": round(len(state) / 1e9 / seconds, 2)}
        )
    return rows


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
    parser.add_argument(
        "--long-tokens", type=int, default=9344, help="tokens of the long Gemma state (0: none)"
    )
    parser.add_argument("--levels", default="1,3", help="blosc2 levels, comma-separated")
    parser.add_argument("--repeat", type=int, default=7, help="timing repetitions (best is kept)")
    parser.add_argument("--fresh", action="store_true", help="capture the states again")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    levels = [int(v) for v in args.levels.split(",")]

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"{os.cpu_count()} CPU cores, load average {load}: timings inflate when other work runs\n")
    states = real_states(args.tokens, args.fresh, long_tokens=args.long_tokens)
    if not states:
        sys.exit("no model available to capture a state from")
    results: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "states": {name: len(s) for name, s in states.items()},
        "defaults": {
            "level": codec.DEFAULT_LEVEL,
            "shuffle": codec.DEFAULT_SHUFFLE,
            "threads": codec.DEFAULT_THREADS,
        },
    }

    codec_table = [row for name, s in states.items() for row in codec_rows(name, s, levels, args.repeat)]
    print(f"codecs (best of {args.repeat}; decompress into one preallocated buffer, unshuffle included)")
    print_table(codec_table)
    results["codec"] = codec_table

    first_name, first = next(iter(states.items()))
    inner_table = inner_codec_rows(first_name, first, args.repeat)
    print("blosc2's codecs at level 1 after the 2-byte shuffle, 2 threads")
    print_table(inner_table)
    results["blosc2_codecs"] = inner_table

    largest_name, largest = max(states.items(), key=lambda item: len(item[1]))
    print(f"checksums over {largest_name} ({len(largest) / 1e6:.1f} MB)")
    checksum_table = checksum_rows(largest, args.repeat)
    print_table(checksum_table)
    results["checksums"] = checksum_table
    print("A disk hit end to end: benchmarks/bench_disk_hit.py")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
