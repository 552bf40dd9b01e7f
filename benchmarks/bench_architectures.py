"""One row per model architecture: state size, restore time, time to first token, exactness.

    python benchmarks/bench_architectures.py [--quick] [--archs llama mamba ...] [--tokens 1536]
                                             [--runs 3] [--json PATH]

For each tiny architecture the test suite writes with `gguf` (tests/tiny_model.py: llama, qwen2,
qwen3, phi3, gemma2, mamba, lfm2), for Gemma-3-270M Q4_K_M (when its package is installed) and for
a random llama with an 8B model's KV geometry, on 2 threads and llama.cpp's defaults:

- the state of a sequence holding the prompt's long prefix of `--tokens` tokens
  (`llama_state_seq_get_size`), divided by its tokens, and what one more token adds (read between
  half the prefix and all of it): 0 for a recurrent model, whose state is one size per sequence;
- the restore of that prefix, store to context: from RAM (the store `warm` filled) and from disk (a
  store opened again on the same directory, its RAM tier empty; the files are in the page cache),
  timed from the completion call to the moment snapcache reports the restore (median of `--runs`);
- time to first token of 8 greedy tokens after the prefix and a short question: cold (a plain
  Llama) and restored (a new CachedLlama, save=False, over a reopened store, into a Llama that
  holds nothing), in turn, median of `--runs` (fewer once the cold reads add up to 10 s);
- whether every restored run's tokens, and its last logits, equal the cold read's bit for bit.

--quick: a short prefix, the tiny models and a 2-layer geometry model, one run (a smoke run).
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
from _common import (
    Table,
    fmt_bytes,
    fmt_ratio,
    fmt_seconds,
    make_parser,
    new_llama,
    prompt_paragraphs,
    report,
)
from tiny_model import ARCHITECTURES

TINY_ARCHS: tuple[str, ...] = ARCHITECTURES
GEMMA3 = "gemma3"
GEOMETRY = "geometry"
ALL_ARCHS = (*TINY_ARCHS, GEMMA3, GEOMETRY)
FULL_TOKENS = 1_024  # a multiple of 64: sliding-window models restore 64-token multiples
QUICK_TOKENS = 192
QUESTION = "\n\nQuestion: which of the rules above matters most, and why?\nAnswer:"
MAX_TOKENS = 8
SCOPE = "bench"
SLOW_SECONDS = 10.0  # time to first token: fewer runs than --runs once they take this long


@dataclass(frozen=True, slots=True)
class Model:
    arch: str
    name: str
    path: Path


@dataclass(slots=True)
class Row:
    arch: str
    model: str
    prefix_tokens: int
    prompt_tokens: int
    state_bytes: int
    half_state_bytes: int
    bytes_per_added_token: float
    restore_ram_s: float
    restore_disk_s: float
    restored_tokens: int
    restored_source: str | None
    cold_ttft_s: float
    restored_ttft_s: float
    ttft_runs: int
    tokens_equal: bool
    logits_equal: bool


class _RestoreClock:
    """A completion listener that notes when snapcache has restored the prompt's prefix."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.info: Any = None

    def restored(self, scope: str, info: Any) -> None:
        self.at = time.perf_counter()
        self.info = info

    def finished(self, report: Any) -> None:
        pass


# -- models -------------------------------------------------------------------------------------------


def model_for(arch: str, workdir: Path, *, quick: bool) -> Model | None:
    """The model file of `arch`, written into `workdir` (None: Gemma-3-270M is not installed)."""
    if arch == GEMMA3:
        from snapcache.llama.setup.demo_model import DEMO_MODEL_NAME, default_model_path

        path = default_model_path()
        if path is None:
            print(
                f"note: {DEMO_MODEL_NAME} is not installed (pip install 'snapcache[demo]'): no row",
                file=sys.stderr,
            )
            return None
        return Model(arch, "Gemma-3-270M Q4_K_M", Path(path))
    if arch == GEOMETRY:
        n_layers = 2 if quick else 32
        choice = _common.geometry_model(workdir, n_layers=n_layers)
        return Model(arch, f"llama, 8B KV geometry ({n_layers} layers x 8 x 128, f16)", choice.path)
    from tiny_model import write_tiny_model

    path = workdir / f"tiny-{arch}-0.gguf"
    if not path.exists():
        write_tiny_model(path, arch, seed=0)
    return Model(arch, f"tiny {arch} (random weights)", path)


def prompt_tokens(llm: Any, n_prefix: int) -> tuple[list[int], list[int]]:
    """The first `n_prefix` tokens of the benchmark prompts (BOS first), and a question to follow them."""
    text = "\n\n".join(prompt_paragraphs())
    tokens: list[int] = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    body = tokens[1:] if tokens[:1] == [llm.token_bos()] else tokens
    while len(tokens) < n_prefix:
        tokens = tokens + body
    question: list[int] = llm.tokenize(QUESTION.encode("utf-8"), add_bos=False, special=False)
    return tokens[:n_prefix], question


