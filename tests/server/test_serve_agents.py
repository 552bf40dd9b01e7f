"""Claude Code and Codex, unchanged, from the npm registry, on `snapcache serve`.

`.ci/run` installs the pinned agents into `.agents` (`SNAPCACHE_AGENTS_DIR` names another npm
prefix); without them these tests skip. A real server process on a loopback port (its defaults,
answers capped at 8 tokens) serves a tiny llama (2 layers, 64 wide, random weights) that carries
Gemma-3-270M's vocabulary: the agents' prompts tokenize as on Gemma (about 19K tokens for Claude Code
2.1.197 with its 24 tools, 6K for Codex 0.171 with its 9) and are read in seconds. A recording proxy
between agent and server keeps every request and answer. Each agent runs three sessions, each a new
process with another question, in one fresh home and project folder (a user's, so the prompt's paths
are the same): the first reads its prompt, the second reads at most 10% of it afresh, and so does the
third after the server was killed and restarted. Claude Code's billing line changes every session;
the server drops it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_proxy import AgentProxy, Exchange
from server_process import ServerProcess, http_json, start_server, wait_until_written
from tiny_model import write_tiny_llama_with_vocabulary

pytestmark = [pytest.mark.model, pytest.mark.gemma, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent.parent
AGENTS_DIR = Path(os.environ.get("SNAPCACHE_AGENTS_DIR", ROOT / ".agents"))
N_CTX = 32768
# No call of the agents' tools fits in 8 tokens: a model of random weights cannot make them run one.
MAX_TOKENS = 8
AGENT_TIMEOUT_S = 600
# At most this share of a restored session's prompt is read afresh.
FRESH_SHARE = 0.10
BILLING_PREFIX = "x-anthropic-billing-header:"


def agent_bin(name: str) -> Path:
    return AGENTS_DIR / "node_modules" / ".bin" / name


@pytest.fixture(scope="module")
def agents() -> dict[str, Path]:
    bins = {name: agent_bin(name) for name in ("claude", "codex")}
    missing = [str(path) for path in bins.values() if not path.exists()]
    if missing or shutil.which("node") is None:
        pytest.skip(
            "Claude Code and Codex are not installed (.ci/run installs them from the npm registry "
            f"into .agents; SNAPCACHE_AGENTS_DIR names another npm prefix): missing {missing or 'node'}"
        )
    return bins


class AgentServer:
    """`snapcache serve` behind a recording proxy whose address stays the same across restarts."""

    def __init__(self, model: Path, home: Path) -> None:
        self.model, self.home, self.starts = model, home, 0
        self.server = self._start()
        self.proxy = AgentProxy(self.server.port, AGENT_TIMEOUT_S)
        threading.Thread(target=self.proxy.serve_forever, daemon=True).start()

    def _start(self) -> ServerProcess:
        self.starts += 1
        log = self.home / f"server-{self.starts}.log"
        # --n-ctx is the default's, and the model's own; Codex sets no cap on its answers.
        extra = ("--max-tokens-default", str(MAX_TOKENS))
        return start_server(self.model, self.home / "cache", log, *extra, n_ctx=N_CTX)

    def restart(self) -> None:
        """Kill the server once its snapshots are on disk, and start another on the same cache."""
        wait_until_written(self.server)
        self.server.kill()
        self.server = self._start()
        self.proxy.upstream_port = self.server.port

    def stats(self) -> dict[str, Any]:
        status, stats, _ = http_json("GET", f"{self.server.base_url}/snapcache/stats")
        assert status == 200, stats
        return dict(stats)

    def close(self) -> None:
        self.proxy.shutdown()
        self.proxy.server_close()
        self.server.kill(signal.SIGTERM)
        # What the agents sent and got, beside the server's logs, for a failure to be read.
        with (self.home / "exchanges.jsonl").open("w") as record:
            for e in self.proxy.exchanges:
                request = e.request.decode(errors="replace") if isinstance(e.request, bytes) else e.request
                line = {"method": e.method, "path": e.path, "status": e.status, "request": request}
                record.write(json.dumps({**line, "answer": e.answer.decode(errors="replace")}) + "\n")


@pytest.fixture(scope="module")
def served(
    agents: dict[str, Path], gemma_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentServer]:
    home = tmp_path_factory.mktemp("agents")
    model = write_tiny_llama_with_vocabulary(
        home / "tiny-large-vocabulary.gguf", gemma_model_path, n_ctx_train=N_CTX
    )
    server = AgentServer(model, home)
    try:
        yield server
    finally:
        server.close()


@dataclass(frozen=True, slots=True)
class Session:
    """One agent process: the usage it reported and the requests it made."""

    usage: dict[str, Any]
    exchanges: list[Exchange]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """Nothing of this machine's but PATH: a fresh HOME, no keys, no proxies."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **extra}


