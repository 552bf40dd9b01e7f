"""Serving three agents over HTTP: `snapcache serve` against llama-cpp-python's servers, side by side.

Three agents with distinct system prompts of about 1,300 tokens (benchmarks/prompts/) ask short
questions over HTTP with the `openai` client: streamed, greedy (temperature 0, no repeat penalty),
8 tokens. Time to first token (TTFT) is the time until the first streamed chunk with content.

(a) restart: each agent asks once, the server is stopped (SIGTERM) and started again on the same
    cache directory, each agent asks a new question: TTFT after the restart.
(b) rotation: in one running server the agents take turns for two rounds: TTFT in round 2.

Every server runs as its own process on a free loopback port, with the same model file, context
size and threads, and a fresh cache directory per scenario:

- no cache: `python -m llama_cpp.server`;
- `llama_cpp.server` with `--cache true`, RAM and disk;
- the example server of llama-cpp-python's source distribution (examples/server/server.py) with its
  disk sequence cache, as configured by default, and with a client that stores each agent's system
  prefix itself (a `/v1/completions` request of the prefix tokens and max_tokens=0) before the agent
  first asks; the source distribution of the installed version is fetched with `pip download` into
  benchmarks/results/, and the columns are skipped, saying why, when that fails;
- `snapcache serve` one request at a time (`--parallel 1`), as it is and with each system prompt warmed
  by `POST /snapcache/warm`, and with `--parallel 4` (the batched path; requests come one at a time
  here, so each runs alone; several at once: `serve_concurrency.py`).

Gemma-3-270M's GGUF carries no chat template; every server reads a copy of it (written once into
benchmarks/results/) with Gemma 3's template, so that they all render the same prompt tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any

import _common
from _common import RESULTS_DIR, Table, choose_model, fmt_seconds, make_parser, report
from agent_rotation import AGENTS, MAX_TOKENS, _system_prompt

N_CTX = 4096
THREADS = _common.LLAMA_THREADS
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 600.0
QUICK_AGENTS = 2
# The example server's sequence cache: the README's example size; min_tokens is its default.
EXAMPLE_CACHE_BYTES = 1 << 30
# User messages that differ from their first character: what every chat with a system prompt
# shares is the tokens their renders have in common.
PROBE_QUESTIONS = ("Hello.", " What can you do?", "\n\n1 + 1 = ?", "¿Qué tal?")
TEMPLATE_CHECK_MESSAGES = [
    {"role": "system", "content": "You are the assistant of a bakery. Answer in one short line."},
    {"role": "user", "content": "  When do you open on Sundays?  "},
]


@dataclass(frozen=True)
class Column:
    """One server configuration: which server, which cache, and what the client does first."""

    key: str
    label: str
    server: str  # "llama_cpp.server", "example" or "snapcache"
    cache: str | None = None  # llama_cpp.server's --cache_type
    client_prefix: bool = False  # the client stores (example) or warms (snapcache) each system prompt
    parallel: int = 1  # snapcache serve --parallel


COLUMNS = [
    Column("none", "no cache", "llama_cpp.server"),
    Column("ram", "llama_cpp.server RAM", "llama_cpp.server", cache="ram"),
    Column("disk", "llama_cpp.server disk", "llama_cpp.server", cache="disk"),
    Column("example", "example server disk", "example"),
    Column("example-prefix", "example + client prefixes", "example", client_prefix=True),
    Column("snapcache", "snapcache serve", "snapcache"),
    Column("snapcache-warm", "snapcache serve + warm", "snapcache", client_prefix=True),
    Column("snapcache-batched", "snapcache serve --parallel 4", "snapcache", parallel=4),
]
BY_KEY = {column.key: column for column in COLUMNS}
PEERS = ("ram", "disk", "example")  # the peers as they come, for "the best peer"

# The step of each scenario whose time to first token is the one measured.
MEASURED = {"restart": "after restart", "rotation": "round 2"}


# -- the model file ------------------------------------------------------------------------------------


def prepare_model(quick: bool, workdir: Path) -> tuple[Path, str]:
    """The model file every server reads: the tiny model, or Gemma with Gemma 3's template in its GGUF."""
    model = choose_model(quick, workdir)
    if model.is_tiny:
        return model.path, model.name
    from snapcache.llama.templates.chat_templates import GEMMA3_TEMPLATE

    copy = RESULTS_DIR / f"{model.path.stem}.chat-template.gguf"
    print(f"  model: {copy.relative_to(_common.ROOT)} (a copy of {model.path.name} with Gemma 3's chat "
          "template in its GGUF)", file=sys.stderr, flush=True)
    _common.gguf_with_chat_template(model.path, copy, GEMMA3_TEMPLATE)
    _check_same_prompt(model.path, copy)
    return copy, model.name


