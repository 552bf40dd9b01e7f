"""An agent's tool loop, session after session and across a restart: what each request reads afresh.

    python benchmarks/agent_loop.py [--quick] [--servers snapcache llama-server]
        [--dialects chat responses messages] [--sessions 3] [--turns 3] [--after-restart 2]
        [--max-tokens 48] [--parallel N] [--no-tools] [--llama-server PATH] [--no-build] [--json PATH]

One agent: a long system prompt (benchmarks/prompts/bookkeeper.txt, about 1.5K Gemma tokens) and
three function tools, asked over each dialect with its own SDK: Chat Completions and Responses with
the `openai` client, Messages with the `anthropic` one. Greedy, at most --max-tokens tokens an answer,
not streamed. A session of --turns requests: the first asks a question with the tools required; each
tool call that comes back is answered with a fixed result and the session asks again (tools `auto`);
an answer without a call is kept as the assistant's text and followed by a fixed user line, so that
the conversation goes on the same whatever the model says. Then a new session: the same system prompt
and tools, another question. --sessions sessions, the server restarted (snapcache serve on the same
cache directory, once its snapshots are on disk; llama-server as a user restarts it), then
--after-restart sessions more. Each (server, dialect) runs on its own fresh server and cache.

Per request: the prompt tokens and those the server restored, as its answer's usage says
(`usage.prompt_tokens_details.cached_tokens`, `usage.input_tokens_details.cached_tokens`,
`usage.cache_read_input_tokens`: the same fields on both servers), the tokens read afresh, their share
of the prompt, and the request's time. The targets: every request after a session's first reads at
most 10% of its prompt afresh, and so does a new session's first request (the head, system prompt and
tools, restored; only the new question read), after the restart too.

The servers read the same GGUF on 2 threads (Gemma-3-270M with Gemma 3's chat template in it, as
serve_concurrency.py prepares it), with an 8K context: `snapcache serve` at its defaults otherwise,
and `llama-server --jinja --cache-ram 2048` built from the llama.cpp llama-cpp-python vendors
(serve_concurrency.py's `find_llama_server`), which answers all three dialects.

--parallel N: snapcache serve's --parallel (default: its own, 4); --no-tools: the same sessions without
tools (each turn an answer and the fixed user line), the head being the system prompt alone.

--quick: snapcache serve alone on the test suite's tiny llama (random weights, a byte per token),
the system prompt cut to 600 characters, 2 sessions, a restart, 1 session more.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
from _common import BENCH_DIR, Table, fmt_seconds, make_parser, report
from agents_vs_llama_server import wait_until_written
from serve_concurrency import LLAMA_SERVER_CACHE_MIB, THREADS, find_llama_server
from serve_vs_peers import Launch, Server, _free_port, _load_line, prepare_model

SYSTEM_FILE = BENCH_DIR / "prompts" / "bookkeeper.txt"
QUICK_SYSTEM_CHARS = 600  # the tiny model reads one token per byte
N_CTX, QUICK_N_CTX = 8192, 4096
MAX_TOKENS = 48
QUICK_MAX_TOKENS = 128  # a byte a token: room for a whole call of a tool
FRESH_SHARE_TARGET = 0.10
REQUEST_TIMEOUT_S = 900.0
TOOLS = [
    ("find_invoice", "Look up a supplier invoice by its number.",
     {"number": {"type": "string", "maxLength": 12}}),
    ("list_payments", "List the payments of one month from the bank account.",
     {"month": {"type": "string", "maxLength": 7}}),
    ("send_reminder", "Send a payment reminder to a customer who has not paid.",
     {"customer": {"type": "string", "maxLength": 24}}),
]
RESULTS = {
    "find_invoice": "Invoice INV-2041 from Millstone Flour: 1,240.00 EUR, due 30 November, unpaid.",
    "list_payments": "3 payments: 2 Nov 410.00 EUR rent; 9 Nov 95.50 EUR electricity; "
                     "17 Nov 1,200.00 EUR flour.",
    "send_reminder": "Reminder queued; it goes out tomorrow at 09:00.",
}
GO_ON = "Go on, and use the tools where they help."
QUESTIONS = [
    "Has the Millstone Flour invoice INV-2041 been paid yet?",
    "What did we pay out of the bank account in November?",
    "The Corner Cafe still owes us for October. Can you chase them?",
    "Which supplier invoices are due before the end of the month?",
    "Did the electricity bill for November go out of the account?",
    "Remind the Hotel Aurora about their unpaid catering invoice.",
]
DIALECTS = {"chat": "Chat Completions", "responses": "Responses", "messages": "Anthropic Messages"}
SERVERS = {"snapcache": "snapcache serve", "llama-server": "llama-server"}


def launch_for(
    server: str, model: Path, home: Path, n_ctx: int, llama_server: Path | None, parallel: int | None = None
) -> Launch:
    cache_dir = home / "cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "SNAPCACHE_DIR": str(cache_dir)}
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if server == "llama-server":
        assert llama_server is not None
        command = [str(llama_server), "-m", str(model), "-c", str(n_ctx), "-t", str(THREADS), "-tb",
                   str(THREADS), "--jinja", "--cache-ram", str(LLAMA_SERVER_CACHE_MIB), "--no-webui", *host]
    else:
        command = [sys.executable, "-m", "snapcache", "--cache-dir", str(cache_dir), "serve", str(model),
                   *host, "--n-ctx", str(n_ctx), "--threads", str(THREADS)]
        command += ["--parallel", str(parallel)] if parallel is not None else []
    return Launch(command, cache_dir, env, port, home / "server.log")


def server_label(server: str, n_ctx: int, parallel: int | None = None) -> str:
    if server == "llama-server":
        return f"llama-server --jinja -c {n_ctx} --cache-ram {LLAMA_SERVER_CACHE_MIB} -t {THREADS}"
    given = f" --parallel {parallel}" if parallel is not None else ""
    return f"snapcache serve --n-ctx {n_ctx} --threads {THREADS}{given}"


# -- one conversation in each dialect ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request's answer says: prompt tokens, those restored, the tool calls (id, name)."""

    prompt_tokens: int
    cached_tokens: int
    calls: list[tuple[str, str]]


