"""Capture and restore of one sequence's state versus a cold prefill of the same long system prompt.

Gemma-3-270M (or the tiny test model with --quick), 2 threads, the system prompt in
examples/system_prompt.txt. Measures: the state's size, capture time, restore time into a fresh
Llama, cold prefill time, time to first token both ways, and whether greedy output is the same.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
from _common import Table, choose_model, fmt_bytes, fmt_ratio, fmt_seconds, make_parser, new_llama, report

from snapcache.key import SnapshotKey
from snapcache.llama import capture_sequence, model_fingerprint, restore_sequence
from snapcache.llama.exactness import model_files
from snapcache.snapshot import Snapshot

SYSTEM_PROMPT = _common.ROOT / "examples" / "system_prompt.txt"
QUESTION = "\nUser: Which of my files changed since yesterday?\nAssistant:"
N_GENERATED = 16
TINY_PREFIX_TOKENS = 1_200


def _greedy(llm: Any, tokens: list[int], n: int) -> list[int]:
    out: list[int] = []
    for token in llm.generate(tokens, temp=0.0, top_k=1):
        out.append(int(token))
        if len(out) >= n or token == llm.token_eos():
            break
    return out


def _first_token_seconds(llm: Any, tokens: list[int]) -> float:
    started = time.perf_counter()
    _greedy(llm, tokens, 1)
    return time.perf_counter() - started


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="cold prefills to take the median of")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        tables, extra = _run(args, Path(workdir))
    report("bench_restore", tables, args.json, quick=args.quick, extra=extra)


def _run(args: Any, workdir: Path) -> tuple[list[Table], dict[str, Any]]:
    model = choose_model(args.quick, workdir)
    text = SYSTEM_PROMPT.read_text(encoding="utf-8")

    model_files._file_cache.clear()
    started = time.perf_counter()
    model_files.file_fingerprint(model.path)
    fp_first = time.perf_counter() - started
    started = time.perf_counter()
    model_files.file_fingerprint(model.path)
    fp_cached = time.perf_counter() - started

    probe = new_llama(model.path, n_ctx=512)
    prefix = probe.tokenize(text.encode())
    question = probe.tokenize(QUESTION.encode(), add_bos=False)
    probe.close()
    if model.is_tiny:
        prefix = prefix[:TINY_PREFIX_TOKENS]  # byte tokens: the whole text would exceed its context
    prompt = prefix + question
    n_ctx = len(prompt) + N_GENERATED + 64

    cold = new_llama(model.path, n_ctx=n_ctx)
    prefill_times = []
    for _ in range(max(1, args.repeat)):
        cold.reset()
        started = time.perf_counter()
        cold.eval(prefix)
        prefill_times.append(time.perf_counter() - started)
    prefill = statistics.median(prefill_times)

    capture_times = []
    for _ in range(5):
        started = time.perf_counter()
        captured = capture_sequence(cold)
        capture_times.append(time.perf_counter() - started)
    capture = statistics.median(capture_times)
    fp = model_fingerprint(cold)
    snapshot = Snapshot(SnapshotKey.for_tokens(fp, "bench", captured.tokens), captured.tokens, captured.state)

    cold.reset()
    cold_ttft = _first_token_seconds(cold, prompt)
    cold.reset()
    cold_tokens = _greedy(cold, prompt, N_GENERATED)
    cold.close()

    warm = new_llama(model.path, n_ctx=n_ctx)
    restore_times = []
    for _ in range(10):
        started = time.perf_counter()
        ok = restore_sequence(warm, snapshot, prompt)
        restore_times.append(time.perf_counter() - started)
        if not ok:
            raise SystemExit("restore_sequence refused its own snapshot")
    restore = statistics.median(restore_times)
    restore_sequence(warm, snapshot, prompt)
    started = time.perf_counter()
    restore_sequence(warm, snapshot, prompt)
    _greedy(warm, prompt, 1)
    warm_ttft = time.perf_counter() - started
    restore_sequence(warm, snapshot, prompt)
    warm_tokens = _greedy(warm, prompt, N_GENERATED)
    warm.close()

    size = len(captured.state)
    table = Table(
        f"{model.name}: {len(prefix):,}-token system prompt, {len(question)}-token question, 2 threads",
        ["what", "figure"],
    )
    table.add("seq state size", fmt_bytes(size))
    table.add("state bytes per token", fmt_bytes(size / len(prefix)))
    table.add("cold prefill (median)", fmt_seconds(prefill))
    table.add("capture_sequence (median)", fmt_seconds(capture))
    table.add("restore_sequence (median)", fmt_seconds(restore))
    table.add("prefill / restore", fmt_ratio(prefill, restore))
    table.add("time to first token, cold", fmt_seconds(cold_ttft))
    table.add("time to first token, restored", fmt_seconds(warm_ttft))
    table.add("first-token speed-up", fmt_ratio(cold_ttft, warm_ttft))
    table.add(f"greedy {N_GENERATED} tokens identical", "yes" if warm_tokens == cold_tokens else "NO")
    table.add("file fingerprint, first sight", fmt_seconds(fp_first))
    table.add("file fingerprint, cached", fmt_seconds(fp_cached))
    table.notes.append("restore: into a fresh Llama, then the question is the only prefill")
    extra = {
        "prompt_tokens": len(prefix),
        "state_bytes": size,
        "prefill_s": prefill,
        "capture_s": capture,
        "restore_s": restore,
        "ttft_cold_s": cold_ttft,
        "ttft_restored_s": warm_ttft,
        "identical": warm_tokens == cold_tokens,
        "fingerprint_first_s": fp_first,
        "fingerprint_cached_s": fp_cached,
    }
    return [table], extra


if __name__ == "__main__":
    main()
