"""A day of agent traffic: sessions that grow a main chat, hand work to sub-agents and come back.

    python benchmarks/agent_day.py [--quick] [--sessions 2 4] [--servers ...] [--json PATH]
                                   [--llama-server PATH] [--no-build]

N sessions at once (--sessions), each in phases that all sessions run together:

1. three main turns: a short system prompt, then a user turn of about 1,000 Gemma tokens per turn,
   each answered (the chat goes on with a fixed assistant line, so that every server reads the same
   prompts whatever the model says);
2. two sub-agent chats per session, all at once: the same system prompt, a user message of about
   1,300 tokens each;
3. the return: each main chat with one more user turn.

Run twice per server, each time on a fresh cache: straight through, and with the server restarted
between the sub-agents and the return. A run's time is its wall time from the first request to the
last answer, restart included. A return counts as restored when the server reused at least 90% of
the prompt tokens its session's last main turn sent (`usage.prompt_tokens_details.cached_tokens`;
llama-server's `timings.cache_n`). After the first run, one cold prompt of about 8,192 new tokens,
answered with 1 token: its prompt tokens over the request's time, restore-point captures included.

The servers, all reading the same GGUF (Gemma with Gemma 3's chat template in it), 2 threads:
`snapcache serve --parallel N` (its sliding-window cache the window's size, as llama.cpp sizes it),
the same with `--swa-cache full` (a cell per position, as llama-cpp-python sizes it), and
`llama-server -np N --cache-ram 2048` built from the llama.cpp llama-cpp-python vendors (see
serve_concurrency.py). Greedy answers of 32 tokens.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import _common
from _common import Table, fmt_seconds, make_parser, prompt_paragraphs, report, text_of_tokens
from serve_concurrency import LLAMA_SERVER_CACHE_MIB, THREADS, find_llama_server
from serve_vs_peers import Launch, Server, _free_port, _load_line, prepare_model

SYSTEM = "You are a coding agent working in a large repository. Keep answers short."
TURN_TOKENS, SUB_AGENT_TOKENS, PROBE_TOKENS = 1000, 1300, 8192
MAIN_TURNS, SUB_AGENTS = 3, 2
ANSWER_TOKENS = 32
SEQ_CTX = 12288  # per sequence: the main chat's ~4.3K tokens, and the 8K probe
QUICK = {"turn": 60, "sub": 80, "probe": 300, "answer": 4, "seq_ctx": 2048}
RESTORED_SHARE = 0.9
REQUEST_TIMEOUT_S = 900.0


KINDS = ["snapcache", "snapcache-full", "llama-server"]


@dataclass(frozen=True)
class Config:
    """One server configuration: its kind (one of KINDS), for N sessions."""

    kind: str
    sessions: int

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.sessions}"

    @property
    def server(self) -> str:
        return "llama-server" if self.kind == "llama-server" else "snapcache"

    @property
    def label(self) -> str:
        n = self.sessions
        if self.kind == "llama-server":
            return f"llama-server -np {n} --cache-ram {LLAMA_SERVER_CACHE_MIB}"
        return f"snapcache serve --parallel {n}" + (
            " --swa-cache full" if self.kind == "snapcache-full" else ""
        )

    @property
    def options(self) -> tuple[str, ...]:
        full = ("--swa-cache", "full") if self.kind == "snapcache-full" else ()
        return ("--parallel", str(self.sessions), *full)


def launch_for(config: Config, model: Path, home: Path, seq_ctx: int, binaries: dict[str, Path]) -> Launch:
    cache_dir = home / "cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "SNAPCACHE_DIR": str(cache_dir)}
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if config.server == "llama-server":
        # -c is the whole cache, shared by the -np slots: each gets as much as a snapcache sequence.
        command = [
            str(binaries["llama-server"]),
            "-m",
            str(model),
            "-c",
            str(seq_ctx * config.sessions),
            "-np",
            str(config.sessions),
            "--cache-ram",
            str(LLAMA_SERVER_CACHE_MIB),
            "-t",
            str(THREADS),
            "-tb",
            str(THREADS),
            "--jinja",
            "--no-webui",
            *host,
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "snapcache",
            "--cache-dir",
            str(cache_dir),
            "serve",
            str(model),
            *host,
            "--n-ctx",
            str(seq_ctx),
            "--threads",
            str(THREADS),
            *config.options,
        ]
    return Launch(command, cache_dir, env, port, home / "server.log")


# -- the work ------------------------------------------------------------------------------------------


@dataclass
class Texts:
    """Every user message of a run, by session: its main turns, its sub-agents' messages."""

    turns: list[list[str]]
    sub_agents: list[list[str]]
    probe: str