def _check_same_prompt(original: Path, copy: Path) -> None:
    """Stop unless llama-cpp-python on the copy reads a chat as snapcache's loader does on the original."""
    import llama_cpp

    from snapcache import load_llama

    rendered = []
    for llm in (load_llama(original, n_ctx=512, n_threads=THREADS),
                llama_cpp.Llama(str(copy), n_ctx=512, n_threads=THREADS, n_threads_batch=THREADS,
                                verbose=False)):
        try:
            result = llm.create_chat_completion(messages=TEMPLATE_CHECK_MESSAGES, max_tokens=1,
                                                temperature=0.0)
            rendered.append(list(llm.input_ids[: result["usage"]["prompt_tokens"]]))
        finally:
            llm.close()
    if rendered[0] != rendered[1]:
        raise SystemExit(f"{copy.name} renders chats differently from snapcache's loader on {original.name}")


# -- the example server ----------------------------------------------------------------------------------


def fetch_sdist_part(part: str) -> tuple[Path | None, str]:
    """`part` (a folder of the installed llama-cpp-python's source distribution, e.g.
    "examples/server"), unpacked under benchmarks/results/ (the distribution fetched with `pip
    download` the first time); None and why where that fails."""
    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None, "llama-cpp-python is not installed"
    where = RESULTS_DIR / "llama-cpp-python-sdist"
    top = f"llama_cpp_python-{version}"
    folder = where / top / part
    if folder.is_dir():
        return folder, f"llama-cpp-python {version}, fetched before"
    archive = where / f"{top}.tar.gz"
    if not archive.exists():
        print(f"  fetching the llama-cpp-python {version} source distribution (pip download)...",
              file=sys.stderr, flush=True)
        command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                   "--quiet", f"llama-cpp-python=={version}", "-d", str(where)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            return None, f"`pip download llama-cpp-python=={version}` took more than 10 minutes"
        if proc.returncode != 0 or not archive.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"`pip download --no-binary :all: llama-cpp-python=={version}` failed: {last}"
    prefix = f"{top}/{part}/"
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            tar.extractall(where, members=members, filter="data")
    except (OSError, tarfile.TarError) as exc:
        return None, f"cannot unpack {archive.name}: {exc}"
    if not folder.is_dir():
        return None, f"{archive.name} has no {part}"
    return folder, f"llama-cpp-python {version}, fetched now"


def fetch_example_server() -> tuple[Path | None, str]:
    """examples/server/server.py of the installed llama-cpp-python's source distribution, or why not."""
    folder, how = fetch_sdist_part("examples/server")
    if folder is None:
        return None, how
    script = folder / "server.py"
    if not script.exists():
        return None, f"the source distribution has no examples/server/server.py ({how})"
    return script, f"{script.relative_to(_common.ROOT)} ({how})"


def missing_requirements(script: Path) -> list[str]:
    """The packages the script's inline metadata (`# /// script`) lists that are not installed."""
    block = re.search(r"^# /// script$(.*?)^# ///$", script.read_text(encoding="utf-8"), re.S | re.M)
    if block is None:
        return []
    names = re.findall(r'^#\s+"([A-Za-z0-9_.\-]+)', block.group(1), re.M)
    missing = []
    for name in names:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


# -- servers ----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Launch:
    """How to start one server: the command, its working directory and environment, its port."""

    command: list[str]
    cwd: Path
    env: dict[str, str]
    port: int
    log: Path


