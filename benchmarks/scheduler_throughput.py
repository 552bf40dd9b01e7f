"""Aggregate generated tokens per second with 4 requests at once: the scheduler's two modes vs one by one.

    python benchmarks/scheduler_throughput.py [--quick] [--requests 4] [--tokens 64] [--runs 3]
        [--prompt-tokens 200] [--json PATH]

Four requests (distinct prompts of about --prompt-tokens tokens, greedy, at most --tokens each, no
cache) are answered three ways on Gemma-3-270M with 2 threads:

- one by one: the Llama's own single-sequence path (`Llama.generate`, reset before each prompt),
  and a scheduler of one sequence (the requests queue and run one at a time);
- exact: `Scheduler(n_seq=4, mode="exact")`, every `llama_decode` one sequence's;
- batched: `Scheduler(n_seq=4, mode="batched")`, the next tokens of all generating sequences in one
  `llama_decode`.

Each way runs --runs times, the ways in turn (on a shared machine a busy moment then hits all of
them). Each row gives the median wall time from submitting all four to the last token and the
range, the tokens generated (greedy runs can end early on an end-of-generation token, so they are
counted), the aggregate
generated tokens per second over that wall time (prompt reads included), the slowest first token,
the `llama_decode` calls, and how many answers equal the one-by-one answers token for token.
--quick uses the tiny test model. OMP_WAIT_POLICY is PASSIVE unless set (see below).
"""

from __future__ import annotations

import os

# llama-cpp-python's CPU build runs llama.cpp on OpenMP, which keeps a team of threads per calling
# thread, spinning while idle: on 2 cores, decodes from one thread right after another's ran up to
# 50 times slower (measured here). The scheduler decodes on a thread of its own, the Llama on the
# caller's: with idle teams asleep, both run at full speed. Read when llama_cpp loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common
from _common import Table, choose_model, make_parser, new_llama, prompt_paragraphs, report, text_of_tokens

WAYS = ("one by one (Llama)", "one by one (scheduler, 1 sequence)", "scheduler, exact", "scheduler, batched")
QUESTIONS = (
    "List, step by step, everything a new team member should check on the first day.",
    "Explain in detail how to plan a week of work with several deadlines.",
    "Describe at length how to write a clear bug report, with examples.",
    "Give a long numbered list of habits that keep a code base healthy.",
    "Write a detailed checklist for reviewing a pull request.",
    "Explain thoroughly how to prepare for a technical interview.",
    "Describe in many steps how to organise a shared calendar for a team.",
    "Write a long guide to triaging an overflowing mailbox.",
)


def one_by_one(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]], float]:
    """The Llama's own path, on a thread of its own, as the scheduler's steps are."""
    results: list[tuple[float, list[list[int]], float]] = []
    thread = threading.Thread(target=lambda: results.append(_one_by_one(llm, prompts, max_tokens)))
    thread.start()
    thread.join()
    return results[0]


def _one_by_one(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]], float]:
    import llama_cpp

    started = time.perf_counter()
    answers: list[list[int]] = []
    slowest_first = 0.0
    for prompt in prompts:
        llm.reset()
        out: list[int] = []
        for token in llm.generate(prompt, temp=0.0):
            if not out:
                slowest_first = time.perf_counter() - started
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token) or len(out) >= max_tokens:
                break
            out.append(token)
        answers.append(out)
    return time.perf_counter() - started, answers, slowest_first


def scheduled(
    llm: Any, prompts: list[list[int]], max_tokens: int, mode: str, n_seq: int
) -> tuple[float, list[list[int]], float, int]:
    from snapcache.llama.batch import SamplingParams, Scheduler

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    with Scheduler(llm, None, n_seq=n_seq, mode=mode) as scheduler:  # type: ignore[arg-type]
        started = time.perf_counter()
        requests = [scheduler.submit(p, params) for p in prompts]
        answers = [r.result(600) for r in requests]
        wall = time.perf_counter() - started
        slowest_first = max(r.first_token_seconds or 0.0 for r in requests)
        return wall, answers, slowest_first, scheduler.decode_calls


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="requests at once (and sequences)")
    parser.add_argument("--tokens", type=int, default=64, help="max tokens per answer")
    parser.add_argument("--runs", type=int, default=3, help="runs of each way, in turn (median shown)")
    parser.add_argument("--prompt-tokens", type=int, default=200, help="about this many tokens per prompt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        model = choose_model(args.quick, Path(workdir))
        llm = new_llama(model.path, n_ctx=2048)
        paragraphs = prompt_paragraphs()
        prompts = [
            list(
                llm.tokenize(
                    (text_of_tokens(llm, paragraphs, args.prompt_tokens, start=3 * i) + "\n\n" + q).encode()
                )
            )
            for i, q in enumerate(QUESTIONS[: args.requests])
        ]
        table = Table(
            f"{args.requests} requests at once, {model.name}, {_common.LLAMA_THREADS} threads, "
            f"prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
            f"greedy, at most {args.tokens} tokens each, no cache",
            [
                "way",
                "wall (median)",
                "range",
                "generated",
                "tokens/s",
                "slowest first token",
                "llama_decode calls",
                "same as one by one",
            ],
        )
        one_by_one(llm, prompts[:1], 2)  # the first decode of a process pays for warming up
        runs: dict[str, list[tuple[float, list[list[int]], float, int]]] = {w: [] for w in WAYS}
        for _ in range(args.runs):  # the ways in turn, so that a busy moment hits them alike
            wall, answers, first = one_by_one(llm, prompts, args.tokens)
            runs[WAYS[0]].append((wall, answers, first, 0))
            for way, mode, n_seq in zip(
                WAYS[1:], ("exact", "exact", "batched"), (1, len(prompts), len(prompts)), strict=True
            ):
                runs[way].append(scheduled(llm, prompts, args.tokens, mode, n_seq))
        reference = runs[WAYS[0]][0][1]
        for way in WAYS:
            results = sorted(runs[way], key=lambda r: r[0])
            wall, answers, first, calls = results[len(results) // 2]
            generated = sum(map(len, answers))
            same = sum(a == r for a, r in zip(answers, reference, strict=True))
            table.add(
                way,
                f"{wall:.2f} s",
                f"{results[0][0]:.2f}-{results[-1][0]:.2f} s",
                generated,
                f"{generated / wall:.1f}",
                f"{first:.2f} s",
                calls or "-",
                "-" if way == WAYS[0] else f"{same} of {len(prompts)}",
            )
        llm.close()
    report("scheduler_throughput", [table], args.json, quick=args.quick)


if __name__ == "__main__":
    main()
