"""The K/V cache types `--kv-cache` offers, side by side: prompt reads, generation, state size, exactness.

    python benchmarks/kv_cache_types.py [--quick] [--runs 3] [--json PATH]

For each of `load_llama(kv_cache=...)`'s choices (f16 without flash attention; q8_0 and q4_0 with
it) on Gemma-3-270M with 2 threads (--quick: a small llama with 128-wide heads, which a quantized V
cache needs): the time to read a system prompt of about 1.4K tokens (benchmarks/prompts/, whole, from
an empty context); generated tokens per second by one sequence (64 greedy tokens after that prompt)
and by four at once (30 steps of one `llama_decode` for the next tokens of 4 sequences that each
hold a prompt of the same length: the scheduler's batched step, as `snapcache serve --parallel 4`
runs it); the state's bytes per token (what `warm` captured); and whether 16 greedy tokens after a
restore from the store equal a cold run's. Medians of --runs, the cache types in turn.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
from _common import (
    BENCH_DIR,
    Table,
    choose_model,
    cold_read_seconds,
    fmt_bytes,
    fmt_seconds,
    geometry_model,
    make_parser,
    report,
)

KV_CACHES = ("f16", "q8_0", "q4_0")
QUESTION = "\n\nQuestion: what do you check first, and why?\nAnswer:"
GENERATED = 64
STEPS = 30
N_SEQ = 4


def _load(model: Path, kv_cache: str) -> Any:
    from snapcache import load_llama

    return load_llama(model, n_ctx=4096, n_threads=_common.LLAMA_THREADS, kv_cache=kv_cache)


def _one_sequence(llm: Any, tokens: list[int]) -> float:
    """Generated tokens per second after `tokens` were read (the read not counted)."""
    llm.reset()
    llm.eval(tokens)
    started = time.perf_counter()
    for _ in range(GENERATED):
        token = llm.sample(temp=0.0)
        llm.eval([token])
    return GENERATED / (time.perf_counter() - started)


def _four_sequences(llm: Any, tokens: list[int]) -> float:
    """Tokens per second of batched steps over `N_SEQ` sequences that each hold `tokens`."""
    from snapcache.llama.batch._context import Chunk, SequenceContext

    context = SequenceContext(llm, N_SEQ, len(tokens) + STEPS + 16)
    try:
        batch = context.n_batch
        for seq in range(N_SEQ):
            for start in range(0, len(tokens), batch):
                code, _ = context.decode([Chunk(seq, tokens[start : start + batch], start, False)])
                if code != 0:
                    raise RuntimeError(f"llama_decode failed ({code})")
        n = len(tokens)
        started = time.perf_counter()
        for step in range(STEPS):
            chunks = [Chunk(seq, [tokens[step % n]], n + step, True) for seq in range(N_SEQ)]
            code, _ = context.decode(chunks)
            if code != 0:
                raise RuntimeError(f"llama_decode failed ({code})")
        return N_SEQ * STEPS / (time.perf_counter() - started)
    finally:
        context.close()


def _greedy(target: Any, prompt: str) -> str:
    return str(target.create_completion(prompt, max_tokens=16, temperature=0.0)["choices"][0]["text"])


def _restored_equals_cold(model: Path, kv_cache: str, system: str, workdir: Path) -> tuple[int, bool]:
    """(state bytes per token of `system`, whether a restore then 16 tokens equal a cold run)."""
    from snapcache import CachedLlama, SnapshotStore

    prompt = system + QUESTION
    cold = _load(model, kv_cache)
    expected = _greedy(cold, prompt)
    cold.close()
    with SnapshotStore(workdir / f"cache-{kv_cache}") as store:
        writer = _load(model, kv_cache)
        # The system prompt as the whole prompt's tokens start (its last tokens may merge with the
        # question's first): a sliding-window model restores a state at its own length only.
        tokens, alone = writer.tokenize(prompt.encode()), writer.tokenize(system.encode())
        shared = next((i for i, (a, b) in enumerate(zip(tokens, alone, strict=False)) if a != b), len(alone))
        warmed = CachedLlama(writer, store).warm(list(tokens[:shared]))
        writer.close()
        reader = _load(model, kv_cache)
        cached = CachedLlama(reader, store, save=False)
        answer = _greedy(cached, prompt)
        restored = cached.last_restore.restored_tokens if cached.last_restore is not None else 0
        reader.close()
    return warmed.state_bytes // warmed.token_count, restored > 0 and answer == expected


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory(prefix="kv-cache-") as scratch:
        workdir = Path(scratch)
        model = geometry_model(workdir, n_layers=2) if args.quick else choose_model(False, workdir)
        system = (BENCH_DIR / "prompts" / "bookkeeper.txt").read_text(encoding="utf-8")
        if args.quick:
            system = system[:400]  # the small llama reads a token per byte
        measured: dict[str, dict[str, list[float]]] = {k: {} for k in KV_CACHES}
        for _ in range(runs):
            for kv_cache in KV_CACHES:  # in turn, so that a busy moment hits each alike
                llm = _load(model.path, kv_cache)
                tokens = list(llm.tokenize(system.encode()))
                figures = measured[kv_cache]
                figures.setdefault("read", []).append(cold_read_seconds(llm, tokens))
                figures.setdefault("one", []).append(_one_sequence(llm, tokens))
                figures.setdefault("four", []).append(_four_sequences(llm, tokens))
                figures.setdefault("tokens", []).append(len(tokens))
                llm.close()
        table = Table(
            f"{model.name}, {_common.LLAMA_THREADS} threads: the K/V cache types of --kv-cache "
            f"(median of {runs})",
            [
                "--kv-cache",
                "flash attention",
                f"prompt read ({int(measured['f16']['tokens'][0]):,} tokens)",
                "tokens/s, 1 sequence",
                f"tokens/s, {N_SEQ} sequences",
                "state per token",
                "restored = cold",
            ],
        )
        for kv_cache in KV_CACHES:
            figures = measured[kv_cache]
            per_token, equal = _restored_equals_cold(model.path, kv_cache, system, workdir)
            table.add(
                kv_cache,
                "no" if kv_cache == "f16" else "yes",
                fmt_seconds(statistics.median(figures["read"])),
                f"{statistics.median(figures['one']):.1f}",
                f"{statistics.median(figures['four']):.1f}",
                fmt_bytes(per_token),
                "yes" if equal else "no",
            )
        table.notes.append(
            f"tokens/s, {N_SEQ} sequences: {STEPS} batched steps (one llama_decode for one token of each "
            "sequence), as snapcache serve --parallel 4 runs them; prompt reads not counted"
        )
        table.notes.append(
            "restored = cold: a state warmed with CachedLlama, restored from the store, "
            "then 16 greedy tokens equal to a cold run's"
        )
    report("kv_cache_types", [table], args.json, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