class Conversation:
    """One session's messages in one dialect: ask, then carry the answer and what follows it."""

    def __init__(
        self, dialect: str, base: str, system: str, question: str, max_tokens: int, tools: bool = True
    ) -> None:
        self.dialect, self.system, self.max_tokens, self.tools = dialect, system, max_tokens, tools
        if dialect == "messages":
            import anthropic

            self.client: Any = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0,
                                                   timeout=REQUEST_TIMEOUT_S)
        else:
            import openai

            self.client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                                        timeout=REQUEST_TIMEOUT_S)
        self.history: list[dict[str, Any]] = [{"role": "user", "content": question}]

    def ask(self, required: bool) -> Answer:
        """One request with the history so far; the answer and what follows it join the history."""
        ask = {"chat": self._chat, "responses": self._responses, "messages": self._messages}[self.dialect]
        return ask(required)

    def _chat(self, required: bool) -> Answer:
        tools = [{"type": "function", "function": tool} for tool in _tools("parameters")]
        offered = {"tools": tools, "tool_choice": "required" if required else "auto"} if self.tools else {}
        answer = self.client.chat.completions.create(
            model="model", messages=[{"role": "system", "content": self.system}, *self.history],
            max_tokens=self.max_tokens, temperature=0.0, **offered)
        message = answer.choices[0].message
        calls = [(c.id, c.function.name) for c in message.tool_calls or [] if c.type == "function"]
        if calls:
            self.history.append({"role": "assistant", "content": message.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                              "arguments": c.function.arguments}}
                for c in message.tool_calls or [] if c.type == "function"]})
            self.history += [{"role": "tool", "tool_call_id": i, "content": _result(n)} for i, n in calls]
        else:
            self.history += [{"role": "assistant", "content": message.content or ""},
                             {"role": "user", "content": GO_ON}]
        usage = answer.usage
        details = usage.prompt_tokens_details if usage else None
        cached = details.cached_tokens if details and details.cached_tokens is not None else None
        if cached is None:  # llama-server's own count, where its usage has none
            cached = ((answer.model_extra or {}).get("timings") or {}).get("cache_n", 0)
        return Answer(usage.prompt_tokens if usage else 0, int(cached), calls)

    def _responses(self, required: bool) -> Answer:
        tools = [{"type": "function", **tool, "strict": False} for tool in _tools("parameters")]
        offered = {"tools": tools, "tool_choice": "required" if required else "auto"} if self.tools else {}
        answer = self.client.responses.create(
            model="model", instructions=self.system, input=self.history, max_output_tokens=self.max_tokens,
            temperature=0.0, **offered)
        items = [item for item in answer.output if item.type == "function_call"]
        calls = [(item.call_id, item.name) for item in items]
        if calls:
            for item in items:
                self.history.append({"type": "function_call", "call_id": item.call_id, "name": item.name,
                                     "arguments": item.arguments})
            self.history += [{"type": "function_call_output", "call_id": i, "output": _result(n)}
                             for i, n in calls]
        else:
            text = [{"type": "output_text", "text": answer.output_text or ""}]
            self.history += [{"type": "message", "role": "assistant", "content": text},
                             {"role": "user", "content": GO_ON}]
        usage = answer.usage
        cached = usage.input_tokens_details.cached_tokens if usage and usage.input_tokens_details else 0
        return Answer(usage.input_tokens if usage else 0, int(cached or 0), calls)

    def _messages(self, required: bool) -> Answer:
        offered = {"tools": _tools("input_schema"), "tool_choice": {"type": "any" if required else "auto"}}
        answer = self.client.messages.create(
            model="model", system=self.system, messages=self.history, max_tokens=self.max_tokens,
            extra_body={"temperature": 0.0},  # this SDK no longer names it
            **(offered if self.tools else {}))
        content: list[dict[str, Any]] = []
        calls = []
        for block in answer.content:
            if block.type == "text":
                content.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
                calls.append((block.id, block.name))
        content = content or [{"type": "text", "text": "(no answer)"}]
        self.history.append({"role": "assistant", "content": content})
        results = [{"type": "tool_result", "tool_use_id": i, "content": _result(n)} for i, n in calls]
        self.history.append({"role": "user", "content": results or GO_ON})
        # input_tokens: read afresh; the prompt is those and the tokens read from (or written to) the cache.
        usage = answer.usage
        cached = usage.cache_read_input_tokens or 0
        prompt = usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0)
        return Answer(prompt, cached, calls)

    def close(self) -> None:
        self.client.close()


