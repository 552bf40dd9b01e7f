"""Agents at once: `snapcache serve --parallel 4` side by side with llama-server -np 4 and llama-cpp-python's.

    python benchmarks/serve_concurrency.py [--quick] [--runs 2] [--servers ...] [--tokens 48]
                                           [--llama-server PATH] [--no-build]

Four agents with distinct system prompts (benchmarks/prompts/, 1.3-1.7K Gemma tokens) ask over HTTP
with the `openai` client: streamed, greedy, --tokens tokens, a 32K context, 2 threads. Each server,
on a fresh cache directory, goes through:

1. the four ask one question each, one by one (these answers are the cold ones);
2. prompts seen: a burst of four new questions at the same moment;
3. a restart, then the first four questions again as a burst (answers compared with the cold ones);
4. a restart, then four new questions as a burst;
5. a burst of 8 (each agent twice), prompts seen;
6. throughput: a burst of four asking for 128 tokens: the tokens all four generated per second, from
   the first token of the burst to its last.

A burst's figures are its slowest first token and its last token, from the moment all its requests
were sent; medians of --runs, the servers taking turns run by run. The servers:

- `snapcache serve --parallel 4` (batched steps, the default), with `--batch-mode exact`, with
  `--kv-cache q8_0` (flash attention over a Q8_0 K/V cache), with `--inexact` (restores and reuses
  prefixes at any token, not only on the split alignment), and with `--parallel 1` (one request at
  a time);
- `llama-server -np 4 --cache-ram 2048` built from the llama.cpp that llama-cpp-python vendors: found
  with --llama-server, in benchmarks/results/llama-server-build/, or built there from the source
  distribution (about 10 minutes on 2 cores; --no-build skips the column instead);
- the batched example server of llama-cpp-python's source distribution (examples/server/server.py),
  4 sequences, its disk sequence cache (fetched as serve_vs_peers.py fetches it).

Every server reads the same model file: Gemma with Gemma 3's chat template in its GGUF.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import _common
from _common import RESULTS_DIR, Table, fmt_seconds, make_parser, report
from serve_vs_peers import (
    Launch,
    Server,
    _free_port,
    _load_line,
    fetch_example_server,
    fetch_sdist_part,
    prepare_model,
)

PROMPTS = ["bookkeeper.txt", "trail_planner.txt", "code_reviewer.txt", "mail_triager.txt"]
QUESTIONS = {
    "one_by_one": [
        "What should I look at first this morning? Explain your reasons step by step.",
        "Plan my next outing from start to finish, with every stop and timing.",
        "Walk me through what you check first in a new pull request, and why.",
        "Summarise how you sort this morning's mail, tray by tray, with examples.",
    ],
    "seen": [
        "Which three things could go wrong this week, and what would you do about each?",
        "What should a beginner pack, item by item, and why does each item matter?",
        "List the questions you would ask a contributor about a large refactoring.",
        "A supplier says their bank details changed. Describe exactly what happens next.",
    ],
    "new": [
        "Write a short checklist for the end of the month, with one line per task.",
        "How do you choose a route when the weather forecast is uncertain? Give details.",
        "What makes a test suite trustworthy? Answer with concrete examples.",
        "Draft the morning summary for a quiet Monday with five messages.",
    ],
    "burst8": [
        "What are the rules you follow most strictly? List and explain them.",
        "Tell me about the people you work with and what each one handles.",
        "Which of your tasks takes the longest, and how could it be shortened?",
        "Describe a typical day for you, hour by hour.",
        "What would you need from me to do your job better? Be specific.",
        "Give me five tips a new colleague should know on their first day.",
        "Explain the most common mistake people make with you, and how to avoid it.",
        "What do you never do, and why not? Give the reasons in full.",
    ],
    "throughput": [
        "Write a detailed guide, in numbered steps, to everything you do in a week.",
        "Describe in detail three different outings, each with a full timetable.",
        "Write a long, careful review of a change that adds a new file format.",
        "Write a long explanation of every tray and every standard reply, with examples.",
    ],
}
THROUGHPUT_TOKENS = 128
N_CTX = 32768
QUICK_N_CTX = 4096
THREADS = _common.LLAMA_THREADS
QUICK_PROMPT_CHARS = 400  # the tiny model reads one token per byte
LLAMA_SERVER_CACHE_MIB = 2048
EXAMPLE_CACHE_BYTES = 2 << 30
REQUEST_TIMEOUT_S = 900.0
BUILD_DIR = RESULTS_DIR / "llama-server-build"


@dataclass(frozen=True)
class Config:
    """One server configuration: its key on the command line and its label in the tables."""

    key: str
    label: str
    server: str  # "snapcache", "llama-server" or "example"
    options: tuple[str, ...] = ()


CONFIGS = [
    Config("snapcache-4", "snapcache serve --parallel 4", "snapcache", ("--parallel", "4")),
    Config("snapcache-4-exact", "snapcache serve --parallel 4 --batch-mode exact", "snapcache",
           ("--parallel", "4", "--batch-mode", "exact")),
    Config("snapcache-4-q8", "snapcache serve --parallel 4 --kv-cache q8_0", "snapcache",
           ("--parallel", "4", "--kv-cache", "q8_0")),
    Config("snapcache-4-inexact", "snapcache serve --parallel 4 --inexact", "snapcache",
           ("--parallel", "4", "--inexact")),
    Config("snapcache-1", "snapcache serve --parallel 1", "snapcache", ("--parallel", "1")),
    Config("llama-server", f"llama-server -np 4 --cache-ram {LLAMA_SERVER_CACHE_MIB}", "llama-server"),
    Config("example", "llama-cpp-python batched example server (4 sequences, disk cache)", "example"),
]
BY_KEY = {config.key: config for config in CONFIGS}
QUICK_SERVERS = ["snapcache-4", "snapcache-1"]


# -- llama-server ---------------------------------------------------------------------------------------


def _vendored_version() -> str:
    return metadata.version("llama-cpp-python")


def find_llama_server(
    explicit: Path | None, build: bool, say: Callable[[str], None]
) -> tuple[Path | None, str]:
    """The llama-server binary to run, and how it was found or built; (None, why) when there is none."""
    if explicit is not None:
        if explicit.is_file() and os.access(explicit, os.X_OK):
            return explicit, f"{explicit} (given)"
        return None, f"--llama-server {explicit} is not an executable file"
    built = BUILD_DIR / "bin" / "llama-server"
    version = _vendored_version()
    if built.is_file():
        where = built.relative_to(_common.ROOT)
        return built, f"{where} (built before from llama-cpp-python {version}'s llama.cpp)"
    if not build:
        return None, f"not built yet ({built.relative_to(_common.ROOT)}); run without --no-build to build it"
    source, how = _vendored_llama_cpp()
    if source is None:
        return None, how
    if shutil.which("cmake") is None:
        return None, "building llama-server needs cmake (not found on PATH)"
    sys.path.insert(0, str(_common.ROOT))
    from snapcache.llama.setup import build_flags

    flags = build_flags.chosen_cmake_args(os.environ, platform.machine(), build_flags.read_cpu_flags())
    say(f"building llama-server from {how} with {flags or 'the native build'} (about 10 minutes)...")
    configure = ["cmake", "-S", str(source), "-B", str(BUILD_DIR), "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", *flags.split()]
    jobs = str(os.cpu_count() or 2)
    for step in (configure, ["cmake", "--build", str(BUILD_DIR), "--target", "llama-server", "-j", jobs]):
        log = BUILD_DIR / "build.log"
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
        if proc.returncode != 0:
            return None, f"building llama-server failed (`{' '.join(step[:3])} ...`); see {log}"
    if not built.is_file():
        return None, f"the build finished without {built}"
    return built, f"{built.relative_to(_common.ROOT)} (built now from {how})"


def _vendored_llama_cpp() -> tuple[Path | None, str]:
    """vendor/llama.cpp of llama-cpp-python's source distribution, unpacked under benchmarks/results/."""
    source, how = fetch_sdist_part("vendor/llama.cpp")
    if source is None or not (source / "CMakeLists.txt").is_file():
        return None, f"no vendored llama.cpp to build: {how}"
    return source, f"the llama.cpp vendored in {how}"


