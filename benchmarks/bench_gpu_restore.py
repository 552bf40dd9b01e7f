"""Restore against prefill where llama.cpp runs on a GPU: does a restored state still beat reading the prompt?

    python benchmarks/bench_gpu_restore.py [--quick] [--shapes 1b 8b] [--sizes 1024 4096 16384 32768]
        [--modes auto exact inexact] [--runs 1] [--gpu-layers -1] [--no-flash-attn] [--kv-type f16]

`benchmarks/gpu/run.sh` runs the whole GPU table in one call on a GPU machine without network
(after `benchmarks/gpu/prepare.sh` where the registry is reachable).

Llamas written with `gguf` (random f16 weights, a byte vocabulary, every layer's matrices alike so
that an 8B file is written in seconds) of a 1B shape (16 layers, 2048 wide, 8 KV heads of 128,
8192-wide feed-forward layers: 64 KiB of KV a token) and an 8B shape (32 layers, 4096 wide, 8 KV
heads of 128, 14336-wide feed-forward layers: 128 KiB a token); `--quick` uses the 2-layer tiny
model on the CPU. One `Llama` per shape, on llama-server's batch sizes (2048 / 512) and, unless
`--no-flash-attn`, with flash attention on (llama-server's `auto` turns it on for CUDA): the prefill a
restore has to beat is the fastest a user gets. Each `Llama` first reads and drops 600 tokens, so
that neither side pays for the kernels a context sets up on its first decodes.

For each prompt size: time to the first token reading the whole prompt (cold); after restoring the
prompt's state with `CachedLlama` from a RAM store and from a store on disk (reopened with no RAM,
so the disk is read); the restore's own share (`RestoreInfo.restore_seconds`) and the state's bytes
a second it moved; llama.cpp's own copy of the state out of and back into the context
(`llama_state_seq_get_data` / `set_data` with a reused host buffer: the floor of any restore), from
plain memory and from the device's pinned host memory (`snapcache.llama.state.host_memory`, what snapcache
copies through); what saving the prompt's state costs the request (capture and put, the store's
copy deferred as in a completion) beside llama.cpp's copy into pinned memory; and whether 32 greedy
tokens after the restore equal a cold run's (else the first that differs). `auto` is the default
exactness (exact where this build keeps a split prompt bit for bit, inexact where it cannot: its
choice is in the notes); `exact` restores only where a split point keeps results bit for bit
(measured per model and build, see `snapcache.llama.exactness.alignment`); `inexact` caches with
`exact=False`. The note under each table gives the break-even prompt size: where restoring from RAM
starts to beat reading.
"""

from __future__ import annotations

import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import Table, fmt_ratio, fmt_seconds, make_parser, new_llama, prompt_paragraphs, report

QUESTION = " Question: what comes next? Answer:"
WARM_UP_TOKENS = 600
SHAPES: dict[str, dict[str, int]] = {
    "1b": {"n_layers": 16, "n_embd": 2048, "n_head": 16, "n_head_kv": 8, "head_dim": 128, "n_ff": 8192},
    "8b": {"n_layers": 32, "n_embd": 4096, "n_head": 32, "n_head_kv": 8, "head_dim": 128, "n_ff": 14336},
}
GREEDY_TOKENS = 32
COLUMNS = [
    "prompt tokens",
    "restored tokens",
    "state",
    "cold",
    "restored (RAM)",
    "restored (disk)",
    "of which restore (RAM)",
    "restore (GB/s)",
    "llama.cpp out / in, plain (GB/s)",
    "llama.cpp out / in, pinned (GB/s)",
    "capture + put",
    "capture / llama.cpp's",
    "cold/RAM",
    "cold/disk",
    "= cold (32 tokens)",
]


@dataclass(frozen=True)
class Row:
    size: int
    restored: int
    state_bytes: int
    cold: float
    ram: float
    disk: float
    share: float
    copy_out: float
    copy_in: float
    pinned_out: float | None
    pinned_in: float | None
    capture: float
    differs_at: int | None  # the first of GREEDY_TOKENS greedy tokens that differs from cold's


def _prompt(llm: Any, size: int) -> str:
    """About `size` tokens of plain prose."""
    text = " ".join(prompt_paragraphs())
    while len(text.encode()) < 2 * size:
        text += " " + text
    tokens = llm.tokenize(text.encode(), add_bos=False)[:size]
    return str(llm.detokenize(tokens).decode("utf-8", "ignore"))


def _first_token(target: Any, prompt: str) -> float:
    started = time.perf_counter()
    for _ in target.create_completion(prompt, max_tokens=1, temperature=0.0, stream=True):
        break
    return time.perf_counter() - started


