"""Time to first token after a restart: a system prompt restored from disk in a new process.

    python benchmarks/bench_restart.py [--quick] [--sizes 1000 4000 9000] [--runs 3] [--profile] [--json PATH]

For system prompts of about 1K, 4K and 9K tokens (built from benchmarks/prompts/, Gemma-3-270M, 2
threads), one chat turn (greedy, max_tokens=8) is timed to its first streamed token three ways:

- cold: a plain Llama reads the system prompt and the question;
- hot: a Llama that holds the system prompt in its context already (read there by `warm`) answers
  the question: the floor a cache can reach; --runs such turns, each from the context as `warm`
  left it (saved once, loaded untimed before each turn), alternating with the restarted processes;
- restored: the system prompt was warmed into a disk store, and the store and Llama closed; a NEW
  process loads the model, opens the store and answers the question through CachedLlama; --runs
  such processes per size, the median shown with the range (a new process's first touches of
  memory vary a lot from one process to the next).

The restored answer is compared with the cold one. --quick uses the tiny test model and small sizes.
--profile runs one more restarted process per size under cProfile and prints where its restore went.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
from _common import (
    Table,
    choose_model,
    first_token_seconds,
    fmt_seconds,
    make_parser,
    new_llama,
    prompt_paragraphs,
    report,
    text_of_tokens,
)

QUESTION = "Which of the rules above matters most, and why?"
MAX_TOKENS = 8
FULL_SIZES = [1_000, 4_000, 9_000]
QUICK_SIZES = [128, 320]


def _messages(system: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]


def _chat(target: Any, system: str) -> tuple[float, str]:
    stream = target.create_chat_completion(
        messages=_messages(system), max_tokens=MAX_TOKENS, temperature=0.0, stream=True
    )
    return first_token_seconds(stream)


# -- worker: the new process --------------------------------------------------------------------------


def _restored_turn(args: argparse.Namespace) -> None:
    from snapcache import CachedLlama, SnapshotStore

    started = time.perf_counter()
    llm = new_llama(Path(args.model), args.n_ctx)
    loaded = time.perf_counter()
    # llama.cpp's first evaluation in a process is slower than the rest: pay it before timing, as the
    # parent did for cold and hot.
    first_call = time.perf_counter()
    llm.create_completion("Hello.", max_tokens=1)
    llm.reset()
    first_call = time.perf_counter() - first_call
    opened = time.perf_counter()
    store = SnapshotStore(Path(args.store))
    cached = CachedLlama(llm, store)
    opened = time.perf_counter() - opened
    system = Path(args.system).read_text(encoding="utf-8")
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    ttft, text = _chat(cached, system)
    if profile is not None:
        profile.disable()
    info = cached.last_restore
    store.close()
    llm.close()
    result = {
        "load_s": loaded - started,
        "first_call_s": first_call,
        "open_s": opened,
        "ttft_s": ttft,
        "text": text,
        "restored_tokens": 0 if info is None else info.restored_tokens,
        "prompt_tokens": 0 if info is None else info.prompt_tokens,
        "source": None if info is None else info.source,
        "restore_s": 0.0 if info is None else info.restore_seconds,
    }
    if profile is not None:
        result["profile"] = _phases(profile)
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")


# What a profiled restart reports: (label, module file suffix, function name), cumulative seconds.
PHASES = [
    ("restore, all of it (before llama.cpp reads the rest)", "snapcache/llama/hook/completion.py", "prepare"),
    ("  record lookup", "snapcache/store/snapshot_store.py", "lookup_with_tier"),
    ("  blocks read, verified, decompressed, placed", "snapcache/store/snapshot_store.py", "copy_blocks"),
    (
        "  blob finished (what the threads left of its own writes)",
        "snapcache/llama/state/assembly.py",
        "finish",
    ),
    ("  llama.cpp takes the state", "snapcache/llama/state/sequences.py", "restore_sequence"),
    ("  is the system part restored? (decode)", "snapcache/llama/templates/chat_prefix.py", "reached"),
    ("chat template probes", "snapcache/llama/templates/chat_prefix.py", "shared"),
    ("tokenizing (prompt, and any system part)", "llama_cpp/llama.py", "tokenize"),
    ("llama.cpp evaluating (the question, then 7 tokens)", "llama_cpp/llama.py", "eval"),
]


def _phases(profile: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds of each of PHASES in `profile`."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    found: dict[str, float] = {}
    for label, suffix, name in PHASES:
        total = 0.0
        for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in stats.items():
            if function == name and filename.replace("\\", "/").endswith(suffix):
                total += cumulative
        found[label] = total
    return found


def _spawn(
    model: Path, n_ctx: int, store: Path, system: Path, out: Path, *, profile: bool = False
) -> dict[str, Any]:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--model", str(model),
        "--n-ctx", str(n_ctx), "--store", str(store), "--system", str(system), "--out", str(out),
    ] + (["--profile"] if profile else [])  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr[-4000:])
        raise SystemExit(f"the restarted process failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


# -- parent -------------------------------------------------------------------------------------------


def measure(
    model_path: Path, sizes: list[int], workdir: Path, *, runs: int = 3, profile: bool = False
) -> list[dict[str, Any]]:
    from snapcache import CachedLlama, SnapshotStore

    n_ctx = max(sizes) + 512
    llm = new_llama(model_path, n_ctx)
    llm.create_completion("Hello.", max_tokens=1)  # llama.cpp's slow first evaluation, untimed
    paragraphs = prompt_paragraphs()
    rows = []
    try:
        for size in sizes:
            print(f"  {size} tokens...", file=sys.stderr, flush=True)
            system = text_of_tokens(llm, paragraphs, size)
            system_path = workdir / f"system-{size}.txt"
            system_path.write_text(system, encoding="utf-8")

            llm.reset()
            cold_s, cold_text = _chat(llm, system)

            directory = workdir / f"store-{size}"
            store = SnapshotStore(directory, ram_bytes=1 << 30, disk_bytes=4 << 30)
            llm.reset()
            warmed = CachedLlama(llm, store).warm(system)
            store.close()

            # The Llama holds what `warm` read: the system prompt, as every chat with it starts. Each
            # hot turn starts from that state again (llama.cpp's whole context, loaded untimed), and
            # alternates with a restarted process, so that both are medians taken side by side.
            hot_state = llm.save_state()
            hot_turns: list[tuple[float, str]] = []
            # Several restarted processes: a new process's first memory and first restore vary a lot.
            # Each opens its own copy of the warmed store: what one saves must not serve the next.
            results = []
            for i in range(runs):
                llm.load_state(hot_state)
                hot_turns.append(_chat(llm, system))
                copy = workdir / f"store-{size}-run-{i}"
                shutil.copytree(directory, copy)
                results.append(
                    _spawn(model_path, n_ctx, copy, system_path, workdir / f"restored-{size}-{i}.json")
                )
                shutil.rmtree(copy)
            del hot_state
            hot_times = sorted(seconds for seconds, _text in hot_turns)
            restarts = sorted(results, key=lambda result: float(result["ttft_s"]))
            restored = restarts[len(restarts) // 2]
            profiled = None
            if profile:
                profiled = _spawn(
                    model_path, n_ctx, directory, system_path, workdir / f"profiled-{size}.json", profile=True
                )
            rows.append(
                {
                    "system_tokens": warmed.token_count,
                    "prompt_tokens": restored["prompt_tokens"],
                    "cold_s": cold_s,
                    "hot_s": hot_times[len(hot_times) // 2],
                    "hot_range_s": [hot_times[0], hot_times[-1]],
                    "restored_s": restored["ttft_s"],
                    "restored_range_s": [restarts[0]["ttft_s"], restarts[-1]["ttft_s"]],
                    "warm_s": warmed.seconds,
                    "cold_text": cold_text,
                    "hot_texts": sorted({text for _seconds, text in hot_turns}),
                    "restored": restored,
                    "profiled": profiled,
                }
            )
    finally:
        llm.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="system prompt sizes in tokens")
    parser.add_argument("--runs", type=int, default=3, help="restarted processes per size (median shown)")
    worker = parser.add_argument_group("worker (internal)")
    worker.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    worker.add_argument("--model", help=argparse.SUPPRESS)
    worker.add_argument("--n-ctx", type=int, help=argparse.SUPPRESS)
    worker.add_argument("--store", help=argparse.SUPPRESS)
    worker.add_argument("--system", help=argparse.SUPPRESS)
    worker.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile", action="store_true", help="also profile one more restarted process per size"
    )
    args = parser.parse_args(argv)
    if args.worker:
        _restored_turn(args)
        return 0

    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as tmp:
        model = choose_model(args.quick, Path(tmp))
        rows = measure(model.path, sorted(sizes), Path(tmp), runs=max(1, args.runs), profile=args.profile)
    elapsed = time.perf_counter() - started

    table = Table(
        f"Time to first token after a restart ({model.name}, {_common.LLAMA_THREADS} threads, "
        f"max_tokens={MAX_TOKENS}, greedy)",
        ["system tokens", "prompt tokens", "cold", "hot", "hot range", "restored", "restored range",
         "of which restore", "restored/hot", "cold/restored", "restored == cold"],
    )  # fmt: skip
    for row in rows:
        restored = row["restored"]
        table.add(
            f"{row['system_tokens']:,}",
            f"{row['prompt_tokens']:,}",
            fmt_seconds(row["cold_s"]),
            fmt_seconds(row["hot_s"]),
            " - ".join(fmt_seconds(seconds) for seconds in row["hot_range_s"]),
            fmt_seconds(row["restored_s"]),
            " - ".join(fmt_seconds(seconds) for seconds in row["restored_range_s"]),
            fmt_seconds(restored["restore_s"]),
            f"{row['restored_s'] / row['hot_s']:.2f}x",
            f"{row['cold_s'] / row['restored_s']:.1f}x",
            "yes" if restored["text"] == row["cold_text"] else "NO",
        )
    table.notes.append(
        "system tokens: what every chat with that system prompt shares, as warmed (the restored prefix)"
    )
    table.notes.append(
        "hot: the Llama holds that prefix in its context (its context loaded again before each turn); "
        "restored: a new process, store opened from disk; each the median of "
        f"{max(1, args.runs)} turns, hot and restored alternating, and their range"
    )
    table.notes.append(
        "of which restore: the median process's time finding the prefix, reading and assembling it and "
        "handing it to llama.cpp (RestoreInfo.restore_seconds); the rest is tokenizing and llama.cpp "
        "reading the question, as hot does, but in a process that has not evaluated a long prompt yet"
    )
    table.notes.append("target of the block store: restored/hot <= 1.25")

    detail = Table(
        "The restarted process",
        ["system tokens", "warm (before)", "model load", "first call", "store open", "restored from",
         "restored tokens", "hot == cold"],
    )  # fmt: skip
    for row in rows:
        restored = row["restored"]
        detail.add(
            f"{row['system_tokens']:,}",
            fmt_seconds(row["warm_s"]),
            fmt_seconds(restored["load_s"]),
            fmt_seconds(restored["first_call_s"]),
            fmt_seconds(restored["open_s"]),
            restored["source"] or "-",
            f"{restored['restored_tokens']:,}",
            "yes" if row["hot_texts"] == [row["cold_text"]] else "no",
        )
    detail.notes.append(
        "first call: an untimed one-token completion before the store opens (llama.cpp's first "
        "evaluation in a process is slow); the parent made one too before cold and hot"
    )
    load_after = os.getloadavg()[0]
    detail.notes.append(
        f"whole run {fmt_seconds(elapsed)}; load average {load_before:.1f} before, {load_after:.1f} after "
        "(a shared machine)"
    )
    tables = [table, detail]
    if args.profile:
        phases = Table(
            "Where a profiled restarted process spends its turn (cProfile, cumulative seconds)",
            ["phase", *[f"{row['system_tokens']:,} tokens" for row in rows]],
        )
        for label, _suffix, _name in PHASES:
            phases.add(label, *[fmt_seconds(row["profiled"]["profile"][label]) for row in rows])
        phases.notes.append("cProfile slows Python code down; llama.cpp's own time is unchanged")
        phases.notes.append("blocks are decoded on two threads; the phase is the wait for both")
        tables.append(phases)
    report(
        "bench_restart",
        tables,
        args.json,
        quick=args.quick,
        extra={"model": model.name, "rows": rows},
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(_common.LLAMA_THREADS))
    sys.exit(main())