# -- servers ---------------------------------------------------------------------------------------------


def launch_for(config: Config, model: Path, home: Path, n_ctx: int, binaries: dict[str, Path]) -> Launch:
    cache_dir = home / "cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    log = home / "server.log"
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if config.server == "llama-server":
        command = [str(binaries["llama-server"]), "-m", str(model), "-c", str(n_ctx), "-np", "4",
                   "--cache-ram", str(LLAMA_SERVER_CACHE_MIB), "-t", str(THREADS), "-tb", str(THREADS),
                   "--jinja", "--no-webui", *host]
        return Launch(command, cache_dir, env, port, log)
    if config.server == "example":
        settings = {
            "server": {"host": "127.0.0.1", "port": port},
            "model": {"path": str(model), "alias": "model", "n_ctx": n_ctx, "n_seq_max": 4,
                      "threads": THREADS, "threads_batch": THREADS},
            "disk_cache": {"path": str(cache_dir / "sequences"), "max_bytes": EXAMPLE_CACHE_BYTES},
        }
        config_path = home / "config.json"
        config_path.write_text(json.dumps(settings, indent=2), encoding="utf-8")
        command = [sys.executable, str(binaries["example"]), "-C", str(config_path)]
        return Launch(command, cache_dir, env, port, log)
    env["SNAPCACHE_DIR"] = str(cache_dir)
    command = [sys.executable, "-m", "snapcache", "--cache-dir", str(cache_dir), "serve", str(model), *host,
               "--n-ctx", str(n_ctx), "--threads", str(THREADS), *config.options]
    return Launch(command, cache_dir, env, port, log)