def _greedy_tokens(target: Any, llm: Any, prompt: str) -> list[int]:
    """The first GREEDY_TOKENS greedy tokens of a completion of `prompt` through `target` (the Llama
    itself, or a cache over it), as the Llama read them on after the prompt."""
    target.create_completion(prompt, max_tokens=GREEDY_TOKENS + 1, temperature=0.0)
    start = len(llm.tokenize(prompt.encode()))
    return [int(token) for token in llm.input_ids[start : int(llm.n_tokens)]][:GREEDY_TOKENS]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Where two runs of tokens first differ (one ending early counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _emptied(llm: Any) -> Any:
    """`llm` with nothing evaluated: the next read starts from token 0 (and clears the sequence)."""
    llm.reset()
    return llm


def _llama_copies(llm: Any, prompt: str, pinned: bool = False) -> tuple[int, float, float] | None:
    """The state's size and llama.cpp's own copy of it out of the context and back in, into and from
    a host buffer written once before (so that no page faults are timed), or with `pinned` the
    device's pinned host memory as snapcache allocates it (None where there is none)."""
    import llama_cpp

    from snapcache.llama.state.host_memory import PinnedMemory, device_host_buffer_type

    _emptied(llm).eval(llm.tokenize(prompt.encode()))
    size = int(llama_cpp.llama_state_seq_get_size_ext(llm.ctx, 0, 0))
    if pinned:
        buffer_type = device_host_buffer_type()
        buffer = None if buffer_type is None else PinnedMemory(buffer_type, size).allocate(size)
        if buffer is None:
            return None
    else:
        buffer = np.ones(size, dtype=np.uint8)
    pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
    started = time.perf_counter()
    written = int(llama_cpp.llama_state_seq_get_data_ext(llm.ctx, pointer, size, 0, 0))
    copy_out = time.perf_counter() - started
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), 0, -1, -1)
    started = time.perf_counter()
    read = int(llama_cpp.llama_state_seq_set_data_ext(llm.ctx, pointer, written, 0, 0))
    copy_in = time.perf_counter() - started
    if read <= 0:
        raise SystemExit("bench_gpu_restore: llama.cpp refused its own state")
    _emptied(llm)
    return written, copy_out, copy_in


def _capture_and_put(llm: Any, prompt: str, exact: Any) -> float:
    """What saving the state of `prompt`, just read, costs a request: snapcache's capture and the
    put it defers (the store's own copy runs after, off the request's path, as in a completion)."""
    from snapcache import SnapshotStore
    from snapcache.llama.hook.cached import CachedLlama
    from snapcache.llama.hook.prefix_loader import PrefixLoader
    from snapcache.llama.state.blocks import KIND_PROMPT_END
    from snapcache.llama.stored.checkpoints import RestorePoint
    from snapcache.llama.stored.prefix_cache import PrefixCache

    tokens = llm.tokenize(prompt.encode())
    _emptied(llm).eval(tokens)
    with SnapshotStore(None, ram_bytes=1 << 40) as store:
        fingerprint = CachedLlama(llm, store, save=False, exact=exact).fingerprint
        loader = PrefixLoader(llm, PrefixCache(llm, store, fingerprint))
        point = RestorePoint(len(tokens), 0, KIND_PROMPT_END)
        loader.save("default", [point], blocks_upto=len(tokens))  # the buffers made once
        store.flush()
        started = time.perf_counter()
        loader.save("bench", [point], blocks_upto=len(tokens))
        seconds = time.perf_counter() - started
        store.flush()
    _emptied(llm)
    return seconds


