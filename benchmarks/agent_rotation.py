"""Agent rotation: three agents with long system prompts take turns on one Llama, then the process restarts.

Each agent has its own system prompt of about 1,200 tokens (benchmarks/prompts/) and asks a new
short question on every turn (greedy, 8 tokens). Two rounds run in one process; then a new process
starts and each agent asks once more. Time to first token (TTFT) is the time until the first
streamed chunk. The same script, model and questions run with no cache, llama-cpp-python's
LlamaRAMCache and LlamaDiskCache (as `Llama.set_cache` uses them), and snapcache's CachedLlama over a
SnapshotStore, one after the other in the same run; every phase is a fresh subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common
from _common import BENCH_DIR, Table, choose_model, fmt_ratio, fmt_seconds, make_parser, new_llama, report

MODES = ["none", "ram", "disk", "snapcache"]
LABELS = {"none": "no cache", "ram": "LlamaRAMCache", "disk": "LlamaDiskCache", "snapcache": "snapcache"}
PROMPTS_DIR = BENCH_DIR / "prompts"
MAX_TOKENS = 8
QUICK_PROMPT_CHARS = 400  # the tiny model reads one token per byte

AGENTS: dict[str, tuple[str, list[str]]] = {
    "bookkeeper": (
        "bookkeeper.txt",
        [
            "How much did the Mill Street shop take in card payments last week?",
            "Which wholesale invoices are more than thirty days overdue?",
            "Will the bank balance stay above the safety level in August?",
        ],
    ),
    "trail": (
        "trail_planner.txt",
        [
            "Plan a grade B walk from Ashdale Head for twelve people next Saturday.",
            "Can we reach Great Carn and still catch the last bus down?",
            "Suggest a coast path day from Saltby for a group with two dogs.",
        ],
    ),
    "reviewer": (
        "code_reviewer.txt",
        [
            "Review this change: the CSV reader now parses timestamps with datetime.fromisoformat.",
            "Is it fine to catch Exception in the binary reader and return an empty Series?",
            "A contributor bumped the binary format version; what should the tests check?",
        ],
    ),
}
LIVE_ROUNDS = (1, 2)
RESTART_ROUND = 3


# -- worker: one process, one phase ------------------------------------------------------------------


def _system_prompt(agent: str, quick: bool) -> str:
    text = (PROMPTS_DIR / AGENTS[agent][0]).read_text(encoding="utf-8")
    return text[:QUICK_PROMPT_CHARS] if quick else text


class _Session:
    """One Llama with one way of caching; `chat` streams a chat completion for an agent."""

    def __init__(self, mode: str, model: Path, n_ctx: int, workdir: Path, quick: bool) -> None:
        self.mode = mode
        self.quick = quick
        self.llm = new_llama(model, n_ctx)
        self.store: Any = None
        self.cached: dict[str, Any] = {}
        self.setup_s = 0.0
        if mode == "ram":
            from llama_cpp.llama_cache import LlamaRAMCache

            self.llm.set_cache(LlamaRAMCache())
        elif mode == "disk":
            from llama_cpp.llama_cache import LlamaDiskCache

            self.llm.set_cache(LlamaDiskCache(cache_dir=str(workdir / "llama-disk-cache")))
        elif mode == "snapcache":
            from snapcache import CachedLlama, SnapshotStore

            started = time.perf_counter()
            self.store = SnapshotStore(workdir / "snapcache")
            for agent in AGENTS:
                self.cached[agent] = CachedLlama(self.llm, self.store, scope=agent)
            self.setup_s = time.perf_counter() - started

    def chat(self, agent: str, question: str) -> Iterator[Any]:
        messages = [
            {"role": "system", "content": _system_prompt(agent, self.quick)},
            {"role": "user", "content": question},
        ]
        target = self.cached.get(agent, self.llm)
        stream: Iterator[Any] = target.create_chat_completion(
            messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, stream=True
        )
        return stream

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.llm.close()


def _run_phase(args: argparse.Namespace) -> None:
    rounds = LIVE_ROUNDS if args.phase == "live" else (RESTART_ROUND,)
    started = time.perf_counter()
    session = _Session(args.mode, Path(args.model), args.n_ctx, Path(args.workdir), args.quick)
    load_s = time.perf_counter() - started
    requests: list[dict[str, Any]] = []
    for round_no in rounds:
        for agent, (_, questions) in AGENTS.items():
            question = questions[round_no - 1]
            t0 = time.perf_counter()
            ttft = None
            text = []
            for chunk in session.chat(agent, question):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(chunk["choices"][0]["delta"].get("content") or "")
            total = time.perf_counter() - t0
            requests.append(
                {"round": round_no, "agent": agent, "ttft_s": ttft, "turn_s": total, "text": "".join(text)}
            )
    t0 = time.perf_counter()
    session.close()
    close_s = time.perf_counter() - t0
    result = {"mode": args.mode, "phase": args.phase, "load_s": load_s, "close_s": close_s,
              "setup_s": session.setup_s, "requests": requests}
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")


# -- parent: every mode side by side -----------------------------------------------------------------


def _spawn_phase(
    mode: str, phase: str, model: Path, n_ctx: int, workdir: Path, quick: bool
) -> dict[str, Any]:
    out = workdir / f"{mode}-{phase}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--mode", mode, "--phase", phase,
        "--model", str(model), "--n-ctx", str(n_ctx), "--workdir", str(workdir), "--out", str(out),
    ]
    if quick:
        command.append("--quick")
    # LlamaDiskCache prints on every write: keep the workers' stderr out of the tables.
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr[-4000:])
        raise SystemExit(f"the {LABELS[mode]} {phase} phase failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES, help="which caches to run")
    worker = parser.add_argument_group("worker (internal)")
    worker.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    worker.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    worker.add_argument("--phase", choices=["live", "restart"], help=argparse.SUPPRESS)
    worker.add_argument("--model", help=argparse.SUPPRESS)
    worker.add_argument("--n-ctx", type=int, default=2048, help=argparse.SUPPRESS)
    worker.add_argument("--workdir", help=argparse.SUPPRESS)
    worker.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _run_phase(args)
        return 0

    results: dict[str, list[dict[str, Any]]] = {}
    phases: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as tmp:
        model = choose_model(args.quick, Path(tmp))
        n_ctx = 1024 if model.is_tiny else 2048
        for mode in args.modes:
            workdir = Path(tmp) / mode
            workdir.mkdir()
            requests = []
            for phase in ("live", "restart"):
                print(f"  {LABELS[mode]}: {phase} phase...", file=sys.stderr, flush=True)
                result = _spawn_phase(mode, phase, model.path, n_ctx, workdir, args.quick)
                phases[f"{mode}-{phase}"] = {k: v for k, v in result.items() if k != "requests"}
                requests.extend(result["requests"])
            results[mode] = requests

    modes = list(results)
    summary = Table(
        f"Agent rotation: mean time to first token ({model.name}, {_common.LLAMA_THREADS} threads, "
        f"3 agents, max_tokens={MAX_TOKENS})",
        ["cache", "round 1", "round 2", "after restart", "mean turn (to last token)"],
    )
    means: dict[str, dict[int, float]] = {}
    for mode in modes:
        by_round = {
            r: _mean([q["ttft_s"] for q in results[mode] if q["round"] == r]) for r in (1, 2, RESTART_ROUND)
        }
        means[mode] = by_round
        summary.add(
            LABELS[mode],
            fmt_seconds(by_round[1]),
            fmt_seconds(by_round[2]),
            fmt_seconds(by_round[RESTART_ROUND]),
            fmt_seconds(_mean([q["turn_s"] for q in results[mode]])),
        )

    detail = Table(
        "Agent rotation: time to first token per request",
        ["#", "round", "agent", *[LABELS[m] for m in modes]],
    )
    first = results[modes[0]]
    # Greedy answers compared with the first mode's (no cache, when it ran): a cache must not change them.
    matches = {
        m: sum(a["text"] == b["text"] for a, b in zip(first, results[m], strict=True)) for m in modes
    }
    for i, request in enumerate(first):
        round_label = "restart" if request["round"] == RESTART_ROUND else str(request["round"])
        ttfts = [fmt_seconds(results[m][i]["ttft_s"]) for m in modes]
        detail.add(i + 1, round_label, request["agent"], *ttfts)

    checks = Table(
        "Agent rotation: ratios (measured side by side in this run)", ["comparison", "ratio", "target"]
    )
    if "snapcache" in means:
        snap = means["snapcache"]
        if "ram" in means:
            checks.add(
                "round 2: LlamaRAMCache TTFT / snapcache TTFT", fmt_ratio(means["ram"][2], snap[2]), "≥ 10x"
            )
        if "disk" in means:
            checks.add(
                "round 2: LlamaDiskCache TTFT / snapcache TTFT", fmt_ratio(means["disk"][2], snap[2]), "-"
            )
        if "none" in means:
            checks.add("round 2: no cache TTFT / snapcache TTFT", fmt_ratio(means["none"][2], snap[2]), "-")
            checks.add(
                "after restart: no cache (cold) TTFT / snapcache TTFT",
                fmt_ratio(means["none"][RESTART_ROUND], snap[RESTART_ROUND]),
                "≥ 10x",
            )
        if "disk" in means:
            checks.add(
                "after restart: LlamaDiskCache TTFT / snapcache TTFT",
                fmt_ratio(means["disk"][RESTART_ROUND], snap[RESTART_ROUND]),
                "-",
            )
    checks.notes.append(
        f"greedy answers equal to {LABELS[modes[0]]}'s: "
        + ", ".join(f"{LABELS[m]} {matches[m]}/{len(first)}" for m in modes[1:])
    )
    for mode in modes:
        live = phases[f"{mode}-live"]
        checks.notes.append(
            f"{LABELS[mode]}: model load {fmt_seconds(live['load_s'])}, close after the live phase "
            f"{fmt_seconds(live['close_s'])}"
        )
    report(
        "agent_rotation",
        [summary, detail, checks],
        args.json,
        quick=args.quick,
        extra={"model": model.name, "n_ctx": n_ctx, "requests": results, "phases": phases,
               "outputs_match_first_mode": matches},
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(_common.LLAMA_THREADS))
    sys.exit(main())
