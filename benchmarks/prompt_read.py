"""Where a cold prompt read goes: llama-cpp-python's settings, snapcache's captures, and llama-server.

    python benchmarks/prompt_read.py [--quick] [--sizes 3072 8192] [--runs 1] [--json PATH]

Each configuration reads the same prompt of each size, from an empty context, on Gemma-3-270M with
2 threads (--quick: the tiny test model, small sizes): tokens per second of the read alone, the
first token not counted, after an untimed read of 64 tokens (the first decode's setup). In process,
on one fresh Llama each:

- "llama-cpp-python as snapcache loads it": `load_llama` (n_batch 512, a window-sized sliding-window
  cache, no flash attention): what `snapcache serve` and `CachedLlama` read with;
- one llama.cpp setting changed at a time: n_batch 2048, a full-size sliding-window cache
  (`swa_cache="full"`, llama-cpp-python's own default), flash attention on;
- "CachedLlama, fresh store": the same read through `CachedLlama.create_completion` (max_tokens=1),
  its restore-point captures and puts included: what snapcache adds to a cold read.

And llama-server (benchmarks/results/llama-server-build/bin/llama-server, built by
serve_concurrency.py from llama-cpp-python's own llama.cpp) on the same GGUF and threads, its
defaults otherwise, cache off: the `prompt_per_second` it reports for the same tokens. A setting
that changes what a state holds (the sliding-window cache's size, flash attention) changes the
fingerprint, and flash attention over an f16 cache makes no restore exact: the table says which.
"""

from __future__ import annotations

import functools
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
from _common import (
    RESULTS_DIR,
    Table,
    choose_model,
    cold_read_seconds,
    make_parser,
    prompt_paragraphs,
    report,
)

WARMUP_TOKENS = 64
LLAMA_SERVER = RESULTS_DIR / "llama-server-build" / "bin" / "llama-server"
# What each in-process configuration changes from load_llama's defaults, and what that costs the cache.
SETTINGS: list[tuple[str, dict[str, Any], str]] = [
    ("llama-cpp-python as snapcache loads it", {}, "-"),
    ("  n_batch 2048", {"n_batch": 2048}, "none"),
    ("  full-size sliding-window cache", {"swa_cache": "full"}, "a new fingerprint; padded windows"),
    ("  flash attention on", {"flash_attn": True}, "no exact restore over an f16 cache"),
]


def _prompt(llm: Any, n_tokens: int) -> list[int]:
    """`n_tokens` tokens of the benchmark's prompt text (its paragraphs, repeated as needed)."""
    paragraphs = prompt_paragraphs()
    text, tokens = "", []
    while len(tokens) < n_tokens:
        text += "\n\n".join(paragraphs) + "\n\n"
        tokens = llm.tokenize(text.encode(), add_bos=True)
    return list(tokens[:n_tokens])


def _load(model: Path, n_ctx: int, **settings: Any) -> Any:
    from snapcache import load_llama

    return load_llama(model, n_ctx=n_ctx, n_threads=_common.LLAMA_THREADS, **settings)


def _cached_read_seconds(llm: Any, tokens: list[int]) -> float:
    """A cold completion through CachedLlama on a fresh RAM store, less one token's generation."""
    from snapcache import CachedLlama, SnapshotStore

    llm.reset()
    with SnapshotStore(None, ram_bytes=8 << 30) as store:
        cached = CachedLlama(llm, store)
        started = time.perf_counter()
        cached.create_completion(tokens, max_tokens=1, temperature=0.0)
        seconds = time.perf_counter() - started
    one_token = _one_token_seconds(llm, tokens)
    return seconds - one_token


def _one_token_seconds(llm: Any, tokens: list[int]) -> float:
    """One more token's evaluation after `tokens`, as generation pays it."""
    started = time.perf_counter()
    llm.eval([tokens[-1]])
    return time.perf_counter() - started