def _measure(llm: Any, workdir: Path, size: int, runs: int, exact: Any) -> Row:
    from snapcache import CachedLlama, SnapshotStore

    system = _prompt(llm, size)
    prompt = system + QUESTION
    prompt_tokens = len(llm.tokenize(prompt.encode()))
    cold_answer = _greedy_tokens(_emptied(llm), llm, prompt)
    plain = _llama_copies(llm, system)
    assert plain is not None
    state_bytes, copy_out, copy_in = plain
    pinned = _llama_copies(llm, system, pinned=True)
    pinned_out, pinned_in = (None, None) if pinned is None else pinned[1:]
    capture = _capture_and_put(llm, system, exact)
    colds, rams, disks, shares = [], [], [], []
    restored = 0
    differs_at: int | None = None
    folder = workdir / f"cache-{size}-{exact}"
    budget = 4 * state_bytes + (1 << 30)
    with SnapshotStore(folder, ram_bytes=0) as disk_store, SnapshotStore(None, ram_bytes=budget) as ram_store:
        CachedLlama(_emptied(llm), disk_store, save=False, exact=exact).warm(system, raw=True)
        CachedLlama(_emptied(llm), ram_store, save=False, exact=exact).warm(system, raw=True)
        disk_store.flush()
        for _ in range(runs):
            colds.append(_first_token(_emptied(llm), prompt))
            cached = CachedLlama(_emptied(llm), ram_store, save=False, exact=exact)
            rams.append(_first_token(cached, prompt))
            restore = cached.last_restore
            restored = 0 if restore is None else restore.restored_tokens
            shares.append(0.0 if restore is None else restore.restore_seconds)
            _emptied(llm)
            with SnapshotStore(folder, ram_bytes=0) as reopened:
                cached = CachedLlama(llm, reopened, save=False, exact=exact)
                disks.append(_first_token(cached, prompt))
                _emptied(llm)  # restored again, from the disk
                differs_at = _first_difference(_greedy_tokens(cached, llm, prompt), cold_answer)
    shutil.rmtree(folder, ignore_errors=True)
    median = statistics.median
    return Row(
        prompt_tokens,
        restored,
        state_bytes,
        median(colds),
        median(rams),
        median(disks),
        median(shares),
        copy_out,
        copy_in,
        pinned_out,
        pinned_in,
        capture,
        differs_at,
    )


def _exactness(llm: Any, mode: str) -> str:
    """What a cache on `llm` in `mode` does, and why (`ExactnessChoice.describe`)."""
    from snapcache import CachedLlama, SnapshotStore

    exact = {"auto": "auto", "exact": True, "inexact": False}[mode]
    with SnapshotStore(None, ram_bytes=1 << 20) as store:
        return CachedLlama(_emptied(llm), store, save=False, exact=exact).exactness.describe()


def _break_even(rows: list[Row]) -> str:
    """Where restoring from RAM starts to beat reading, from the rows (and a line through them)."""
    restored = [row for row in rows if row.restored > 0]
    if not restored:
        return "nothing was restored: no break-even"
    winning = [row.size for row in restored if row.ram < row.cold]
    if len(restored) >= 2:
        sizes = np.array([row.size for row in restored], dtype=np.float64)
        cold_fit = np.polyfit(sizes, [row.cold for row in restored], 1)
        ram_fit = np.polyfit(sizes, [row.ram for row in restored], 1)
        prefill_rate = 1.0 / cold_fit[0] if cold_fit[0] > 0 else float("inf")
        restore_rate = 1.0 / ram_fit[0] if ram_fit[0] > 0 else float("inf")
        rates = (
            f"prefill reads {prefill_rate:,.0f} tokens/s, "
            f"a restore from RAM moves {restore_rate:,.0f} tokens/s"
        )
        slope = cold_fit[0] - ram_fit[0]
        if slope <= 0:
            return f"restoring never catches up ({rates})"
        crossing = (ram_fit[1] - cold_fit[1]) / slope
        where = "every size measured" if crossing <= 0 else f"about {crossing:,.0f} tokens"
        return (
            f"restore from RAM beats prefill from {where} ({rates}); measured wins at {winning or 'no size'}"
        )
    return f"restore from RAM beats prefill at {winning or 'no size'}"


def _rate(n_bytes: int, seconds: float | None) -> str:
    return "-" if not seconds else f"{n_bytes / seconds / 1e9:.1f}"


def _gpu_name() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "no nvidia-smi"
    return done.stdout.strip()