def make_texts(model: Path, sessions: int, sizes: dict[str, int]) -> Texts:
    """User messages of the sizes asked, in Gemma tokens, from the benchmark's prompt paragraphs;
    each begins with its own label, so that no two share more than the chat's system part."""
    import llama_cpp

    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    try:
        pieces = prompt_paragraphs()
        start = 0

        def text(label: str, n_tokens: int) -> str:
            nonlocal start
            start += 3
            return f"{label} " + text_of_tokens(vocab, pieces, n_tokens, start=start)

        turns = [
            [text(f"Session {s}, turn {t}.", sizes["turn"]) for t in range(MAIN_TURNS + 1)]
            for s in range(sessions)
        ]
        subs = [
            [text(f"Sub-agent {a} of session {s}.", sizes["sub"]) for a in range(SUB_AGENTS)]
            for s in range(sessions)
        ]
        probe = text("A new task, read once.", sizes["probe"])
    finally:
        vocab.close()
    return Texts(turns, subs, probe)


def main_chat(texts: Texts, session: int, turns: int) -> list[dict[str, str]]:
    """Session `session`'s main chat with its first `turns` user turns (each earlier one answered)."""
    chat = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        if turn:
            chat.append({"role": "assistant", "content": f"Done with step {turn}. What next?"})
        chat.append({"role": "user", "content": texts.turns[session][turn]})
    return chat


@dataclass
class Answered:
    prompt_tokens: int
    cached_tokens: int
    seconds: float


def ask(base: str, messages: list[dict[str, str]], max_tokens: int) -> Answered:
    body = {
        "model": "model",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # llama-cpp-python's routes sample with a repeat penalty of 1.1 unless told.
        "repeat_penalty": 1.0,
    }
    request = urllib.request.Request(
        base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"HTTP {exc.code}: {exc.read()[:300]!r}") from None
    seconds = time.perf_counter() - started
    usage = answer.get("usage") or {}
    timings = answer.get("timings") or {}
    cached = timings.get("cache_n")
    if cached is None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Answered(int(usage.get("prompt_tokens", 0)), int(cached), seconds)


def at_once(base: str, chats: list[list[dict[str, str]]], max_tokens: int) -> list[Answered]:
    """Every chat sent at the same moment, each on its own connection."""
    return _common.all_at_once([functools.partial(ask, base, chat, max_tokens) for chat in chats])


@dataclass
class Run:
    seconds: float = 0.0
    restart_s: float = 0.0  # of `seconds`: the server's stop and start
    returns: list[tuple[int, int, int]] = field(default_factory=list)  # (cached, prompt, last main prompt)
    probe: Answered | None = None

    @property
    def all_restored(self) -> bool:
        return all(cached >= RESTORED_SHARE * before for cached, _, before in self.returns)


