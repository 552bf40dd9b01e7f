"""How much padding a restored sliding-window cache needs to read on exactly as a cold prefill does.

    python benchmarks/bench_window_padding.py [--quick] [--sizes 700 2100 4000 9000] [--tokens 6]

Gemma-3's window cache keeps only the cells of its last 512 or so positions. Restored bare, those
cells land at the front of llama.cpp's cache, where a cold prefill has them at slots equal to their
positions, and the attention sums group them differently. For each prompt size the system prompt
is warmed into a RAM store once; then, for each padding, a new Llama restores it through
CachedLlama and answers a question greedily, and every generated token's logits are compared with
a cold read of the same prompt (bit for bit). Paddings:

- bare: the window as captured, no padding;
- to 32 / to 256 cells: masked zero cells in front of the window so that each cell sits at a slot
  congruent to its position modulo 32 or 256 (256 is what snapcache does: `WINDOW_PAD_CELLS`);
- from position 0: a masked cell for every position below the window (snapcache 0.1's padding).

Also shown: the blob handed to llama.cpp, and the restore's time (`RestoreInfo.restore_seconds`:
finding the prefix, assembling the blob, llama.cpp taking it), the median of --repeat restores.
--quick runs one small size.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _common import (
    Table,
    choose_model,
    fmt_seconds,
    make_parser,
    new_llama,
    prompt_paragraphs,
    report,
    text_of_tokens,
)

QUESTION = "\n\nQuestion: which of the rules above matters most, and why?\nAnswer:"
FULL_SIZES = [700, 2_100, 4_000, 9_000]
QUICK_SIZES = [700]
# (label, WINDOW_PAD_CELLS): a modulus of 1 pads nothing, one past any position pads from 0.
PADDINGS = [("bare", 1), ("to 32 cells", 32), ("to 256 cells (snapcache)", 256), ("from position 0", 1 << 30)]


def _greedy(target: Any, prompt: list[int], n_tokens: int) -> list[npt.NDArray[np.float32]]:
    """The logits each of `n_tokens` greedy tokens was picked from."""
    import llama_cpp

    rows: list[npt.NDArray[np.float32]] = []

    def record(_ids: Any, scores: Any) -> Any:
        rows.append(np.array(scores, dtype=np.float32))
        return scores

    target.create_completion(
        prompt, max_tokens=n_tokens, temperature=0.0, logits_processor=llama_cpp.LogitsProcessorList([record])
    )
    return rows


def _blob(store: Any, fingerprint: str, llm: Any, prompt: list[int]) -> tuple[int, int]:
    """The blob a restore of `prompt`'s longest stored prefix hands llama.cpp: its size, and the
    first position its window cache holds a cell for."""
    from snapcache.llama.state._state_layout import parse_sections, window_start
    from snapcache.llama.state.sequences import pads_windows
    from snapcache.llama.stored.stored_states import StoredStates

    tokens = np.asarray(prompt, dtype=np.int32)
    found = StoredStates(store, fingerprint).find(
        tokens, "bench", blocks_alone=False, pad_windows=pads_windows(llm)
    )
    if found is None:
        return 0, -1
    blob = np.frombuffer(found.snapshot.state, dtype=np.uint8)
    sections = parse_sections(blob)
    return blob.nbytes, window_start(sections[-1])


def measure(model_path: Path, sizes: list[int], n_tokens: int, repeat: int) -> list[dict[str, Any]]:
    import snapcache.llama.state._state_layout as layout
    from snapcache import CachedLlama, SnapshotStore

    default = layout.WINDOW_PAD_CELLS
    n_ctx = max(sizes) + 512
    cold_llm = new_llama(model_path, n_ctx, swa_cache="full")
    paragraphs = prompt_paragraphs()
    question = cold_llm.tokenize(QUESTION.encode(), add_bos=False)
    rows = []
    try:
        for size in sizes:
            system = cold_llm.tokenize(text_of_tokens(cold_llm, paragraphs, size + 8).encode())[:size]
            prompt = system + question
            cold_llm.reset()
            cold = _greedy(cold_llm, prompt, n_tokens)
            with SnapshotStore(None, ram_bytes=1 << 30) as store:
                cold_llm.reset()
                CachedLlama(cold_llm, store, "bench").warm(system)
                cold_llm.reset()
                for label, modulus in PADDINGS:
                    layout.WINDOW_PAD_CELLS = modulus
                    llm = new_llama(model_path, n_ctx, swa_cache="full")
                    cached = CachedLlama(llm, store, "bench", save=False)  # the warmed prefix, each time
                    restored = _greedy(cached, prompt, n_tokens)
                    info = cached.last_restore
                    seconds = [0.0 if info is None else info.restore_seconds]
                    for _ in range(repeat - 1):
                        llm.reset()
                        cached.create_completion(prompt, max_tokens=1, temperature=0.0)
                        seconds.append(
                            0.0 if cached.last_restore is None else cached.last_restore.restore_seconds
                        )
                    blob, window_from = _blob(store, cached.fingerprint, llm, prompt)
                    llm.close()
                    diff = max(float(np.abs(a - b).max()) for a, b in zip(restored, cold, strict=True))
                    rows.append(
                        {
                            "size": size,
                            "padding": label,
                            "restored": 0 if info is None else info.restored_tokens,
                            "blob_bytes": blob,
                            "window_from": window_from,
                            "restore_s": statistics.median(seconds),
                            "max_diff": diff,
                            "identical": len(restored) == len(cold) and diff == 0.0,
                        }
                    )
    finally:
        layout.WINDOW_PAD_CELLS = default
        cold_llm.close()
    return rows


def main() -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="system prompt sizes in tokens")
    parser.add_argument("--tokens", type=int, default=6, help="greedy tokens compared (default 6)")
    parser.add_argument("--repeat", type=int, default=5, help="restores timed per row (default 5)")
    args = parser.parse_args()
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as tmp:
        model = choose_model(False, Path(tmp))
        if model.is_tiny:
            print("bench_window_padding needs Gemma-3, a sliding-window model (`make install` installs it)")
            return 0
        rows = measure(model.path, sorted(sizes), args.tokens, max(1, args.repeat))
    table = Table(
        f"A restored window cache padded four ways ({model.name}, greedy {args.tokens} tokens, RAM store)",
        [
            "prompt tokens",
            "padding",
            "window cells from",
            "restored tokens",
            "blob MiB",
            "restore",
            "logits == cold",
            "max |Δ logit|",
        ],
    )
    for row in rows:
        table.add(
            f"{row['size']:,}",
            row["padding"],
            f"{row['window_from']:,}",
            f"{row['restored']:,}",
            round(row["blob_bytes"] / 2**20, 1),
            fmt_seconds(row["restore_s"]),
            "yes" if row["identical"] else "no",
            f"{row['max_diff']:.3g}",
        )
    table.notes.append(
        "logits == cold: every generated token's logits bit-identical to a cold read of the same prompt"
    )
    table.notes.append(
        "window cells from: the first position the window cache handed to llama.cpp has a cell for"
    )
    table.notes.append(f"restore: RestoreInfo.restore_seconds, the median of {max(1, args.repeat)} restores")
    report("bench_window_padding", [table], args.json, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
