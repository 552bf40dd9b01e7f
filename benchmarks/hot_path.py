"""The hot path: what a `put` of a 12 MB state costs the caller, and process memory against the RAM budget.

States are synthetic float16 KV-like data of the size Gemma-3-270M produces for a 1,211-token prompt
(every put gets its own buffer and its own 1,211 tokens). Put latency is measured for snapcache
(RAM + disk with background writes, RAM + disk with synchronous writes, RAM only) beside
llama-cpp-python's LlamaRAMCache and LlamaDiskCache `__setitem__`. Memory growth is the resident set
size of a fresh process that keeps putting snapshots into a store whose RAM budget they overflow many
times.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import numpy as np
from _common import Table, fmt_bytes, fmt_seconds, make_parser, percentile, report, rss_bytes

STATE_BYTES = 12_160_000  # about what Gemma-3-270M holds for 1,211 tokens
PROMPT_TOKENS = 1_211
VOCAB = 262_144
FINGERPRINT = "hot-path-benchmark"


def _base_state() -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.standard_normal(STATE_BYTES // 2, dtype=np.float32).astype(np.float16).view(np.uint8)


class _States:
    """Distinct snapshots on demand: `make(i)` returns (key, tokens, state) with a fresh state buffer.

    The caller holds the only reference to each state, so dropping it frees it: the memory rows see
    what the cache keeps, not what the harness keeps.
    """

    def __init__(self, seed: int) -> None:
        self._base = _base_state()
        self._rng = np.random.default_rng(seed)

    def make(self, i: int) -> tuple[Any, np.ndarray, np.ndarray]:
        from snapcache import SnapshotKey

        tokens = self._rng.integers(0, VOCAB, size=PROMPT_TOKENS, dtype=np.int32)
        state = self._base.copy()
        state[:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
        return SnapshotKey.for_tokens(FINGERPRINT, "hot-path", tokens), tokens, state


# -- put latency -------------------------------------------------------------------------------------


def _time_puts(put: Callable[[Any, np.ndarray, np.ndarray], object], count: int, seed: int) -> list[float]:
    samples = []
    states = _States(seed)
    for i in range(count):
        key, tokens, state = states.make(i)
        t0 = time.perf_counter()
        put(key, tokens, state)
        samples.append(time.perf_counter() - t0)
        del state
    return samples


def _put_latency(count: int, tmp: Path) -> tuple[Table, list[dict[str, Any]]]:
    from llama_cpp.llama import LlamaState
    from llama_cpp.llama_cache import LlamaDiskCache, LlamaRAMCache

    from snapcache import SnapshotStore

    budget = (count + 4) * (STATE_BYTES + (1 << 20))  # everything fits: no eviction in this part
    table = Table(
        f"Put latency seen by the caller ({count} puts of a {fmt_bytes(STATE_BYTES)} state, "
        f"{PROMPT_TOKENS:,} tokens)",
        ["cache", "mean", "p50", "p95", "max", "then flush/close"],
    )
    rows: list[dict[str, Any]] = []

    def record(label: str, samples: list[float], after_s: float | None) -> None:
        table.add(
            label,
            fmt_seconds(sum(samples) / len(samples)),
            fmt_seconds(percentile(samples, 50)),
            fmt_seconds(percentile(samples, 95)),
            fmt_seconds(max(samples)),
            fmt_seconds(after_s),
        )
        rows.append({"cache": label, "samples_s": samples, "after_s": after_s})

    variants: list[tuple[str, dict[str, Any]]] = [
        ("snapcache, RAM + disk (background writes)", {"background_writes": True}),
        ("snapcache, RAM + disk (synchronous writes)", {"background_writes": False}),
    ]
    for seed, (label, options) in enumerate(variants):
        directory = tmp / f"store-{seed}"
        store = SnapshotStore(directory, ram_bytes=budget, disk_bytes=budget * 2, **options)
        samples = _time_puts(lambda k, t, s, st=store: st.put(k, t, s), count, seed)
        t0 = time.perf_counter()
        store.close()
        record(label, samples, time.perf_counter() - t0)
        shutil.rmtree(directory, ignore_errors=True)

    store = SnapshotStore(None, ram_bytes=budget)
    samples = _time_puts(lambda k, t, s: store.put(k, t, s), count, 10)
    store.close()
    record("snapcache, RAM only", samples, None)

    def as_llama_state(tokens: np.ndarray, state: np.ndarray) -> LlamaState:
        # What Llama.save_state builds, less its logits rows (see the note).
        return LlamaState(
            input_ids=tokens.astype(np.intc),
            scores=np.zeros((0, 0), dtype=np.single),
            n_tokens=len(tokens),
            llama_state=state.tobytes(),
            llama_state_size=state.nbytes,
            seed=0,
        )

    ram_cache = LlamaRAMCache(capacity_bytes=budget)
    samples = _time_puts(lambda k, t, s: ram_cache.__setitem__(t.tolist(), as_llama_state(t, s)), count, 11)
    record("LlamaRAMCache", samples, None)
    ram_cache.cache_state.clear()

    disk_cache = LlamaDiskCache(cache_dir=str(tmp / "llama-disk-cache"), capacity_bytes=budget * 2)
    with contextlib.redirect_stderr(io.StringIO()):  # it prints three lines on every write
        samples = _time_puts(
            lambda k, t, s: disk_cache.__setitem__(t.tolist(), as_llama_state(t, s)), count, 12
        )
    t0 = time.perf_counter()
    disk_cache.cache.close()
    record("LlamaDiskCache", samples, time.perf_counter() - t0)

    table.notes.append(
        "snapcache's put copies the state; with the disk tier on it queues the compressed write to a "
        "background thread (flush/close waits for it)."
    )
    table.notes.append(
        "LlamaRAMCache/LlamaDiskCache times include building the LlamaState (one copy of the state). "
        "Llama.save_state also stores the logits buffer (n_batch x n_vocab floats: 512 MiB with "
        "Gemma's defaults), left out here."
    )
    return table, rows


# -- memory against the RAM budget (each case in a fresh process) ------------------------------------


def _rss_worker(args: argparse.Namespace) -> None:
    from llama_cpp.llama import LlamaState
    from llama_cpp.llama_cache import LlamaRAMCache

    from snapcache import SnapshotStore

    budget = args.ram_bytes
    states = _States(3)
    states.make(0)  # numpy and the generator warmed up before the baseline
    cache: Any
    if args.case == "llamaramcache":
        cache = LlamaRAMCache(capacity_bytes=budget)
    elif args.case == "ram":
        cache = SnapshotStore(None, ram_bytes=budget)
    else:
        cache = SnapshotStore(Path(args.workdir) / "store", ram_bytes=budget, disk_bytes=args.disk_bytes)
    gc.collect()
    baseline = rss_bytes()
    peak = 0
    samples = []
    for i in range(args.count):
        key, tokens, state = states.make(i)
        if args.case == "llamaramcache":
            cache[tokens.tolist()] = LlamaState(
                input_ids=tokens.astype(np.intc),
                scores=np.zeros((0, 0), dtype=np.single),
                n_tokens=len(tokens),
                llama_state=state.tobytes(),
                llama_state_size=state.nbytes,
                seed=0,
            )
        else:
            cache.put(key, tokens, state)
        del state
        growth = rss_bytes() - baseline
        peak = max(peak, growth)
        samples.append(growth)
    t0 = time.perf_counter()
    if args.case == "disk":
        cache.flush()
    flush_s = time.perf_counter() - t0
    settled = rss_bytes() - baseline
    stats: dict[str, Any] = {}
    if args.case != "llamaramcache":
        s = cache.stats()
        stats = {"ram_used_bytes": s.ram_used_bytes, "ram_entries": s.ram_entries,
                 "disk_entries": s.disk_entries, "evictions": s.evictions, "spills": s.spills}
        cache.close()
    result = {"case": args.case, "budget": budget, "count": args.count, "peak_growth": peak,
              "settled_growth": settled, "flush_s": flush_s, "samples": samples, "stats": stats}
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")


def _rss_case(case: str, count: int, budget: int, tmp: Path) -> dict[str, Any]:
    workdir = tmp / f"rss-{case}"
    workdir.mkdir()
    out = workdir / "result.json"
    command = [
        sys.executable, str(Path(__file__).resolve()), "--rss-worker", case, "--count", str(count),
        "--ram-bytes", str(budget), "--disk-bytes", str(count * STATE_BYTES * 2),
        "--workdir", str(workdir), "--out", str(out),
    ]
    # A fixed mmap threshold makes glibc return every freed state buffer to the system at once, so
    # RSS shows what is alive rather than what the allocator keeps for reuse.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr[-4000:])
        raise SystemExit(f"memory case {case} failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def _memory(count: int, budget: int, tmp: Path) -> tuple[Table, list[dict[str, Any]]]:
    table = Table(
        f"Process memory (RSS) growth while putting {count} snapshots of {fmt_bytes(STATE_BYTES)} "
        f"({fmt_bytes(count * STATE_BYTES)} in all) under a {fmt_bytes(budget)} RAM budget",
        ["cache", "peak growth", "growth after flush", "peak / budget", "target"],
    )
    labels = {
        "disk": "snapcache, RAM + disk",
        "ram": "snapcache, RAM only",
        "llamaramcache": "LlamaRAMCache (capacity_bytes = budget)",
    }
    rows = []
    for case in ("disk", "ram", "llamaramcache"):
        result = _rss_case(case, count, budget, tmp)
        rows.append(result)
        table.add(
            labels[case],
            fmt_bytes(result["peak_growth"]),
            fmt_bytes(result["settled_growth"]),
            f"{100 * result['peak_growth'] / budget:.0f}%",
            "≤ 110%" if case != "llamaramcache" else "-",
        )
    table.notes.append("RSS sampled after every put, in a fresh process per row; growth is from just before "
                       "the first put; glibc's mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_), so "
                       "freed buffers leave RSS at once.")
    return table, rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--rss-worker", choices=["disk", "ram", "llamaramcache"], help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ram-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--disk-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_worker:
        args.case = args.rss_worker
        _rss_worker(args)
        return 0

    put_count = 6 if args.quick else 40
    rss_count = 12 if args.quick else 120
    budget = (48 if args.quick else 256) << 20
    with tempfile.TemporaryDirectory(prefix="snapcache-hot-") as tmp:
        latency, latency_rows = _put_latency(put_count, Path(tmp))
        memory, memory_rows = _memory(rss_count, budget, Path(tmp))
    report("hot_path", [latency, memory], args.json, quick=args.quick,
           extra={"put_latency": latency_rows, "memory": memory_rows, "state_bytes": STATE_BYTES})
    return 0


if __name__ == "__main__":
    _ = _common.ROOT
    sys.exit(main())