# -- measuring ----------------------------------------------------------------------------------------


def _seq_state_bytes(llm: Any) -> int:
    import llama_cpp

    return int(llama_cpp.llama_state_seq_get_size(llm.ctx, ctypes.c_int32(0)))


def _first_call(llm: Any) -> None:
    """llama.cpp's first evaluation in a context is slower than the rest: pay it untimed."""
    llm.create_completion("Hello.", max_tokens=1, temperature=0.0)
    llm.reset()


def _greedy(complete: Callable[..., Any], llm: Any, prompt: list[int]) -> tuple[float, list[int], bytes]:
    """Complete `prompt` greedily: seconds to the first sampled token, the context's tokens afterwards
    and the last logits' bytes."""
    import llama_cpp

    first: list[float] = []

    def note_first_token(input_ids: Any, logits: Any) -> bool:
        if not first:
            first.append(time.perf_counter())
        return False

    started = time.perf_counter()
    complete(
        prompt,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stopping_criteria=llama_cpp.StoppingCriteriaList([note_first_token]),
    )
    tokens = [int(t) for t in llm.input_ids[: llm.n_tokens]]
    n_vocab = int(llm.n_vocab())
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    ttft = (first[0] if first else time.perf_counter()) - started
    return ttft, tokens, ctypes.string_at(logits, n_vocab * ctypes.sizeof(ctypes.c_float))


def _alternate(cold: Callable[[], float], restored: Callable[[], float], runs: int) -> tuple[float, float]:
    """Medians of up to `runs` cold and restored results, taken in turn (so that both see the same
    load); fewer once the cold ones add up to SLOW_SECONDS (at least one of each)."""
    colds: list[float] = []
    restoreds: list[float] = []
    while not colds or (len(colds) < runs and sum(colds) < SLOW_SECONDS):
        colds.append(cold())
        restoreds.append(restored())
    return statistics.median(colds), statistics.median(restoreds)


def measure(model: Model, n_prefix: int, runs: int, workdir: Path) -> Row:
    from snapcache import CachedLlama, SnapshotStore, attach, detach

    store_args: dict[str, Any] = {"ram_bytes": 2 << 30, "disk_bytes": 8 << 30}
    directory = workdir / f"store-{model.arch}"
    writer = new_llama(model.path, n_prefix + 256)
    try:
        prefix, question = prompt_tokens(writer, n_prefix)
        prompt = prefix + question
        n_ctx = len(prompt) + MAX_TOKENS + 64
        if n_ctx > int(writer.n_ctx()):
            writer.close()
            writer = new_llama(model.path, n_ctx)
        store = SnapshotStore(directory, **store_args)
        cached = CachedLlama(writer, store, SCOPE)
        half = n_prefix // 2 // 64 * 64 or n_prefix // 2
        cached.warm(prefix[:half])
        half_bytes = _seq_state_bytes(writer)
        cached.warm(prefix)
        full_bytes = _seq_state_bytes(writer)
    finally:
        writer.close()

    reader = new_llama(model.path, n_ctx)
    cold = new_llama(model.path, n_ctx)
    try:
        _first_call(reader)
        _first_call(cold)

        def restore(target: Any, source: str) -> float:
            clock = _RestoreClock()
            attach(reader, target, SCOPE, save=False, listener=clock)
            try:
                reader.reset()
                started = time.perf_counter()
                # The prefix and the question: a prompt restored whole would read its last token
                # alone, which a restore leaves to cold reads where that batch reads otherwise.
                reader.create_completion(prompt, max_tokens=1, temperature=0.0)
            finally:
                detach(reader)
            info = clock.info
            if clock.at is None or info is None or info.source != source or info.restored_tokens != n_prefix:
                raise SystemExit(
                    f"{model.arch}: expected {n_prefix} tokens restored from {source}, got {info}"
                )
            return clock.at - started

        def restore_from_disk() -> float:
            with SnapshotStore(directory, **store_args) as reopened:
                return restore(reopened, "disk")

        try:
            restore_ram = statistics.median(restore(store, "ram") for _ in range(runs))
        finally:
            store.close()
        restore_disk = statistics.median(restore_from_disk() for _ in range(runs))

        cold_runs: list[tuple[float, list[int], bytes]] = []
        restored_runs: list[tuple[float, list[int], bytes]] = []
        infos: list[Any] = []

        def cold_ttft() -> float:
            cold.reset()
            cold_runs.append(_greedy(cold.create_completion, cold, prompt))
            return cold_runs[-1][0]

        def restored_ttft() -> float:
            with SnapshotStore(directory, **store_args) as reopened:
                restored = CachedLlama(reader, reopened, SCOPE, save=False)
                reader.reset()
                restored_runs.append(_greedy(restored.create_completion, reader, prompt))
                infos.append(restored.last_restore)
            return restored_runs[-1][0]

        cold_s, restored_s = _alternate(cold_ttft, restored_ttft, runs)
    finally:
        reader.close()
        cold.close()

    _, cold_tokens, cold_logits = cold_runs[0]
    if any(run[1:] != (cold_tokens, cold_logits) for run in cold_runs):
        print(f"note: {model.arch}: cold runs differ from one another", file=sys.stderr)
    info = infos[-1]
    return Row(
        arch=model.arch,
        model=model.name,
        prefix_tokens=n_prefix,
        prompt_tokens=len(prompt),
        state_bytes=full_bytes,
        half_state_bytes=half_bytes,
        bytes_per_added_token=(full_bytes - half_bytes) / (n_prefix - half),
        restore_ram_s=restore_ram,
        restore_disk_s=restore_disk,
        restored_tokens=0 if info is None else info.restored_tokens,
        restored_source=None if info is None else info.source,
        cold_ttft_s=cold_s,
        restored_ttft_s=restored_s,
        ttft_runs=len(cold_runs),
        tokens_equal=all(run[1] == cold_tokens for run in restored_runs),
        logits_equal=all(run[2] == cold_logits for run in restored_runs),
    )