def launch_for(column: Column, model: Path, cache_dir: Path, example: Path | None) -> Launch:
    cache_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    log = cache_dir.parent / f"{cache_dir.name}.log"
    if column.server == "llama_cpp.server":
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", str(N_CTX),
                   "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS), "--host", "127.0.0.1",
                   "--port", str(port), "--verbose", "true"]
        if column.cache is not None:
            command += ["--cache", "true", "--cache_type", column.cache]
        # LlamaDiskCache keeps its files in .cache/llama_cache under the working directory.
        return Launch(command, cache_dir, env, port, log)
    if column.server == "example":
        assert example is not None
        config = {
            "server": {"host": "127.0.0.1", "port": port},
            "model": {"path": str(model), "alias": "model", "n_ctx": N_CTX, "threads": THREADS,
                      "threads_batch": THREADS},
            "disk_cache": {"path": str(cache_dir / "sequences"), "max_bytes": EXAMPLE_CACHE_BYTES},
        }
        config_path = cache_dir / "config.json"
        config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
        return Launch([sys.executable, str(example), "-C", str(config_path)], cache_dir, env, port, log)
    env["SNAPCACHE_DIR"] = str(cache_dir)
    # One request at a time, as the peers here, unless the column says otherwise: the answers are
    # compared, text for text, with the no-cache server's streams, which drop a character split across
    # tokens (the batched path keeps it).
    command = [sys.executable, "-m", "snapcache", "--cache-dir", str(cache_dir), "serve", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--n-ctx", str(N_CTX), "--threads", str(THREADS),
               "--parallel", str(column.parallel)]
    return Launch(command, cache_dir, env, port, log)