def _model(workdir: Path, shape: str) -> tuple[Path, str]:
    from tiny_model import write_geometry_model, write_tiny_llama

    if shape == "tiny":
        return write_tiny_llama(workdir / "tiny.gguf", seed=0), "tiny llama (2 layers, 64 wide)"
    dims = SHAPES[shape]
    path = write_geometry_model(workdir / f"{shape}.gguf", layers_alike=True, **dims)
    kv = 2 * dims["n_layers"] * dims["n_head_kv"] * dims["head_dim"] * 2 // 1024
    return path, (
        f"random llama of a {shape.upper()} shape ({dims['n_layers']} layers, {dims['n_embd']} wide, "
        f"f16, {kv} KiB of KV a token)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--gpu-layers", type=int, default=-1, help="n_gpu_layers (-1: all; 0: the CPU)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["1b", "8b"])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 32768], help="prompt tokens"
    )
    parser.add_argument("--modes", nargs="+", choices=["auto", "exact", "inexact"], default=["auto", "exact"])
    parser.add_argument("--runs", type=int, default=1, help="runs per figure (median)")
    parser.add_argument("--no-flash-attn", action="store_true", help="leave flash attention off")
    parser.add_argument(
        "--kv-type", choices=["f16", "q8_0"], default="f16", help="the K/V cache's type (q8_0: quantized)"
    )
    args = parser.parse_args(argv)
    import llama_cpp

    from snapcache.errors import InvalidArgument

    quick = args.quick
    shapes = ["tiny"] if quick else args.shapes
    sizes = [256] if quick else args.sizes
    gpu_layers = 0 if quick else args.gpu_layers
    if gpu_layers != 0 and not llama_cpp.llama_supports_gpu_offload():
        # A CPU build would read an 8B model's prompts on the CPU: hours, and not what this measures.
        print("bench_gpu_restore: no GPU backend in this llama.cpp; nothing measured (try --quick)")
        return 0
    flash_attn = not args.no_flash_attn and gpu_layers != 0
    tables = []
    with tempfile.TemporaryDirectory(prefix="gpu-restore-") as scratch:
        workdir = Path(scratch)
        for shape in shapes:
            started = time.perf_counter()
            model, name = _model(workdir, shape)
            written = time.perf_counter() - started
            n_ctx = 2 * max(sizes) + 512  # the byte vocabulary reads some characters as several tokens
            kv = (
                {}
                if args.kv_type == "f16"
                else {"type_k": llama_cpp.GGML_TYPE_Q8_0, "type_v": llama_cpp.GGML_TYPE_Q8_0}
            )
            llm = new_llama(
                model, n_ctx, n_gpu_layers=gpu_layers, n_batch=2048, n_ubatch=512, flash_attn=flash_attn, **kv
            )
            llm.eval(llm.tokenize(_prompt(llm, WARM_UP_TOKENS).encode()))
            refused: list[str] = []
            for mode in args.modes:
                rows = []
                try:
                    for size in sizes:
                        exact = {"auto": "auto", "exact": True, "inexact": False}[mode]
                        rows.append(row := _measure(llm, workdir, size, args.runs, exact))
                        # A line per row as it comes: a run cut short still shows what it measured.
                        print(f"{shape} {mode} {size}: {row}", file=sys.stderr, flush=True)
                except InvalidArgument as exc:
                    # snapcache refuses to cache this Llama in this mode: a finding, not a failure.
                    refused.append(f"{mode} mode caches nothing on this Llama ({exc})")
                    print(f"{shape} {mode}: {refused[-1]}", file=sys.stderr, flush=True)
                    continue
                backend = (
                    "CPU"
                    if gpu_layers == 0
                    else f"GPU, all layers, flash attention {'on' if flash_attn else 'off'}"
                ) + ("" if args.kv_type == "f16" else f", {args.kv_type} K/V cache")
                table = Table(
                    f"{name}: time to first token, cold against restored ({backend}; {mode})", COLUMNS
                )
                for row in rows:
                    table.add(
                        f"{row.size:,}",
                        f"{row.restored:,}",
                        f"{row.state_bytes / 2**20:,.0f} MiB",
                        fmt_seconds(row.cold),
                        fmt_seconds(row.ram),
                        fmt_seconds(row.disk),
                        fmt_seconds(row.share),
                        _rate(row.state_bytes, row.share if row.restored else None),
                        f"{_rate(row.state_bytes, row.copy_out)} / {_rate(row.state_bytes, row.copy_in)}",
                        f"{_rate(row.state_bytes, row.pinned_out)} / {_rate(row.state_bytes, row.pinned_in)}",
                        fmt_seconds(row.capture),
                        fmt_ratio(row.capture, row.pinned_out or row.copy_out),
                        fmt_ratio(row.cold, row.ram),
                        fmt_ratio(row.cold, row.disk),
                        "yes" if row.differs_at is None else f"from token {row.differs_at}",
                    )
                table.notes.append(_break_even(rows))
                table.notes.append(f"exactness {mode}: {_exactness(llm, mode)}")
                if mode == "exact" and all(row.restored == 0 for row in rows):
                    table.notes.append(
                        "no split point keeps this build's results bit for bit: exact mode caches nothing"
                    )
                table.notes.append(f"model written in {written:.1f} s; median of {args.runs}")
                table.notes.extend(refused)
                tables.append(table)
            llm.close()
            model.unlink()
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    for table in tables:
        table.notes.append(f"GPU: {_gpu_name()}")
        table.notes.append(f"llama.cpp: {info}")
    report("bench_gpu_restore", tables, args.json, quick=quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