# -- the table ----------------------------------------------------------------------------------------


def _exact(row: Row) -> str:
    if row.tokens_equal and row.logits_equal:
        return "yes"
    return "tokens only" if row.tokens_equal else "NO"


def table_of(rows: list[Row], n_prefix: int, runs: int) -> Table:
    table = Table(
        f"Per architecture: a {n_prefix:,}-token prefix restored ({_common.LLAMA_THREADS} threads, "
        f"median of up to {runs}, greedy)",
        ["architecture", "state", "bytes/token", "+1 token", "restore RAM", "restore disk",
         "restored", "TTFT cold", "TTFT restored", "cold/restored", "exact"],
    )  # fmt: skip
    for row in rows:
        table.add(
            row.arch,
            fmt_bytes(row.state_bytes),
            f"{row.state_bytes / row.prefix_tokens:,.0f} B",
            f"{row.bytes_per_added_token:,.0f} B",
            fmt_seconds(row.restore_ram_s),
            fmt_seconds(row.restore_disk_s),
            f"{row.restored_tokens:,}/{row.prompt_tokens:,}",
            fmt_seconds(row.cold_ttft_s),
            fmt_seconds(row.restored_ttft_s),
            fmt_ratio(row.cold_ttft_s, row.restored_ttft_s),
            _exact(row),
        )
    for row in rows:
        table.notes.append(f"{row.arch}: {row.model}; {row.ttft_runs} cold and restored runs")
    table.notes.append(
        "state: llama_state_seq_get_size of the sequence holding the prefix; bytes/token: state / prefix "
        "tokens; +1 token: what a token adds (half the prefix to all of it), 0 B where the state is one "
        "size per sequence"
    )
    table.notes.append(
        "restore: store to context, from the completion call to snapcache's report of the restore; "
        "RAM: the store warm filled; disk: the store opened again (files in the page cache)"
    )
    table.notes.append(
        f"TTFT: to the first of {MAX_TOKENS} greedy tokens after prefix + question, cold and restored in "
        "turn; cold: a plain Llama; "
        "restored: a new CachedLlama (save=False) over a reopened store; restored: tokens restored / "
        "prompt tokens"
    )
    table.notes.append(
        f"exact: every restored run's {MAX_TOKENS} greedy tokens and last logits equal the cold read's "
        "bit for bit (tokens only: the logits differ in the last bits)"
    )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", choices=ALL_ARCHS, help="architectures to run (default: all)")
    parser.add_argument(
        "--tokens",
        type=int,
        help=f"prefix tokens (default {FULL_TOKENS:,}; --quick "
        f"{QUICK_TOKENS}); tiny models are written for a 4,096-token context",
    )
    parser.add_argument(
        "--runs",
        type=int,
        help="timed runs per median (default 3; --quick 1); time to "
        f"first token stops early once its cold reads take {SLOW_SECONDS:.0f} s",
    )
    args = parser.parse_args(argv)
    archs = args.archs or ([*TINY_ARCHS, GEOMETRY] if args.quick else list(ALL_ARCHS))
    n_prefix = args.tokens or (QUICK_TOKENS if args.quick else FULL_TOKENS)
    if n_prefix < 128:
        parser.error("--tokens must be at least 128 (snapcache caches prefixes of 64 tokens or more)")
    runs = args.runs or (1 if args.quick else 3)

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as tmp:
        for arch in archs:
            model = model_for(arch, Path(tmp), quick=args.quick)
            if model is None:
                continue
            print(f"  {arch}...", file=sys.stderr, flush=True)
            rows.append(measure(model, n_prefix, runs, Path(tmp)))
    elapsed = time.perf_counter() - started

    table = table_of(rows, n_prefix, runs)
    table.notes.append(
        f"whole run {fmt_seconds(elapsed)}; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (a shared machine)"
    )
    report("bench_architectures", [table], args.json, quick=args.quick,
           extra={"rows": [asdict(row) for row in rows]})  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(_common.LLAMA_THREADS))
    sys.exit(main())