def day(
    config: Config,
    launch: Launch,
    texts: Texts,
    answer_tokens: int,
    restart: bool,
    say: Callable[[str], None],
) -> Run:
    """One run of the day on a fresh server; the server restarted before the returns if `restart`."""
    n = config.sessions
    run = Run()
    server = Server(launch)
    try:
        server.start()
        started = time.perf_counter()
        last_main: list[Answered] = []
        for turn in range(1, MAIN_TURNS + 1):
            last_main = at_once(server.base, [main_chat(texts, s, turn) for s in range(n)], answer_tokens)
        subs = [
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}]
            for s in range(n)
            for message in texts.sub_agents[s]
        ]
        at_once(server.base, subs, answer_tokens)
        if restart:
            stopping = time.perf_counter()
            server.stop()
            server.start()
            run.restart_s = time.perf_counter() - stopping
        back = at_once(server.base, [main_chat(texts, s, MAIN_TURNS + 1) for s in range(n)], answer_tokens)
        run.seconds = time.perf_counter() - started
        run.returns = [
            (b.cached_tokens, b.prompt_tokens, m.prompt_tokens) for b, m in zip(back, last_main, strict=True)
        ]
        say(
            f"{config.key}{' restarted' if restart else ''}: {run.seconds:.1f} s, returns restored "
            + ", ".join(f"{c} of {p}" for c, p, _ in run.returns)
        )
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{server.log_tail()}") from exc
    finally:
        server.stop()
    return run


def probe(launch: Launch, texts: Texts) -> Answered:
    """One cold prompt of new text on a fresh server, answered with 1 token."""
    server = Server(launch)
    try:
        server.start()
        return ask(server.base, [{"role": "user", "content": texts.probe}], 1)
    finally:
        server.stop()


# -- tables --------------------------------------------------------------------------------------------


def build_tables(
    results: dict[str, tuple[Config, Run, Run]], model_name: str, answer_tokens: int, skipped: list[str]
) -> list[Table]:
    runs = Table(
        f"{model_name}, {THREADS} threads: N sessions at once, {MAIN_TURNS} main turns, "
        f"{SUB_AGENTS} sub-agents each, then the return to the main chat",
        [
            "server",
            "run time",
            "returns restored (tokens)",
            "run time, restart before the returns (the restart)",
            "returns restored after the restart",
            "cold prompt read (tok/s)",
        ],
    )
    for config, straight, restarted in results.values():
        rate = "-"
        if straight.probe is not None and straight.probe.seconds > 0:
            rate = f"{straight.probe.prompt_tokens / straight.probe.seconds:.0f}"
        runs.add(
            config.label,
            fmt_seconds(straight.seconds),
            _returns(straight),
            f"{fmt_seconds(restarted.seconds)} ({fmt_seconds(restarted.restart_s)})",
            _returns(restarted),
            rate,
        )
    runs.notes.append(
        f"returns restored: prompt tokens the server reused of each return's prompt; "
        f"'all' when each reused at least {RESTORED_SHARE:.0%} of its session's last main "
        "turn's prompt"
    )
    runs.notes.append(
        f"answers: greedy, {answer_tokens} tokens; run time: the first request to the last answer, "
        "a restart included"
    )
    runs.notes.append(
        "cold prompt read: a prompt of new text after the run, answered with 1 token, on a fresh "
        "server: its prompt tokens over the request's time"
    )
    runs.notes.extend(skipped)
    tables = [runs]
    ratios = Table(
        "Against llama-server -np N (ratio = snapcache / llama-server; the target in brackets)",
        [
            "snapcache serve",
            "every return restored",
            "run time (<= 1.0)",
            "run time with the restart (<= 0.6)",
            "cold prompt read (>= 0.9)",
        ],
    )
    for config, straight, restarted in results.values():
        peer = results.get(f"llama-server-{config.sessions}")
        if config.server != "snapcache" or peer is None:
            continue
        _, peer_straight, peer_restarted = peer
        restored = "yes" if straight.all_restored and restarted.all_restored else "no"
        ratios.add(
            config.label.removeprefix("snapcache serve "),
            restored,
            _ratio(straight.seconds, peer_straight.seconds, 1.0, below=True),
            _ratio(restarted.seconds, peer_restarted.seconds, 0.6, below=True),
            _ratio(_rate(straight.probe), _rate(peer_straight.probe), 0.9, below=False),
        )
    if ratios.rows:
        tables.append(ratios)
    return tables


def _returns(run: Run) -> str:
    cells = ", ".join(f"{cached:,} of {prompt:,}" for cached, prompt, _ in run.returns)
    return f"{'all' if run.all_restored else 'NOT all'}: {cells}"