def run_agent(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=AGENT_TIMEOUT_S,
        check=False,
    )


def claude_session(claude: Path, served: AgentServer, home: Path, question: str) -> Session:
    """`claude -p QUESTION --output-format json` in `home` (a user's: the same for every session)."""
    env = clean_env(
        home,
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        ANTHROPIC_BASE_URL=served.proxy.base_url,
        ANTHROPIC_API_KEY="sk-ant-unused",
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(MAX_TOKENS),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    start = served.proxy.mark()
    done = run_agent([str(claude), "-p", question, "--output-format", "json"], env, home / "project")
    exchanges = served.proxy.since(start)
    # An answer cut at CLAUDE_CODE_MAX_OUTPUT_TOKENS is an error result (exit status 1), after
    # Claude Code asked again three times: a round trip all the same.
    assert done.returncode in (0, 1), (done.returncode, done.stdout, done.stderr, describe(exchanges))
    try:
        result = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"claude -p: no JSON result (exit {done.returncode}): {done.stdout!r} {done.stderr!r}")
    assert result["type"] == "result", result
    if done.returncode != 0:
        assert "output token maximum" in result["result"], result
    return Session(dict(result["usage"]), exchanges)


def codex_session(codex: Path, served: AgentServer, home: Path, question: str) -> Session:
    """`codex exec --json QUESTION` in `home`, with a provider on the server's Responses API."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "local"\n'
        'model_provider = "snapcache"\n'
        "check_for_update_on_startup = false\n\n"
        "[analytics]\n"
        "enabled = false\n\n"
        "[model_providers.snapcache]\n"
        'name = "snapcache"\n'
        f'base_url = "{served.proxy.base_url}/v1"\n'
        'wire_api = "responses"\n'
    )
    env = clean_env(home, CODEX_HOME=str(codex_home))
    command = [str(codex), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only"]
    start = served.proxy.mark()
    done = run_agent([*command, question], env, home / "project")
    exchanges = served.proxy.since(start)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr, describe(exchanges))
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e["type"] in ("turn.failed", "error")], events
    completed = [e for e in events if e["type"] == "turn.completed"]
    assert len(completed) == 1, events
    return Session(dict(completed[0]["usage"]), exchanges)


def describe(exchanges: list[Exchange]) -> str:
    return "; ".join(f"{e.method} {e.path} -> {e.status}" for e in exchanges) or "no requests"


def turns(session: Session, route: str) -> list[Exchange]:
    """The session's requests on `route` that carry its tools (its conversation's), all answered."""
    on_route = [e for e in session.exchanges if e.path.split("?")[0] == route]
    assert on_route, describe(session.exchanges)
    assert all(e.status == 200 for e in on_route), describe(session.exchanges)
    with_tools = [e for e in on_route if isinstance(e.request, dict) and e.request.get("tools")]
    assert with_tools, describe(session.exchanges)
    return with_tools


def messages_usage(exchange: Exchange) -> dict[str, int]:
    """The usage of a streamed /v1/messages answer: message_start's, then message_delta's."""
    usage: dict[str, int] = {}
    for event in exchange.events():
        if event["type"] == "message_start":
            usage.update(event["message"]["usage"])
        elif event["type"] == "message_delta":
            usage.update(event["usage"])
    assert usage, exchange.answer[-2000:]
    return usage


def responses_usage(exchange: Exchange) -> dict[str, Any]:
    """The usage of a streamed /v1/responses answer (its response.completed event)."""
    done = [e for e in exchange.events() if e["type"] in ("response.completed", "response.incomplete")]
    assert done, exchange.answer[-2000:]
    return dict(done[-1]["response"]["usage"])


def billing_line(exchange: Exchange) -> str:
    system = exchange.request["system"]
    first = system[0]["text"] if isinstance(system, list) else str(system)
    return str(first).splitlines()[0]


def test_claude_code_sessions_after_the_first_restore_their_prompt(
    agents: dict[str, Path], served: AgentServer, tmp_path: Path
) -> None:
    """Session 1, session 2 (a new process, another question), the server restarted, session 3."""
    questions = ["Which file holds the invoice?", "What is on my calendar today?", "Who wrote the report?"]
    sessions = []
    for n, question in enumerate(questions):
        if n == 2:
            served.restart()
        sessions.append(claude_session(agents["claude"], served, tmp_path / "user", question))

    openings, billing = [], set()
    for session in sessions:
        opening = turns(session, "/v1/messages")[0]
        assert opening.request["stream"] is True
        assert billing_line(opening).startswith(BILLING_PREFIX), billing_line(opening)
        billing.add(billing_line(opening))
        assert session.usage["output_tokens"] > 0, session.usage
        openings.append(messages_usage(opening))
    # The sessions' prompts start with billing lines of their own, which the server drops: were they
    # kept, nothing after them would be restored.
    assert len(billing) > 1, billing

    cold = openings[0]
    assert cold["input_tokens"] > 10_000, cold
    assert cold["cache_read_input_tokens"] <= FRESH_SHARE * cold["input_tokens"], cold
    for usage in openings[1:]:
        assert usage["input_tokens"] <= FRESH_SHARE * (
            usage["input_tokens"] + usage["cache_read_input_tokens"]
        )
    for session in sessions[1:]:
        # as Claude Code reports the session, every request of it together
        fresh, restored = session.usage["input_tokens"], session.usage["cache_read_input_tokens"]
        assert fresh <= FRESH_SHARE * (fresh + restored), session.usage
    assert served.stats()["scopes"]["default"]["restored_from_disk"] > 0


def test_codex_sessions_after_the_first_restore_their_prompt(
    agents: dict[str, Path], served: AgentServer, tmp_path: Path
) -> None:
    """Session 1, session 2 (a new process, another question), the server restarted, session 3."""
    questions = ["Which file holds the invoice?", "What is on my calendar today?", "Who wrote the report?"]
    sessions = []
    for n, question in enumerate(questions):
        if n == 2:
            served.restart()
        sessions.append(codex_session(agents["codex"], served, tmp_path / "user", question))

    for session in sessions:
        (opening,) = turns(session, "/v1/responses")
        assert opening.request["stream"] is True
        served_usage = responses_usage(opening)
        # Codex reports the server's usage as it is: input_tokens counts the cached ones too.
        assert session.usage["input_tokens"] == served_usage["input_tokens"], (session.usage, served_usage)
        cached = served_usage["input_tokens_details"]["cached_tokens"]
        assert session.usage["cached_input_tokens"] == cached, (session.usage, served_usage)
        assert 0 < session.usage["output_tokens"] <= MAX_TOKENS, session.usage

    first, *later = [session.usage for session in sessions]
    assert first["input_tokens"] > 2_000, first
    assert first["cached_input_tokens"] <= FRESH_SHARE * first["input_tokens"], first
    for usage in later:
        assert usage["input_tokens"] - usage["cached_input_tokens"] <= FRESH_SHARE * usage["input_tokens"], (
            usage
        )
    assert served.stats()["scopes"]["default"]["restored_from_disk"] > 0