def _tools(schema_key: str) -> list[dict[str, Any]]:
    """The tools as a dialect names them: `schema_key` holds each one's JSON schema."""
    return [{"name": name, "description": text,
             schema_key: {"type": "object", "properties": properties, "required": list(properties)}}
            for name, text, properties in TOOLS]


def _result(name: str) -> str:
    return RESULTS.get(name, f"There is no tool called {name}.")


# -- one server, one dialect --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One measured request."""

    server: str
    dialect: str
    session: int
    turn: int
    after_restart: bool
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    tool_calls: int

    @property
    def afresh(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def share(self) -> float:
        return self.afresh / self.prompt_tokens if self.prompt_tokens else 1.0


def question(number: int) -> str:
    text = QUESTIONS[(number - 1) % len(QUESTIONS)]
    return text if number <= len(QUESTIONS) else f"{text} (ticket {number})"


def run_dialect(server_key: str, dialect: str, launch: Launch, system: str, plan: tuple[int, int, int],
                max_tokens: int, say: Callable[[str], None], tools: bool = True) -> list[Request]:
    """`plan` = (sessions, turns, sessions after the restart) on one fresh server."""
    sessions, turns, after = plan
    server = Server(launch)
    requests: list[Request] = []
    try:
        server.start()
        for number in range(1, sessions + after + 1):
            restarted = number > sessions
            if number == sessions + 1:
                if server_key == "snapcache":
                    wait_until_written(server.base)
                server.stop()
                say(f"{server_key} / {dialect}: restarted in {server.start():.1f} s")
            chat = Conversation(dialect, server.base, system, question(number), max_tokens, tools)
            try:
                for turn in range(1, turns + 1):
                    started = time.perf_counter()
                    answer = chat.ask(required=turn == 1)
                    seconds = time.perf_counter() - started
                    requests.append(Request(server_key, dialect, number, turn, restarted,
                                            answer.prompt_tokens, answer.cached_tokens, seconds,
                                            len(answer.calls)))
            finally:
                chat.close()
            mine = requests[-turns:]
            say(f"{server_key} / {dialect}: session {number}: read afresh "
                + ", ".join(f"{r.afresh:,} of {r.prompt_tokens:,}" for r in mine)
                + f"; {sum(r.tool_calls > 0 for r in mine)} of {turns} with a tool call")
    except Exception as exc:  # the SDKs' errors and a server that failed: this pair is left out
        raise RuntimeError(f"{exc!r}\n{server.log_tail()}") from exc
    finally:
        server.stop()
    return requests


# -- tables -------------------------------------------------------------------------------------------


def _joined(values: list[str]) -> str:
    return " / ".join(values)


def _share(share: float, target: bool = True) -> str:
    met = " met" if share <= FRESH_SHARE_TARGET else " missed"
    return f"{share:.1%}" + (met if target else "")


def build_tables(requests: list[Request], model_name: str, max_tokens: int, turns: int,
                 notes: list[str]) -> list[Table]:
    pairs = list(dict.fromkeys((r.server, r.dialect) for r in requests))
    targets = Table(
        f"{model_name}: what an agent's requests read afresh (targets: at most {FRESH_SHARE_TARGET:.0%} "
        "of the prompt for a new session's first request and every request after a session's first)",
        ["server", "dialect", "requests (how many)", "prompt tokens", "read afresh", "afresh", "slowest"],
    )
    groups: list[tuple[str, bool, Callable[[Request], bool]]] = [
        ("session 1, first request, cold", False, lambda r: r.session == 1 and r.turn == 1),
        ("a new session's first request", True,
         lambda r: r.session > 1 and r.turn == 1 and not r.after_restart),
        ("after the restart, a session's first request", True, lambda r: r.turn == 1 and r.after_restart),
        ("every request after a session's first", True, lambda r: r.turn > 1),
    ]
    for server, dialect in pairs:
        mine = [r for r in requests if (r.server, r.dialect) == (server, dialect)]
        for label, target, chosen in groups:
            group = [r for r in mine if chosen(r)]
            if not group:
                continue
            worst = max(group, key=lambda r: r.share)
            targets.add(SERVERS[server], DIALECTS[dialect], f"{label} ({len(group)})",
                        f"{worst.prompt_tokens:,}", f"{worst.afresh:,}", _share(worst.share, target),
                        fmt_seconds(max(r.seconds for r in group)))
    targets.notes.extend([
        "prompt tokens, read afresh, afresh: of the request of the group that read the largest share of "
        "its prompt afresh, as its answer's usage says (prompt tokens less those restored from the cache); "
        "slowest: the group's slowest request, answer included",
        "a new session's first request holds the head (system prompt and tools) and a new question: at most "
        f"{FRESH_SHARE_TARGET:.0%} afresh is the head restored",
        *notes,
    ])
    numbers = " / ".join(str(turn) for turn in range(1, turns + 1))
    sessions = Table(
        f"Each session, turn by turn (greedy, at most {max_tokens} tokens an answer; turn 1 requires a tool "
        "call, later turns send the tools' results)",
        ["server", "dialect", "session", *(f"{what}, turns {numbers}" for what in
                                           ("prompt tokens", "read afresh", "afresh", "time")), "tool calls"],
    )
    for server, dialect in pairs:
        mine = [r for r in requests if (r.server, r.dialect) == (server, dialect)]
        for number in dict.fromkeys(r.session for r in mine):
            rows = [r for r in mine if r.session == number]
            label = f"{number}" + (" (after the restart)" if rows[0].after_restart else "")
            sessions.add(SERVERS[server], DIALECTS[dialect], label,
                         _joined([f"{r.prompt_tokens:,}" for r in rows]),
                         _joined([f"{r.afresh:,}" for r in rows]),
                         _joined([_share(r.share, False) for r in rows]),
                         _joined([fmt_seconds(r.seconds) for r in rows]),
                         f"{sum(r.tool_calls > 0 for r in rows)} of {len(rows)}")
    sessions.notes.append("tool calls: the session's answers that called a tool; an answer without one is "
                          f"followed by the user line {GO_ON!r}")
    return [targets, sessions]


# -- main ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS),
                        help="which servers (default: both; --quick: snapcache)")
    parser.add_argument("--dialects", nargs="+", choices=list(DIALECTS), default=list(DIALECTS),
                        help="which HTTP dialects (default: all three)")
    parser.add_argument("--sessions", type=int, help="sessions before the restart (default 3; --quick: 2)")
    parser.add_argument("--turns", type=int, default=3, help="requests a session (default 3)")
    parser.add_argument("--after-restart", type=int,
                        help="sessions after the restart (default 2; --quick: 1)")
    parser.add_argument("--max-tokens", type=int, help=f"tokens an answer may have (default {MAX_TOKENS}; "
                        f"--quick: {QUICK_MAX_TOKENS})")
    parser.add_argument("--parallel", type=int, help="snapcache serve's --parallel (default: its own)")
    parser.add_argument("--no-tools", action="store_true", help="sessions without tools")
    parser.add_argument("--llama-server", type=Path, help="a llama-server binary to run")
    parser.add_argument("--no-build", action="store_true", help="never build llama-server; skip it instead")
    args = parser.parse_args(argv)
    servers = args.servers or (["snapcache"] if args.quick else list(SERVERS))
    plan = (args.sessions or (2 if args.quick else 3), args.turns,
            args.after_restart if args.after_restart is not None else (1 if args.quick else 2))
    max_tokens = args.max_tokens or (QUICK_MAX_TOKENS if args.quick else MAX_TOKENS)
    n_ctx = QUICK_N_CTX if args.quick else N_CTX

    def say(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    notes: list[str] = []
    llama_server: Path | None = None
    if "llama-server" in servers:
        llama_server, how = find_llama_server(args.llama_server, not (args.no_build or args.quick), say)
        if llama_server is None:
            notes.append(f"llama-server skipped: {how}")
            servers = [s for s in servers if s != "llama-server"]
        else:
            say(f"llama-server: {how}")
    if not servers:
        print("no server to run:", *notes, sep="\n  ", file=sys.stderr)
        return 1

    system = SYSTEM_FILE.read_text(encoding="utf-8").strip()
    if args.quick:
        system = system[:QUICK_SYSTEM_CHARS]
    load_before = _load_line()
    started = time.perf_counter()
    requests: list[Request] = []
    with tempfile.TemporaryDirectory(prefix="agent-loop-") as scratch:
        workdir = Path(scratch)
        model, model_name = prepare_model(args.quick, workdir)
        for server in servers:
            for dialect in args.dialects:
                say(f"{SERVERS[server]}, {DIALECTS[dialect]}...")
                home = Path(tempfile.mkdtemp(prefix=f"{server}-{dialect}-", dir=workdir))
                try:
                    launch = launch_for(server, model, home, n_ctx, llama_server, args.parallel)
                    requests += run_dialect(server, dialect, launch, system, plan, max_tokens, say,
                                            tools=not args.no_tools)
                except RuntimeError as exc:
                    notes.append(f"{SERVERS[server]} over {DIALECTS[dialect]} failed and is left out: "
                                 f"{str(exc).splitlines()[0][:300]}")
                    print(exc, file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    if not requests:
        print("no request was answered:", *notes, sep="\n  ", file=sys.stderr)
        return 1
    labels = {key: server_label(key, n_ctx, args.parallel) for key in servers}
    notes += [f"{SERVERS[key]}: {label}" for key, label in labels.items()]
    notes.append(f"machine: {_common.machine_info()['cores']} usable cores; {load_before} before the run, "
                 f"{_load_line()} after; {elapsed:.0f} s in all")
    tables = build_tables(requests, model_name, max_tokens, args.turns, notes)
    report("agent_loop", tables, args.json, quick=args.quick, extra={
        "model": model_name, "threads": THREADS, "n_ctx": n_ctx, "max_tokens": max_tokens,
        "sessions": plan[0], "turns": plan[1], "sessions_after_restart": plan[2],
        "system_prompt": f"{SYSTEM_FILE.relative_to(_common.ROOT)} ({len(system):,} characters)",
        "servers": labels, "dialects": args.dialects, "tools": not args.no_tools,
        "requests": [{**asdict(r), "afresh": r.afresh, "share": round(r.share, 4)} for r in requests],
    })
    return 0 if not any("failed" in note for note in notes) else 1


if __name__ == "__main__":
    sys.exit(main())
