"""A burst of agents at once against `snapcache serve`, one request at a time against several.

    python benchmarks/serve_burst.py [--quick] [--runs 2] [--parallel 1 4] [--tokens 32]

Four agents with distinct system prompts (about 215 Gemma tokens each) ask one question each, one
after the other (their prompts are then seen), then four new questions at the same moment (streamed,
greedy). For each `--parallel` setting a fresh `snapcache serve` process on its own cache directory
is started, measured and stopped; settings alternate run by run. Reported: the time the four
one-by-one requests took, and the burst's slowest first token and last token (medians of --runs).
Side by side with llama-server and llama-cpp-python's servers: `serve_vs_peers.py`.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import Table, choose_model, fmt_seconds, make_parser, report
from server_process import start_server

TOPICS = ["mail triage", "calendar planning", "code review", "travel booking"]
RULES = (
    "Follow the house rules: be brief, be exact, cite the file you used, never invent facts, "
    "ask when unsure. "
)
SYSTEMS = [f"You are agent {i}, an assistant for {topic}. " + RULES * 8 for i, topic in enumerate(TOPICS)]


def _ask(api_url: str, agent: int, question: str, tokens: int) -> tuple[float, float]:
    """(seconds to the first content chunk, seconds to the last) of one streamed chat."""
    import openai

    client = openai.OpenAI(base_url=api_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": SYSTEMS[agent]}, {"role": "user", "content": question}]
    started = time.perf_counter()
    first = None
    stream = client.chat.completions.create(
        model="default",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=tokens,
        temperature=0.0,
        stream=True,
        extra_headers={"X-Snapcache-Scope": f"agent-{agent}"},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
    client.close()
    ended = time.perf_counter() - started
    return (first if first is not None else ended), ended


def _one_run(model: Path, workdir: Path, parallel: int, tokens: int, n_ctx: int) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix=f"p{parallel}-", dir=workdir))
    options = ["--parallel", str(parallel)]
    server = start_server(model, home / "cache", home / "server.log", *options, n_ctx=n_ctx)
    try:
        started = time.perf_counter()
        for agent in range(len(SYSTEMS)):
            _ask(server.api_url, agent, "What should I do first today?", tokens)
        one_by_one = time.perf_counter() - started
        with ThreadPoolExecutor(len(SYSTEMS)) as pool:
            burst = list(
                pool.map(lambda a: _ask(server.api_url, a, f"And after that, step {a}?", tokens), range(4))
            )
    finally:
        server.kill()
    return {
        "one_by_one": one_by_one,
        "first": max(first for first, _ in burst),
        "last": max(last for _, last in burst),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per setting (median)")
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4], help="the settings compared")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per answer")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    tokens = 8 if args.quick else args.tokens
    with tempfile.TemporaryDirectory(prefix="serve-burst-") as scratch:
        workdir = Path(scratch)
        choice = choose_model(args.quick, workdir)
        n_ctx = 8192 if choice.is_tiny else 2048  # the tiny model reads bytes: ~1.8K tokens a prompt
        results: dict[int, list[dict[str, float]]] = {p: [] for p in args.parallel}
        for _ in range(runs):
            for parallel in args.parallel:
                results[parallel].append(_one_run(choice.path, workdir, parallel, tokens, n_ctx))

    table = Table(
        f"{choice.name}: 4 agents, then a burst of 4 new questions (streamed, greedy, {tokens} tokens; "
        f"median of {runs})",
        ["snapcache serve", "4 one by one", "burst: slowest first token", "burst: last token"],
    )
    median: Any = statistics.median
    for parallel, measured in results.items():
        table.add(
            f"--parallel {parallel}",
            fmt_seconds(median([m["one_by_one"] for m in measured])),
            fmt_seconds(median([m["first"] for m in measured])),
            fmt_seconds(median([m["last"] for m in measured])),
        )
    table.notes.append("each run: a fresh server and cache directory; the settings alternate run by run")
    report("serve_burst", [table], args.json, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