def _rate(answered: Answered | None) -> float:
    return answered.prompt_tokens / answered.seconds if answered is not None and answered.seconds > 0 else 0.0


def _ratio(mine: float, theirs: float, limit: float, *, below: bool) -> str:
    if not mine or not theirs:
        return "-"
    ratio = mine / theirs
    met = ratio <= limit if below else ratio >= limit
    return f"{ratio:.2f}x {'met' if met else 'missed'}"


# -- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions", type=int, nargs="+", default=[2, 4], help="sessions at once, one run each"
    )
    parser.add_argument("--servers", nargs="+", choices=KINDS, default=KINDS, help="which servers")
    parser.add_argument("--llama-server", type=Path, help="a llama-server binary to run")
    parser.add_argument("--no-build", action="store_true", help="never build llama-server; skip it instead")
    args = parser.parse_args(argv)
    sessions = [2] if args.quick else args.sessions
    sizes = (
        QUICK
        if args.quick
        else {
            "turn": TURN_TOKENS,
            "sub": SUB_AGENT_TOKENS,
            "probe": PROBE_TOKENS,
            "answer": ANSWER_TOKENS,
            "seq_ctx": SEQ_CTX,
        }
    )

    def say(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    skipped: list[str] = []
    binaries: dict[str, Path] = {}
    wanted = [Config(kind, n) for n in sessions for kind in KINDS if kind in args.servers]
    if any(c.server == "llama-server" for c in wanted):
        binary, how = find_llama_server(args.llama_server, not (args.no_build or args.quick), say)
        if binary is None:
            skipped.append(f"llama-server skipped: {how}")
            wanted = [c for c in wanted if c.server != "llama-server"]
        else:
            binaries["llama-server"] = binary
            say(f"llama-server: {how}")

    load_before = _load_line()
    started = time.perf_counter()
    results: dict[str, tuple[Config, Run, Run]] = {}
    with tempfile.TemporaryDirectory(prefix="agent-day-") as scratch:
        workdir = Path(scratch)
        model, model_name = prepare_model(args.quick, workdir)
        texts = make_texts(model, max(sessions), sizes)
        for config in wanted:
            say(f"{config.label}...")
            try:
                straight, restarted = (
                    day(
                        config,
                        launch_for(
                            config, model, Path(tempfile.mkdtemp(dir=workdir)), sizes["seq_ctx"], binaries
                        ),
                        texts,
                        sizes["answer"],
                        restart,
                        say,
                    )
                    for restart in (False, True)
                )
                straight.probe = probe(
                    launch_for(
                        config, model, Path(tempfile.mkdtemp(dir=workdir)), sizes["seq_ctx"], binaries
                    ),
                    texts,
                )
                say(
                    f"{config.key}: cold read of {straight.probe.prompt_tokens} tokens in "
                    f"{straight.probe.seconds:.2f} s"
                )
                results[config.key] = (config, straight, restarted)
            except (RuntimeError, OSError) as exc:
                skipped.append(f"{config.label} failed and is left out: {str(exc).splitlines()[0]}")
                print(exc, file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    if not results:
        print("no server ran:", *skipped, sep="\n  ", file=sys.stderr)
        return 1
    tables = build_tables(results, model_name, sizes["answer"], skipped)
    tables[0].notes.append(
        f"machine: {_common.machine_info()['cores']} usable cores; {load_before} before the "
        f"run, {_load_line()} after; {elapsed:.0f} s in all"
    )
    report(
        "agent_day",
        tables,
        args.json,
        quick=args.quick,
        extra={
            "model": model_name,
            "threads": THREADS,
            "sizes": sizes,
            "runs": {
                key: {
                    "label": c.label,
                    "sessions": c.sessions,
                    "seconds": [s.seconds, r.seconds],
                    "restart_s": r.restart_s,
                    "returns": [s.returns, r.returns],
                    "probe": None if s.probe is None else [s.probe.prompt_tokens, s.probe.seconds],
                }
                for key, (c, s, r) in results.items()
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