class Server:
    """A server process in its own process group; `stop` ends the group (SIGTERM, then SIGKILL)."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.base = f"http://127.0.0.1:{launch.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it and wait until GET /v1/models answers 200; the seconds that took."""
        started = time.perf_counter()
        with open(self.launch.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.launch.command, cwd=self.launch.cwd, env=self.launch.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        while time.perf_counter() - started < READY_TIMEOUT_S:
            if self.proc.poll() is not None:
                status = self.proc.returncode
                raise RuntimeError(f"the server exited with status {status}:\n{self.log_tail()}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(self.base + "/v1/models", timeout=5) as response:
                if response.status == 200:
                    return time.perf_counter() - started
            time.sleep(0.1)
        raise RuntimeError(f"the server was not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # Whatever the server started in its group goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def log_text(self) -> str:
        try:
            return self.launch.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


@contextlib.contextmanager
def running(launch: Launch, starts: list[float]) -> Iterator[Server]:
    server = Server(launch)
    try:
        starts.append(server.start())
        yield server
    finally:
        server.stop()


# -- the client -------------------------------------------------------------------------------------------


class HitCounter:
    """What the server restored for the last request, as far as it tells.

    snapcache serve: its X-Snapcache-Restored-Tokens and X-Snapcache-Source headers. The example
    server: a disk cache hit and the prompt tokens it read (its /metrics). llama_cpp.server with a
    cache: the cache hit it logs with verbose=True.
    """

    def __init__(self, column: Column, server: Server) -> None:
        self.column = column
        self.server = server
        self.before = self._counts()

    def _counts(self) -> tuple[int, int] | None:
        if self.column.server == "llama_cpp.server" and self.column.cache is not None:
            return self.server.log_text().count("Llama._create_completion: cache hit"), 0
        if self.column.server == "example":
            try:
                with urllib.request.urlopen(self.server.base + "/metrics", timeout=30) as response:
                    text = response.read().decode("utf-8", errors="replace")
            except OSError:
                return None
            hits = re.search(r"^batch_server:sequence_cache_hits_total (\d+)", text, re.M)
            read = re.search(r"^llamacpp:prompt_tokens_total (\d+)", text, re.M)
            if hits is None or read is None:
                return None
            return int(hits.group(1)), int(read.group(1))
        return None

    def after(self, headers: Any) -> str:
        if self.column.server == "snapcache":
            restored = headers.get("x-snapcache-restored-tokens")
            source = headers.get("x-snapcache-source")
            if restored is None:
                return "?"
            return f"{restored}" + (f" {source}" if source else "")
        now = self._counts()
        if now is None or self.before is None:
            return "-"
        hit = "hit" if now[0] > self.before[0] else "miss"
        if self.column.server == "example":
            return f"{hit}, read {now[1] - self.before[1]}"
        return hit


@dataclass
class Ask:
    scenario: str
    step: str
    agent: str
    question: str
    ttft_s: float | None = None
    turn_s: float = 0.0
    text: str = ""
    restored: str = "-"


def ask(server: Server, column: Column, ask_: Ask, system: str) -> Ask:
    """One streamed chat completion; fills in the times, the answer and what the server restored."""
    import openai

    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=REQUEST_TIMEOUT_S,
                           max_retries=0)
    counter = HitCounter(column, server)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": ask_.question}]
    started = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model="model", messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, stream=True,
        # llama_cpp.server samples with a repeat penalty of 1.1 unless told; the example server has none.
        extra_body={"repeat_penalty": 1.0},
    )
    parts = []
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            if ask_.ttft_s is None:
                ask_.ttft_s = time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
    ask_.turn_s = time.perf_counter() - started
    ask_.text = "".join(parts)
    ask_.restored = counter.after(raw.headers)
    client.close()
    return ask_


class SystemPrefixes:
    """What a client computes to store a system prompt itself: the tokens every chat with it begins with.

    It renders the chat template of the GGUF with a few different user messages, tokenizes the
    renders with the model's vocabulary (llama-cpp-python, vocab_only) and keeps their common tokens.
    """

    def __init__(self, model: Path) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
        vocab = self.llm._model  # the token texts of BOS and EOS, as Llama itself takes them
        self.formatter = Jinja2ChatFormatter(
            self.llm.metadata["tokenizer.chat_template"],
            eos_token=vocab.token_get_text(self.llm.token_eos()),
            bos_token=vocab.token_get_text(self.llm.token_bos()),
        )

    def tokens(self, system: str) -> list[int]:
        renders = []
        for question in PROBE_QUESTIONS:
            text = self.formatter(messages=[{"role": "system", "content": system},
                                            {"role": "user", "content": question}]).prompt
            renders.append(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        common = min(_common_prefix(renders[0], other) for other in renders[1:])
        return renders[0][:common]

    def close(self) -> None:
        self.llm.close()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def store_prefix(server: Server, column: Column, system: str, prefixes: SystemPrefixes | None) -> float:
    """The client stores (example server) or warms (snapcache) a system prompt; the seconds it took."""
    started = time.perf_counter()
    if column.server == "example":
        import openai

        assert prefixes is not None
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=REQUEST_TIMEOUT_S,
                               max_retries=0)
        client.completions.create(model="model", prompt=prefixes.tokens(system), max_tokens=0,
                                  temperature=0.0)
        client.close()
    else:
        body = json.dumps({"system": system, "priority": 10}).encode("utf-8")
        request = urllib.request.Request(server.base + "/snapcache/warm", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            response.read()
    return time.perf_counter() - started


# -- one column -------------------------------------------------------------------------------------------


@dataclass
class ColumnRun:
    column: Column
    asks: list[Ask] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    prefix_s: list[float] = field(default_factory=list)


def run_column(column: Column, model: Path, agents: list[str], quick: bool, tmp: Path,
               example: Path | None, prefixes: SystemPrefixes | None) -> ColumnRun:
    run = ColumnRun(column)
    systems = {agent: _system_prompt(agent, quick) for agent in agents}

    def turn(server: Server, scenario: str, step: str, question_index: int, first: bool = False) -> None:
        for agent in agents:
            if first and column.client_prefix:
                # The client meets the agent: it stores (or warms) the system prompt, then asks.
                run.prefix_s.append(store_prefix(server, column, systems[agent], prefixes))
            question = AGENTS[agent][1][question_index]
            run.asks.append(ask(server, column, Ask(scenario, step, agent, question), systems[agent]))

    # (a) restart: one question each, stop, start on the same cache directory, a new question each.
    restart_dir = tmp / f"{column.key}-restart"
    with running(launch_for(column, model, restart_dir, example), run.starts) as server:
        turn(server, "restart", "before", 0, first=True)
    with running(launch_for(column, model, restart_dir, example), run.starts) as server:
        turn(server, "restart", "after restart", 1)
    # (b) rotation: two rounds in one running server, on a fresh cache directory.
    with running(launch_for(column, model, tmp / f"{column.key}-rotation", example), run.starts) as server:
        turn(server, "rotation", "round 1", 0, first=True)
        turn(server, "rotation", "round 2", 1)
    return run


# -- tables -----------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def measured_mean(run: ColumnRun, scenario: str) -> float | None:
    return _mean([a.ttft_s for a in run.asks
                  if a.scenario == scenario and a.step == MEASURED[scenario] and a.ttft_s is not None])


def fmt_fraction(numerator: float | None, denominator: float | None) -> str:
    """`numerator / denominator` as "1/12.3" (or "1.8x" when numerator is the larger)."""
    if not numerator or not denominator:
        return "-"
    if numerator >= denominator:
        return f"{numerator / denominator:.1f}x"
    return f"1/{denominator / numerator:.1f}"


def build_tables(runs: dict[str, ColumnRun], agents: list[str], model_name: str,
                 skipped: list[str]) -> tuple[list[Table], dict[str, Any]]:
    keys = list(runs)
    labels = [runs[k].column.label for k in keys]
    cold = runs.get("none")

    summary = Table(
        f"Serving 3 agents over HTTP: mean time to first token ({model_name}, {THREADS} threads, "
        f"n_ctx {N_CTX}, streamed, greedy, max_tokens={MAX_TOKENS})"
        if len(agents) == 3 else
        f"Serving {len(agents)} agents over HTTP: mean time to first token ({model_name}, {THREADS} threads)",
        ["server", "restart: before", "restart: after", "rotation: round 1", "rotation: round 2",
         "answers = cold"],
    )
    equal: dict[str, int] = {}
    for key in keys:
        run = runs[key]

        def step_mean(scenario: str, step: str, run: ColumnRun = run) -> str:
            return fmt_seconds(_mean([a.ttft_s for a in run.asks
                                      if a.scenario == scenario and a.step == step and a.ttft_s is not None]))

        if cold is not None:
            equal[key] = sum(a.text == b.text for a, b in zip(cold.asks, run.asks, strict=True))
            answers = f"{equal[key]}/{len(run.asks)}"
        else:
            answers = "-"
        summary.add(run.column.label, step_mean("restart", "before"), step_mean("restart", "after restart"),
                    step_mean("rotation", "round 1"), step_mean("rotation", "round 2"), answers)
    summary.notes.append("answers = cold: greedy answers equal, text for text, to the no-cache server's "
                         "answers to the same questions")
    for key in keys:
        run = runs[key]
        starts = ", ".join(fmt_seconds(s) for s in run.starts)
        line = f"{run.column.label}: ready after {starts} (3 starts)"
        if run.prefix_s:
            line += f"; storing the system prompts took {', '.join(fmt_seconds(s) for s in run.prefix_s)}"
        summary.notes.append(line)
    summary.notes.extend(skipped)

    detail = Table("Time to first token per request", ["#", "scenario", "step", "agent", *labels])
    restored = Table("What each server restored per request", ["#", "scenario", "step", "agent", *labels])
    restored.notes.append(
        "snapcache serve: restored tokens and tier (its headers); example server: disk cache hit or miss and "
        "the prompt tokens it read (its /metrics); llama_cpp.server: the cache hits it logs; -: no report"
    )
    first = runs[keys[0]].asks
    for i, request in enumerate(first):
        cells = [str(i + 1), request.scenario, request.step, request.agent]
        detail.add(*cells, *[fmt_seconds(runs[k].asks[i].ttft_s) for k in keys])
        restored.add(*cells, *[runs[k].asks[i].restored for k in keys])

    checks = Table("Targets (measured side by side in this run)",
                   ["comparison", "snapcache", "other", "ratio", "target", "met"])
    ratios: dict[str, float | None] = {}

    def check(name: str, mine: str, other: str, scenario: str, limit: float | None, target: str) -> None:
        if mine not in runs or other not in runs:
            return
        a, b = measured_mean(runs[mine], scenario), measured_mean(runs[other], scenario)
        ratio = a / b if a and b else None
        ratios[name] = ratio
        met = "-" if limit is None or ratio is None else ("yes" if ratio <= limit else "no")
        checks.add(name, fmt_seconds(a), fmt_seconds(b), fmt_fraction(a, b), target, met)

    peers = {k: measured_mean(runs[k], "restart") for k in PEERS if k in runs}
    peers = {k: v for k, v in peers.items() if v is not None}
    best_peer = min(peers, key=lambda k: peers[k]) if peers else None
    check("restart: snapcache serve / no cache", "snapcache", "none", "restart", 0.1, "≤ 1/10")
    check("restart: snapcache serve --parallel 4 / no cache", "snapcache-batched", "none", "restart", 0.1,
          "≤ 1/10")
    if best_peer is not None:
        check(f"restart: snapcache serve / best peer ({runs[best_peer].column.label})", "snapcache",
              best_peer, "restart", 0.5, "≤ 1/2")
    check("restart: snapcache serve / example + client prefixes", "snapcache", "example-prefix", "restart",
          1.0, "< 1 (aim)")
    check("restart: snapcache serve + warm / example + client prefixes", "snapcache-warm", "example-prefix",
          "restart", 1.0, "< 1 (aim)")
    check("rotation round 2: snapcache serve / llama_cpp.server RAM", "snapcache", "ram", "rotation", 0.1,
          "≤ 1/10")
    check("rotation round 2: snapcache serve / example + client prefixes", "snapcache", "example-prefix",
          "rotation", 1.0, "< 1 (aim)")
    if not checks.rows:
        checks.add("(no snapcache column ran)", "-", "-", "-", "-", "-")
    payload = {
        "columns": {k: runs[k].column.label for k in keys},
        "requests": {k: [vars(a) for a in runs[k].asks] for k in keys},
        "server_starts_s": {k: runs[k].starts for k in keys},
        "prefix_store_s": {k: runs[k].prefix_s for k in keys},
        "answers_equal_to_cold": equal,
        "ratios": ratios,
        "skipped": skipped,
    }
    return [summary, detail, restored, checks], payload


# -- main -------------------------------------------------------------------------------------------------


def _load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def available_columns(wanted: list[str], say: Callable[[str], None]) -> tuple[list[Column], Path | None,
                                                                              list[str]]:
    """The columns that can run here, the example server's script, and a line for each one skipped."""
    columns = [BY_KEY[key] for key in wanted]
    skipped: list[str] = []
    example: Path | None = None
    if any(c.server == "llama_cpp.server" for c in columns) and util.find_spec("uvicorn") is None:
        skipped.append("llama_cpp.server columns skipped: pip install 'llama-cpp-python[server]'")
        columns = [c for c in columns if c.server != "llama_cpp.server"]
    if any(c.server == "example" for c in columns):
        example, how = fetch_example_server()
        if example is None:
            skipped.append(f"example server columns skipped: {how}")
        else:
            say(f"example server: {how}")
            missing = missing_requirements(example)
            if missing:
                skipped.append(f"example server columns skipped: it imports {', '.join(missing)}, "
                               f"not installed here (pip install {' '.join(missing)})")
                example = None
        if example is None:
            columns = [c for c in columns if c.server != "example"]
    if any(c.server == "snapcache" for c in columns) and util.find_spec("snapcache.server") is None:
        skipped.append("snapcache serve columns skipped: this snapcache has no server (snapcache.server)")
        columns = [c for c in columns if c.server != "snapcache"]
    return columns, example, skipped


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", choices=list(BY_KEY), default=list(BY_KEY),
                        help="which server configurations to run (default: all)")
    args = parser.parse_args(argv)
    if "none" not in args.servers:
        args.servers.insert(0, "none")  # the cold answers every other column is checked against
    agents = list(AGENTS)[:QUICK_AGENTS] if args.quick else list(AGENTS)
    if util.find_spec("openai") is None:
        print("serve_vs_peers.py asks the servers with the openai client: pip install openai",
              file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    load_before = _load_line()
    started = time.perf_counter()
    columns, example, skipped = available_columns(args.servers, say)
    for line in skipped:
        print(line, flush=True)
    runs: dict[str, ColumnRun] = {}
    with tempfile.TemporaryDirectory(prefix="snapcache-serve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        model, model_name = prepare_model(args.quick, tmp)
        prefixes = SystemPrefixes(model) if any(c.key == "example-prefix" for c in columns) else None
        try:
            for column in columns:
                say(f"{column.label}: restart and rotation...")
                try:
                    runs[column.key] = run_column(column, model, agents, args.quick, tmp, example, prefixes)
                except (RuntimeError, OSError) as exc:
                    if column.key == "none":
                        raise
                    message = f"{column.label} failed and is left out: {exc}"
                    skipped.append(message.splitlines()[0])
                    print(message, file=sys.stderr, flush=True)
        finally:
            if prefixes is not None:
                prefixes.close()
    elapsed = time.perf_counter() - started
    if "none" not in runs:
        print("the no-cache server did not run: nothing to compare", file=sys.stderr)
        return 1

    tables, payload = build_tables(runs, agents, model_name, skipped)
    tables[0].notes.append(
        f"machine: {_common.machine_info()['cores']} usable cores, shared; {load_before} before the run, "
        f"{_load_line()} after; {elapsed:.0f} s in all"
    )
    report("serve_vs_peers", tables, args.json, quick=args.quick,
           extra={"model": model_name, "n_ctx": N_CTX, "threads": THREADS, "agents": agents, **payload})
    return 0


if __name__ == "__main__":
    sys.exit(main())
