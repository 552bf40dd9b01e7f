"""Restore against prefill where llama.cpp runs on a GPU: does a restored state still beat reading the prompt?

    python benchmarks/bench_gpu_restore.py [--quick] [--gpu-layers -1] [--sizes 1024 4096] [--runs 3]

A llama written with `gguf` (random f16 weights, a byte vocabulary) of a 1B model's shape: 16
layers, 2048 wide, 16 heads (8 for K/V, 128 each), 8192-wide feed-forward layers; `--quick` uses
the 2-layer tiny model. For each prompt size, on a new `Llama` each time: time to the first token
reading the whole prompt (cold), and after restoring its state with `CachedLlama` from a RAM-only
store and from a store on disk (a new store object, so the disk is read); the restore's own share
(`RestoreInfo.restore_seconds`); and whether 8 greedy tokens after the restore equal a cold run's.
llama.cpp copies a sequence's state to host memory on every backend, so on a GPU a restore is a
host-to-device copy of the KV cells. Each new `Llama` first reads and drops 600 tokens, so that
neither side pays for the kernels a context sets up on its first decodes. Medians of --runs.
`--inexact` caches with `exact=False`, for builds where no split point is exact (CUDA).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Table, fmt_ratio, fmt_seconds, make_parser, new_llama, prompt_paragraphs, report

QUESTION = " Question: what comes next? Answer:"
COLUMNS = [
    "prompt tokens",
    "restored tokens",
    "cold",
    "restored (RAM)",
    "restored (disk)",
    "of which restore",
    "cold/RAM",
]
COLUMNS.append("= cold")


def _model(workdir: Path, quick: bool) -> tuple[Path, str]:
    from tiny_model import write_geometry_model, write_tiny_llama

    if quick:
        return write_tiny_llama(workdir / "tiny.gguf", seed=0), "tiny llama (2 layers, 64 wide)"
    path = write_geometry_model(
        workdir / "one-b.gguf", n_layers=16, n_head_kv=8, head_dim=128, n_embd=2048, n_head=16, n_ff=8192
    )
    return path, "random llama of a 1B shape (16 layers, 2048 wide, f16)"


def _prompt(size: int) -> str:
    text = " ".join(prompt_paragraphs())
    while len(text.encode()) < size:
        text += " " + text
    return text.encode()[:size].decode("utf-8", "ignore")


def _first_token(target: Any, prompt: str) -> float:
    started = time.perf_counter()
    for _ in target.create_completion(prompt, max_tokens=1, temperature=0.0, stream=True):
        break
    return time.perf_counter() - started


def _warmed_up(llm: Any, prompt: str) -> Any:
    """`llm` after one read of 600 tokens, then emptied: a new context's first decodes set up
    kernels and buffers (CUDA graphs, cuBLAS), which neither a prefill nor a restore should be
    charged for."""
    llm.eval(llm.tokenize(prompt.encode())[:600])
    llm.reset()
    return llm


def _greedy(target: Any, prompt: str) -> str:
    return str(target.create_completion(prompt, max_tokens=8, temperature=0.0)["choices"][0]["text"])


def main(argv: list[str] | None = None) -> int:
    from snapcache import CachedLlama, SnapshotStore

    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--gpu-layers", type=int, default=-1, help="n_gpu_layers (-1: all; 0: the CPU)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096], help="system prompt tokens")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument(
        "--inexact", action="store_true", help="CachedLlama(exact=False): where no split is exact (CUDA)"
    )
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    exact = not args.inexact
    sizes = [256] if args.quick else args.sizes
    import llama_cpp

    if args.gpu_layers != 0 and not args.quick and not llama_cpp.llama_supports_gpu_offload():
        # A CPU build would read a 1B model's prompts on the CPU: minutes, and not what this measures.
        print("bench_gpu_restore: no GPU backend in this llama.cpp; nothing measured (try --gpu-layers 0)")
        return 0
    table_rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-restore-") as scratch:
        workdir = Path(scratch)
        model, name = _model(workdir, args.quick)
        n_ctx = 2 * max(sizes) + 512  # the byte vocabulary reads some characters as several tokens

        def fresh() -> Any:
            return _warmed_up(new_llama(model, n_ctx, n_gpu_layers=args.gpu_layers), _prompt(2048))

        for size in sizes:
            system = _prompt(size)
            prompt = system + QUESTION
            cold_llm = fresh()
            cold_answer = _greedy(cold_llm, prompt)
            cold_llm.close()
            colds, rams, disks, shares = [], [], [], []
            restored = 0
            equal = True
            with SnapshotStore(workdir / f"cache-{size}") as disk_store, SnapshotStore(None) as ram_store:
                writer = fresh()
                CachedLlama(writer, disk_store, save=False, exact=exact).warm(system, raw=True)
                CachedLlama(writer, ram_store, save=False, exact=exact).warm(system, raw=True)
                writer.close()
                disk_store.flush()
                for _ in range(runs):
                    llm = fresh()
                    colds.append(_first_token(llm, prompt))
                    llm.close()
                    llm = fresh()
                    cached = CachedLlama(llm, ram_store, save=False, exact=exact)
                    rams.append(_first_token(cached, prompt))
                    assert cached.last_restore is not None
                    shares.append(cached.last_restore.restore_seconds)
                    restored = cached.last_restore.restored_tokens
                    llm.close()
                    with SnapshotStore(workdir / f"cache-{size}", ram_bytes=0) as reopened:
                        llm = fresh()
                        cached = CachedLlama(llm, reopened, save=False, exact=exact)
                        disks.append(_first_token(cached, prompt))
                        llm.reset()
                        equal = equal and _greedy(cached, prompt) == cold_answer
                        llm.close()
            median = statistics.median
            if restored == 0:
                # A miss times a cold read twice; say so rather than print a ratio of 1.
                raise SystemExit(f"bench_gpu_restore: the warmed prefix of {size} tokens was not restored")
            table_rows.append(
                (size, restored, median(colds), median(rams), median(disks), median(shares), equal)
            )

    backend = "GPU, all layers" if args.gpu_layers != 0 else "CPU"
    if not exact:
        backend += "; exact=False"
    table = Table(
        f"{name}: time to first token, cold against restored ({backend}; median of {runs})",
        COLUMNS,
    )
    for size, restored, cold, ram, disk, share, equal in table_rows:
        table.add(
            f"{size:,}",
            f"{restored:,}",
            fmt_seconds(cold),
            fmt_seconds(ram),
            fmt_seconds(disk),
            fmt_seconds(share),
            fmt_ratio(cold, ram),
            "yes" if equal else "no",
        )
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    table.notes.append(f"llama.cpp: {info}")
    report("bench_gpu_restore", [table], args.json, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
