"""What `exact=False` buys and what it costs: tokens restored, and drift from a cold run.

Each case is a raw prompt P of an unaligned length, then a second prompt P + a question. The first
completion (through `CachedLlama`, exact or not) saves P's state; the Llama's context is then cleared,
so the second completion restores from the store and reads the rest. It is compared with a cold read
of the same second prompt by a plain Llama: the logits of the prompt's last token (largest absolute
difference; whether the top token is the same) and the greedy tokens that follow.

Settings: the default (exact) restores at the model's measured split alignment and leaves a tail of
32 or more tokens to read; `exact=False` restores all of P but its last token. With flash attention
over an F16 K/V cache no split is exact, so the exact cache restores nothing there at all.

    python benchmarks/bench_inexact.py            # Gemma-3-270M and the tiny llama, 4 cases each
    python benchmarks/bench_inexact.py --quick    # the tiny llama, 2 cases
"""

from __future__ import annotations

import ctypes
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _common import Table, choose_model, make_parser, new_llama, prompt_paragraphs, report, text_of_tokens

QUESTIONS = (
    "Question: what is the first thing to check?",
    "Question: summarise the rules above in one line.",
    "Question: which step is most often forgotten?",
    "Question: what would you do differently?",
)


@dataclass(frozen=True)
class Case:
    first: str
    second: str


@dataclass
class Outcome:
    restored: int
    prompt_tokens: int
    max_logit_diff: float
    same_top: bool
    greedy_equal: bool
    diverged_at: int | None  # the first generated token that differs from cold


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=4, help="prompts per model and setting (default 4)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens compared (default 32)")
    args = parser.parse_args()
    cases_per_model = 2 if args.quick else args.cases
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-inexact-") as tmp:
        workdir = Path(tmp)
        models = [choose_model(True, workdir)] if args.quick else [choose_model(False, workdir)]
        if not args.quick and not models[0].is_tiny:
            models.append(choose_model(True, workdir))
        table = Table(
            f"Restored vs cold, {cases_per_model} raw prompts per row, greedy {args.tokens} tokens",
            [
                "model",
                "llama settings",
                "cache",
                "restored (mean)",
                "read after restore",
                "top token = cold",
                "max |Δ logit|",
                "greedy = cold",
                "first divergence",
            ],
        )
        for model in models:
            for label, llama_kwargs in (("default", {}), ("flash attention, F16 KV", {"flash_attn": True})):
                for exact in (True, False):
                    outcomes = _run(model.path, llama_kwargs, exact, cases_per_model, args.tokens, workdir)
                    _add_row(table, model.name, label, exact, outcomes)
        table.notes.append(
            "restored: prompt tokens restored from the store (mean); "
            "read after restore: the rest, read by llama.cpp"
        )
        table.notes.append("max |Δ logit|: over the whole vocabulary at the second prompt's last token")
        report("bench_inexact", [table], args.json, quick=args.quick)


def _run(
    model_path: Path, llama_kwargs: dict[str, Any], exact: bool, n_cases: int, n_greedy: int, workdir: Path
) -> list[Outcome]:
    from snapcache import CachedLlama, SnapshotStore

    llm = new_llama(model_path, 1024, **llama_kwargs)
    cold_llm = new_llama(model_path, 1024, **llama_kwargs)
    paragraphs = prompt_paragraphs()
    outcomes = []
    store_dir = workdir / f"store-{model_path.stem}-{len(llama_kwargs)}-{exact}"
    with SnapshotStore(store_dir) as store:
        cached = CachedLlama(llm, store, scope="bench-inexact", exact=exact)
        for i in range(n_cases):
            case = _case(llm, paragraphs, i)
            llm.reset()
            cached.create_completion(case.first, max_tokens=1, temperature=0.0)
            llm.reset()  # the second prompt restores from the store, not from the live context
            cached.create_completion(case.second, max_tokens=1, temperature=0.0)
            info = cached.last_restore
            restored = 0 if info is None else info.cached_tokens
            warm_logits = _last_logits(llm)
            warm_tokens = _greedy(cached.create_completion, llm, case.second, n_greedy)
            cold_llm.reset()
            cold_llm.create_completion(case.second, max_tokens=1, temperature=0.0)
            cold_logits = _last_logits(cold_llm)
            cold_llm.reset()
            cold_tokens = _greedy(cold_llm.create_completion, cold_llm, case.second, n_greedy)
            n_prompt = len(llm.tokenize(case.second.encode("utf-8")))
            outcomes.append(_compare(restored, n_prompt, warm_logits, cold_logits, warm_tokens, cold_tokens))
    llm.close()
    cold_llm.close()
    return outcomes


def _case(llm: Any, paragraphs: list[str], i: int) -> Case:
    """A first prompt of 300 to 700 tokens, at lengths that are no multiple of 4, and a question after it."""
    n_tokens = 301 + 53 * i % 400
    first = text_of_tokens(llm, paragraphs, n_tokens, start=3 * i)
    return Case(first, first + "\n\n" + QUESTIONS[i % len(QUESTIONS)])


def _last_logits(llm: Any) -> npt.NDArray[np.float32]:
    """The logits of the last token the context read (a completion of one token reads no more)."""
    import llama_cpp

    n_vocab = int(llm.n_vocab())
    pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
    return np.array(row, dtype=np.float32)


def _greedy(complete: Any, llm: Any, prompt: str, n_tokens: int) -> tuple[list[int], str]:
    """The greedy tokens after `prompt` the context read (all but the last one sampled), and the text."""
    llm.reset()
    result = complete(prompt, max_tokens=n_tokens, temperature=0.0)
    n_prompt = len(llm.tokenize(prompt.encode("utf-8")))
    return [int(t) for t in llm.input_ids[n_prompt : llm.n_tokens]], str(result["choices"][0]["text"])


def _compare(
    restored: int,
    n_prompt: int,
    warm_logits: npt.NDArray[np.float32],
    cold_logits: npt.NDArray[np.float32],
    warm: tuple[list[int], str],
    cold: tuple[list[int], str],
) -> Outcome:
    (warm_tokens, warm_text), (cold_tokens, cold_text) = warm, cold
    diff = float(np.max(np.abs(warm_logits - cold_logits)))
    same_top = int(np.argmax(warm_logits)) == int(np.argmax(cold_logits))
    diverged = next(
        (i for i, (a, b) in enumerate(zip(warm_tokens, cold_tokens, strict=False)) if a != b), None
    )
    if diverged is None and len(warm_tokens) != len(cold_tokens):
        diverged = min(len(warm_tokens), len(cold_tokens))
    if diverged is None and warm_text != cold_text:
        diverged = len(warm_tokens)  # the last token, sampled but not read
    return Outcome(restored, n_prompt, diff, same_top, diverged is None, diverged)


def _add_row(table: Table, model: str, label: str, exact: bool, outcomes: list[Outcome]) -> None:
    n = len(outcomes)
    restored = statistics.mean(o.restored for o in outcomes)
    remaining = statistics.mean(o.prompt_tokens - o.restored for o in outcomes)
    divergences = [o.diverged_at for o in outcomes if o.diverged_at is not None]
    table.add(
        model.split(" (")[0],
        label,
        "exact" if exact else "exact=False",
        f"{restored:,.0f}",
        f"{remaining:,.0f}",
        f"{sum(o.same_top for o in outcomes)}/{n}",
        f"{max(o.max_logit_diff for o in outcomes):.3g}",
        f"{sum(o.greedy_equal for o in outcomes)}/{n}",
        "—" if not divergences else f"token {min(divergences)}",
    )


if __name__ == "__main__":
    main()
