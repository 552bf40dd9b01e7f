"""What loading a model without llama.cpp's extra buffer types costs: snapcache's answer to the AMX crash.

    python benchmarks/bench_extra_buffers.py [--quick] [--repeat 3]

Where llama.cpp's AMX kernels would run (and crash, llama.cpp #20824), `load_llama` loads the
weights with `use_extra_bufts = false`, which also gives up the repacked CPU kernels. The other
choice was to refuse to run. This measures the first: for the Gemma demo model and its 1.9K-token
system prompt (`examples/system_prompt.txt`) plus a question, with extra buffer types on (what every
other machine gets) and off, the model's load time, a cold chat completion's time to first token,
the restored one's (the system prompt warmed into a RAM store by another Llama of the same kind),
and generated tokens per second. Medians of --repeat runs, each on a new Llama.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from _common import ROOT, Table, choose_model, fmt_ratio, fmt_seconds, make_parser, new_llama, report

QUESTION = "Which of the rules above matters most when a customer is angry?"
N_CTX = 4096
QUICK_N_CTX = 12288  # the tiny model's byte vocabulary reads the system prompt as ~10.6K tokens
GENERATED = 32


def _chat(llm: Any, system: str) -> tuple[float, float]:
    """(seconds to the first token, generated tokens per second after it) of one greedy streamed chat."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
    started = time.perf_counter()
    first = None
    chunks = 0
    for chunk in llm.create_chat_completion(
        messages=messages, max_tokens=GENERATED, temperature=0.0, stream=True
    ):
        if chunk["choices"][0]["delta"].get("content"):
            chunks += 1
            if first is None:
                first = time.perf_counter()
    ended = time.perf_counter()
    assert first is not None, "the model answered nothing"
    return first - started, (chunks - 1) / (ended - first) if chunks > 1 and ended > first else 0.0


def _measure(model: Path, system: str, extra: bool, repeat: int, n_ctx: int) -> dict[str, float]:
    from snapcache import CachedLlama, SnapshotStore

    loads, colds, restores, rates = [], [], [], []
    with SnapshotStore(None, ram_bytes=1 << 30) as store:
        writer = new_llama(model, n_ctx, use_extra_bufts=extra)
        CachedLlama(writer, store, save=False).warm(system)
        writer.close()
        for _ in range(repeat):
            started = time.perf_counter()
            llm = new_llama(model, n_ctx, use_extra_bufts=extra)
            loads.append(time.perf_counter() - started)
            cold, rate = _chat(llm, system)
            colds.append(cold)
            rates.append(rate)
            llm.close()
            llm = new_llama(model, n_ctx, use_extra_bufts=extra)
            cached = CachedLlama(llm, store, save=False)
            restored, _ = _chat(cached, system)
            assert cached.last_restore is not None
            assert cached.last_restore.restored_tokens > 0
            restores.append(restored)
            llm.close()
    median = statistics.median
    return {"load": median(loads), "cold": median(colds), "restored": median(restores), "rate": median(rates)}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting (median)")
    args = parser.parse_args(argv)
    workdir = ROOT / "benchmarks" / "results" / "models"
    workdir.mkdir(parents=True, exist_ok=True)
    choice = choose_model(args.quick, workdir)
    system = (ROOT / "examples" / "system_prompt.txt").read_text(encoding="utf-8")
    repeat = 1 if args.quick else args.repeat
    n_ctx = QUICK_N_CTX if choice.is_tiny else N_CTX
    on = _measure(choice.path, system, True, repeat, n_ctx)
    off = _measure(choice.path, system, False, repeat, n_ctx)

    table = Table(
        f"{choice.name}: extra buffer types on and off (median of {repeat}; 1.9K-token system prompt)",
        ["", "extra buffers on", "off (AMX guard)", "off / on"],
    )
    rows = [("model load", "load"), ("cold: first token", "cold"), ("restored: first token", "restored")]
    for label, name in rows:
        table.add(label, fmt_seconds(on[name]), fmt_seconds(off[name]), fmt_ratio(off[name], on[name]))
    rate_ratio = fmt_ratio(off["rate"], on["rate"])
    table.add("generated tokens/s", f"{on['rate']:.1f}", f"{off['rate']:.1f}", rate_ratio)
    table.notes.append("off: what load_llama does where llama.cpp's AMX kernels crash; refusing runs nothing")
    report("bench_extra_buffers", [table], args.json, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