def _llama_server_rates(
    model: Path, n_ctx: int, prompts: dict[int, list[int]], runs: int
) -> dict[int, float]:
    """llama-server's own prompt tokens/s for each prompt (median of `runs`), cache off."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(LLAMA_SERVER), "-m", str(model), "-c", str(n_ctx), "-t", str(_common.LLAMA_THREADS),
        "-tb", str(_common.LLAMA_THREADS), "--host", "127.0.0.1", "--port", str(port), "-np", "1",
        "--cache-ram", "0", "--no-warmup",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(port, server)
            first = next(iter(prompts.values()))[:WARMUP_TOKENS]  # untimed, as in process
            _post(port, "/completion", {"prompt": first, "n_predict": 1, "cache_prompt": False})
            rates: dict[int, float] = {}
            for size, tokens in prompts.items():
                samples = []
                for _ in range(runs):
                    body = {"prompt": tokens, "n_predict": 1, "cache_prompt": False, "temperature": 0.0}
                    answer = _post(port, "/completion", body)
                    samples.append(float(answer["timings"]["prompt_per_second"]))
                rates[size] = statistics.median(samples)
            return rates
        finally:
            server.terminate()
            server.wait(timeout=30)


def _wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"llama-server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise SystemExit("llama-server did not become ready in 120 s")


def _post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


def _rates(
    sizes: list[int], runs: int, read: Callable[[list[int]], float], prompts: dict[int, list[int]]
) -> dict[int, float]:
    """Tokens per second of each size's read of its prompt (the median of `runs` reads)."""
    return {size: size / statistics.median(read(prompts[size]) for _ in range(runs)) for size in sizes}


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="prompt lengths in tokens (default 3072 8192)")
    parser.add_argument("--runs", type=int, default=1, help="reads of each prompt per configuration (median)")
    args = parser.parse_args()
    sizes = args.sizes or ([256, 512] if args.quick else [3072, 8192])
    with tempfile.TemporaryDirectory() as tmp:
        model = choose_model(args.quick, Path(tmp))
        n_ctx = max(sizes) + 256
        rows: list[dict[str, Any]] = []
        prompts: dict[int, list[int]] = {}
        for label, settings, cost in SETTINGS:
            llm = _load(model.path, n_ctx, **settings)
            try:
                prompts = prompts or {size: _prompt(llm, size) for size in sizes}
                cold_read_seconds(llm, prompts[sizes[0]][:WARMUP_TOKENS])  # untimed: the first decode's setup
                rates = _rates(sizes, args.runs, functools.partial(cold_read_seconds, llm), prompts)
                rows.append({"label": label, "rates": rates, "cost": cost})
                if not settings:
                    cached = _rates(sizes, args.runs, functools.partial(_cached_read_seconds, llm), prompts)
                    what = "  CachedLlama, fresh store (captures included)"
                    rows.append({"label": what, "rates": cached, "cost": "-"})
            finally:
                llm.close()
            print(f"  {label.strip()}: " + ", ".join(f"{rates[s]:.0f} tok/s" for s in sizes), file=sys.stderr)
        peer: dict[int, float] | None = None
        if LLAMA_SERVER.is_file():
            peer = _llama_server_rates(model.path, n_ctx, prompts, args.runs)
            rows.append({"label": "llama-server (its defaults, cache off)", "rates": peer, "cost": "-"})
    table = Table(
        f"{model.name}: a cold prompt read, {_common.LLAMA_THREADS} threads (median of {args.runs})",
        ["configuration", *(f"{size:,} tokens: tok/s" for size in sizes),
         *(f"{size:,}: x llama-server" for size in sizes if peer), "what it costs the cache"],
    )  # fmt: skip
    for row in rows:
        ratios = [f"{row['rates'][size] / peer[size]:.2f}" for size in sizes] if peer else []
        table.add(row["label"], *(f"{row['rates'][size]:.0f}" for size in sizes), *ratios, row["cost"])
    if peer is None:
        table.notes.append(f"llama-server: not built ({LLAMA_SERVER.relative_to(_common.ROOT)}); "
                           "serve_concurrency.py builds it")  # fmt: skip
    table.notes.append("tok/s: prompt tokens over the seconds of the read alone (llama-server: its own "
                       "timings.prompt_per_second); the first generated token is not counted")  # fmt: skip
    table.notes.append("what it costs the cache: the full-size sliding-window cache (--swa-cache full) is "
                       "another fingerprint (states stored under the window-sized one, the default, are not "
                       "found) and keeps every row behind the window, so a stored state restores a shorter "
                       "prefix padded; flash attention over an f16 cache makes snapcache cache nothing "
                       "(support.py)")  # fmt: skip
    extra = {"rows": [{**row, "rates": {str(k): v for k, v in row["rates"].items()}} for row in rows]}
    report("prompt_read", [table], args.json, quick=args.quick, extra=extra)


if __name__ == "__main__":
    main()