# -- the client -----------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One streamed answer: seconds from the burst's start to its first content and to its end, and
    where the server says the time to its first token went (its Server-Timing header, milliseconds
    by phase; empty from servers that send none)."""

    first_s: float
    last_s: float
    text: str
    tokens: int
    phases: dict[str, float] = field(default_factory=dict)
    second_s: float | None = None  # its second piece of content: the first generation step after


PHASES = ["queue", "restore", "read", "others-restore", "others-read", "save", "generate"]


def server_timing(header: str | None) -> dict[str, float]:
    """`Server-Timing: name;dur=ms, ...` as {name: ms} (entries without a duration left out)."""
    phases: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, _, duration = entry.strip().partition(";dur=")
        try:
            phases[name] = float(duration)
        except ValueError:
            continue
    return phases


def _ask(base: str, system: str, question: str, max_tokens: int, start: threading.Barrier) -> Answer:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=REQUEST_TIMEOUT_S, max_retries=0)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    start.wait()
    started = time.perf_counter()
    first: float | None = None
    second: float | None = None
    parts: list[str] = []
    chunks = 0
    usage_tokens: int | None = None
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="model", messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            # llama-cpp-python's routes sample with a repeat penalty of 1.1 unless told.
            extra_body={"repeat_penalty": 1.0},
        )
        phases = server_timing(raw.headers.get("server-timing"))
        for chunk in raw.parse():
            if chunk.usage is not None and chunk.usage.completion_tokens:
                usage_tokens = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter() - started
                elif second is None:
                    second = time.perf_counter() - started
                parts.append(chunk.choices[0].delta.content)
                chunks += 1
    finally:
        client.close()
    last = time.perf_counter() - started
    first_s = first if first is not None else last
    return Answer(first_s, last, "".join(parts), usage_tokens or chunks, phases, second)


def burst(base: str, asks: list[tuple[str, str]], max_tokens: int) -> list[Answer]:
    """All `asks` (system, question) sent at the same moment, each on its own connection."""
    start = threading.Barrier(len(asks))
    return _common.all_at_once([functools.partial(_ask, base, *ask, max_tokens, start) for ask in asks])


# -- one run of one server --------------------------------------------------------------------------------


@dataclass
class Run:
    """What one run of one server measured."""

    one_by_one_s: float = 0.0
    bursts: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (slowest first, last)
    # name -> the server's phases (ms) of the request whose first token came last, where it sent them
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    tokens_per_s: float = 0.0
    same_as_cold: int = 0
    start_s: list[float] = field(default_factory=list)


def run_server(config: Config, model: Path, systems: list[str], workdir: Path, tokens: int, n_ctx: int,
               binaries: dict[str, Path], say: Callable[[str], None]) -> Run:
    home = Path(tempfile.mkdtemp(prefix=f"{config.key}-", dir=workdir))
    launch = launch_for(config, model, home, n_ctx, binaries)
    run = Run()

    def measured(name: str, answers: list[Answer]) -> list[Answer]:
        run.bursts[name] = (max(a.first_s for a in answers), max(a.last_s for a in answers))
        slowest = max(answers, key=lambda a: a.first_s)
        if slowest.phases:
            step = (slowest.second_s - slowest.first_s) * 1000 if slowest.second_s is not None else 0.0
            run.phases[name] = {**slowest.phases, "first-step": step}
        say(f"{config.key}: {name}: slowest first token {run.bursts[name][0]:.2f} s, "
            f"last {run.bursts[name][1]:.2f} s")
        return answers

    def four(kind: str) -> list[tuple[str, str]]:
        return list(zip(systems, QUESTIONS[kind], strict=True))

    server = Server(launch)
    try:
        run.start_s.append(server.start())
        started = time.perf_counter()
        cold = [burst(server.base, [ask], tokens)[0] for ask in four("one_by_one")]
        run.one_by_one_s = time.perf_counter() - started
        measured("seen", burst(server.base, four("seen"), tokens))
        server.stop()
        run.start_s.append(server.start())
        again = measured("restart_same", burst(server.base, four("one_by_one"), tokens))
        run.same_as_cold = sum(a.text == c.text for a, c in zip(again, cold, strict=True))
        server.stop()
        run.start_s.append(server.start())
        measured("restart_new", burst(server.base, four("new"), tokens))
        eight = [(systems[i % 4], question) for i, question in enumerate(QUESTIONS["burst8"])]
        measured("burst8", burst(server.base, eight, tokens))
        answers = burst(server.base, four("throughput"), THROUGHPUT_TOKENS)
        window = max(a.last_s for a in answers) - min(a.first_s for a in answers)
        run.tokens_per_s = sum(a.tokens for a in answers) / window if window > 0 else 0.0
        say(f"{config.key}: {sum(a.tokens for a in answers)} tokens at {run.tokens_per_s:.1f} tokens/s")
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{server.log_tail()}") from exc
    finally:
        server.stop()
    return run


# -- tables -----------------------------------------------------------------------------------------------

BURSTS = [
    ("seen", "prompts seen"),
    ("restart_same", "after a restart, same questions"),
    ("restart_new", "after a restart, new questions"),
    ("burst8", "burst of 8, prompts seen"),
]


# The bursts whose slowest request's phases are tabled.
PHASED_BURSTS = {"seen": "prompts seen", "restart_same": "after a restart, same questions"}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def summarize(runs: list[Run]) -> dict[str, Any]:
    return {
        "one_by_one_s": _median([r.one_by_one_s for r in runs]),
        "bursts": {
            name: [_median([r.bursts[name][0] for r in runs]), _median([r.bursts[name][1] for r in runs])]
            for name, _ in BURSTS
        },
        "tokens_per_s": _median([r.tokens_per_s for r in runs]),
        "same_as_cold": min(r.same_as_cold for r in runs),
        "start_s": _median([s for r in runs for s in r.start_s]),
        "phases": {
            name: {phase: _median([r.phases[name].get(phase, 0.0) for r in runs]) for phase in
                   [*PHASES, "first-token", "first-step"]}
            for name in PHASED_BURSTS if all(name in r.phases for r in runs)
        },
    }


def build_tables(summaries: dict[str, dict[str, Any]], model_name: str, tokens: int, runs: int, n_ctx: int,
                 skipped: list[str]) -> list[Table]:
    bursts = Table(
        f"{model_name}: 4 agents at once (streamed, greedy, {tokens} tokens, {n_ctx // 1024}K context, "
        f"{THREADS} threads; "
        f"median of {runs}): slowest first token / last token of each burst",
        ["server", *[label for _, label in BURSTS], "tokens/s at 4", "= cold after restart"],
    )
    for key, summary in summaries.items():
        cells = [f"{fmt_seconds(first)} / {fmt_seconds(last)}" for first, last in
                 (summary["bursts"][name] for name, _ in BURSTS)]
        rate, same = f"{summary['tokens_per_s']:.1f}", f"{summary['same_as_cold']} of 4"
        bursts.add(BY_KEY[key].label, *cells, rate, same)
    bursts.notes.append(f"tokens/s at 4: a burst of four asking for {THROUGHPUT_TOKENS} tokens, the tokens "
                        "all four generated over the time from the burst's first token to its last")
    bursts.notes.append("= cold after restart: answers after the restart equal to the server's own first "
                        "(cold) answers, the worst run")
    bursts.notes.extend(skipped)
    tables = [bursts]
    phased = phase_table(summaries)
    peer = summaries.get("llama-server")
    if peer is None:
        return tables if phased is None else [*tables, phased]
    targets = Table(
        "Against llama-server -np 4 (targets of issue 35; ratio = snapcache / llama-server)",
        ["snapcache serve", "first token, seen (<= 1.5)", "last token, seen (<= 1.25)",
         "first token after restart, same (<= 0.2)", "first token after restart, new (<= 0.2)",
         "tokens/s at 4 (>= 0.8)"],
    )
    for key, summary in summaries.items():
        if not key.startswith("snapcache"):
            continue

        def ratio(name: str, index: int, limit: float, summary: dict[str, Any] = summary) -> str:
            mine, theirs = summary["bursts"][name][index], peer["bursts"][name][index]
            met = mine <= limit * theirs
            return f"{mine / theirs:.2f}x {'met' if met else 'missed'}" if theirs > 0 else "-"

        rate = summary["tokens_per_s"] / peer["tokens_per_s"] if peer["tokens_per_s"] else 0.0
        targets.add(
            BY_KEY[key].label.removeprefix("snapcache serve "),
            ratio("seen", 0, 1.5), ratio("seen", 1, 1.25), ratio("restart_same", 0, 0.2),
            ratio("restart_new", 0, 0.2), f"{rate:.2f}x {'met' if rate >= 0.8 else 'missed'}",
        )
    # The phases come last: pages quote the tables before them by their place.
    return [*tables, targets] if phased is None else [*tables, targets, phased]


def phase_table(summaries: dict[str, dict[str, Any]]) -> Table | None:
    """Where the slowest first token of a burst went, as the server's Server-Timing header says
    (snapcache's batched servers send it); None when no server sent one."""
    table = Table(
        "Where the slowest first token's time went, by the server's Server-Timing header (ms; "
        "median of runs)",
        ["server, burst", *PHASES, "first token (server)", "first step (client)"],
    )
    for key, summary in summaries.items():
        for name, label in PHASED_BURSTS.items():
            phases = summary.get("phases", {}).get(name)
            if phases is None:
                continue
            table.add(f"{BY_KEY[key].label.removeprefix('snapcache serve ')}, {label}",
                      *[f"{phases[phase]:.0f}" for phase in [*PHASES, "first-token", "first-step"]])
    if not table.rows:
        return None
    table.notes.append(
        "queue: waiting for a sequence, and for the steps before it was admitted; restore: its own "
        "restore; read: its own prompt read (the tokens after the restored prefix); others-restore, "
        "others-read: the other requests' restores and reads while it waited; save: states stored "
        "meanwhile; generate: generation steps meanwhile. first token (server): from the request's "
        "arrival at the scheduler to its first token; the client's figure above adds the HTTP side. "
        "first step (client): from that request's first piece of content to its second, as the client "
        "saw them (the first generation step after the burst's reads)")
    return table


# -- main -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", choices=list(BY_KEY), help="which servers (default: all; "
                        f"--quick: {' '.join(QUICK_SERVERS)})")
    parser.add_argument("--runs", type=int, default=2, help="runs per server (median)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per answer in the bursts")
    parser.add_argument("--llama-server", type=Path, help="a llama-server binary to run")
    parser.add_argument("--no-build", action="store_true", help="never build llama-server; skip it instead")
    args = parser.parse_args(argv)
    servers = args.servers or (QUICK_SERVERS if args.quick else list(BY_KEY))
    runs = 1 if args.quick else args.runs
    tokens = 8 if args.quick else args.tokens

    def say(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    skipped: list[str] = []
    binaries: dict[str, Path] = {}
    if "llama-server" in servers:
        binary, how = find_llama_server(args.llama_server, not (args.no_build or args.quick), say)
        if binary is None:
            skipped.append(f"llama-server skipped: {how}")
        else:
            binaries["llama-server"] = binary
            say(f"llama-server: {how}")
    if "example" in servers:
        script, how = fetch_example_server()
        if script is None:
            skipped.append(f"example server skipped: {how}")
        else:
            binaries["example"] = script
            say(f"example server: {how}")
    servers = [key for key in servers if BY_KEY[key].server == "snapcache" or BY_KEY[key].server in binaries]

    load_before = _load_line()
    started = time.perf_counter()
    measured: dict[str, list[Run]] = {key: [] for key in servers}
    with tempfile.TemporaryDirectory(prefix="serve-concurrency-") as scratch:
        workdir = Path(scratch)
        model, model_name = prepare_model(args.quick, workdir)
        texts = [(_common.BENCH_DIR / "prompts" / name).read_text(encoding="utf-8") for name in PROMPTS]
        systems = [text[:QUICK_PROMPT_CHARS] for text in texts] if args.quick else texts
        n_ctx = QUICK_N_CTX if args.quick else N_CTX
        for _ in range(runs):
            for key in list(measured):
                say(f"{BY_KEY[key].label}...")
                try:
                    measured[key].append(run_server(BY_KEY[key], model, systems, workdir, tokens, n_ctx,
                                                    binaries, say))
                except (RuntimeError, OSError) as exc:
                    skipped.append(f"{BY_KEY[key].label} failed and is left out: {str(exc).splitlines()[0]}")
                    print(exc, file=sys.stderr, flush=True)
                    del measured[key]
    elapsed = time.perf_counter() - started
    summaries = {key: summarize(done) for key, done in measured.items() if done}
    if not summaries:
        print("no server ran:", *skipped, sep="\n  ", file=sys.stderr)
        return 1
    tables = build_tables(summaries, model_name, tokens, runs, n_ctx, skipped)
    tables[0].notes.append(
        f"machine: {_common.machine_info()['cores']} usable cores; {load_before} before the run, "
        f"{_load_line()} after; {elapsed:.0f} s in all"
    )
    report("serve_concurrency", tables, args.json, quick=args.quick,
           extra={"model": model_name, "n_ctx": n_ctx, "threads": THREADS, "tokens": tokens,
                  "servers": {key: {"label": BY_KEY[key].label, **s} for key, s in summaries.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
