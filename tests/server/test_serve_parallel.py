"""`snapcache serve --parallel N`: several requests at once on one model, each restored from the cache.

Real server processes on loopback ports, driven by the real `openai` client, on the tiny model.
Answers are compared with those of a `--parallel 1` server (today's one-at-a-time path), each asked
in a scope of its own so that it runs from cold.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, http_json, running_server, start_server, wait_until_written

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

MAX_TOKENS = 16
QUESTIONS = tuple(
    f"Question {i}: where is the {word}?" for i, word in enumerate(["fox", "dog", "cat", "owl", "bee", "elk"])
)
# System prompts of different lengths: the tiny model's answers differ with them.
SYSTEMS = tuple(f"You are agent number {i}. " + SYSTEM[: 120 + 41 * i] for i in range(4))
EOS_TOKEN = 2  # the tiny model's </s>
_fresh = itertools.count()


@dataclass(frozen=True)
class Answer:
    """One chat turn as a client saw it."""

    text: str
    completion_tokens: int
    cached_tokens: int
    source: str
    restored_tokens: int
    finish_reason: str | None
    timing: dict[str, float] | None = None  # Server-Timing: phase -> milliseconds

    @property
    def reply(self) -> tuple[str, int]:
        return self.text, self.completion_tokens


def ask(
    server: ServerProcess,
    question: str,
    *,
    scope: str,
    system: str = SYSTEM,
    stream: bool = True,
    **args: Any,
) -> Answer:
    """One greedy chat turn of `MAX_TOKENS` tokens (unless `args` say otherwise)."""
    api = openai.OpenAI(
        base_url=server.api_url,
        api_key="unused",
        max_retries=0,
        default_headers={"X-Snapcache-Scope": scope},
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    args = {"model": "m", "messages": messages, "temperature": 0, **args}
    if "max_completion_tokens" not in args:
        args.setdefault("max_tokens", MAX_TOKENS)
    if not stream:
        raw = api.chat.completions.with_raw_response.create(**args)
        result = raw.parse()
        choice, usage = result.choices[0], result.usage
        text, finish = choice.message.content or "", choice.finish_reason
    else:
        raw = api.chat.completions.with_raw_response.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
        text, finish, usage = "", None, None
        for chunk in raw.parse():
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None, "the stream asked for usage and got none"
    headers = raw.headers
    return Answer(
        text,
        usage.completion_tokens,
        usage.prompt_tokens_details.cached_tokens,
        headers["x-snapcache-source"],
        int(headers["x-snapcache-restored-tokens"]),
        finish,
        _server_timing(headers.get("server-timing")),
    )


def _server_timing(header: str | None) -> dict[str, float] | None:
    if header is None:
        return None
    entries = [entry.strip().split(";dur=") for entry in header.split(",")]
    return {name: float(milliseconds) for name, milliseconds in entries}


def at_once(calls: list[Any]) -> list[Answer]:
    """Run the calls (functions of no argument) from one thread each, started together."""
    start = threading.Barrier(len(calls))

    def run(call: Any) -> Answer:
        start.wait()
        return call()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def cold(single: ServerProcess, question: str, **kwargs: Any) -> Answer:
    """The answer of the one-at-a-time server, from cold (a scope of its own)."""
    answer = ask(single, question, scope=f"cold-{next(_fresh)}", **kwargs)
    assert answer.cached_tokens == 0
    return answer


def fresh(name: str) -> str:
    return f"{name}-{next(_fresh)}"


def stats(server: ServerProcess) -> dict[str, Any]:
    status, document, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
    assert status == 200
    return dict(document)


@pytest.fixture(scope="module")
def single(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("single")
    with running_server(tiny_model_path, home / "cache", home / "log.txt", "--parallel", "1") as server:
        yield server


@pytest.fixture(scope="module")
def batched(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("batched")
    with running_server(tiny_model_path, home / "cache", home / "log.txt", "--parallel", "4") as server:
        yield server


@pytest.fixture(scope="module")
def exact(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("exact")
    with running_server(
        tiny_model_path, home / "cache", home / "log.txt", "--parallel", "4", "--batch-mode", "exact"
    ) as server:
        yield server


def test_four_concurrent_streams_all_get_complete_answers(batched: ServerProcess) -> None:
    assert stats(batched)["parallel"] == {"sequences": 4, "mode": "batched", "running": 0, "waiting": 0}
    scope = fresh("four")
    answers = at_once([lambda q=q: ask(batched, q, scope=scope) for q in QUESTIONS[:4]])
    for answer in answers:
        assert answer.finish_reason in {"stop", "length"}
        assert answer.completion_tokens >= MAX_TOKENS or answer.finish_reason == "stop"
        assert answer.text
    # One reads the shared system prompt; the others wait for it to be read, then copy its cells
    # from that request's sequence (or restore what it saved).
    sources = sorted(a.source for a in answers)
    assert sources[-1] == "none"
    assert set(sources[:3]) <= {"context", "ram"}
    assert sum(a.cached_tokens >= 64 for a in answers) == 3
    assert stats(batched)["scopes"][scope]["requests"] == 4
    # Each says where its time to the first token went (Server-Timing, milliseconds).
    phases = {"queue", "restore", "read", "others-restore", "others-read", "save", "generate", "first-token"}
    for answer in answers:
        assert answer.timing is not None
        assert set(answer.timing) == phases
        assert answer.timing["read"] > 0
        spent = sum(ms for name, ms in answer.timing.items() if name != "first-token")
        assert spent <= answer.timing["first-token"] + 0.2  # each rounded to 0.1 ms
    waited = [a.timing["queue"] + a.timing["others-read"] for a in answers if a.timing is not None]
    assert max(waited) > 0  # a prompt is read alone: the last one's first token waited
    with urllib.request.urlopen(f"{batched.base_url}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert 'snapcache_first_token_phase_seconds_count{phase="read"}' in metrics


def test_exact_mode_answers_each_request_as_if_it_ran_alone(
    exact: ServerProcess, single: ServerProcess
) -> None:
    scope = fresh("exact")
    answers = at_once([lambda s=s: ask(exact, QUESTIONS[0], scope=scope, system=s) for s in SYSTEMS])
    expected = [cold(single, QUESTIONS[0], system=s).reply for s in SYSTEMS]
    assert [a.reply for a in answers] == expected
    assert len(set(expected)) > 1, "the questions should get different answers"


def test_a_request_alone_answers_as_the_cold_single_sequence_run(
    batched: ServerProcess, single: ServerProcess
) -> None:
    scope = fresh("alone")
    first = ask(batched, QUESTIONS[0], scope=scope, stream=False)
    second = ask(batched, QUESTIONS[1], scope=scope)
    assert (first.source, first.cached_tokens) == ("none", 0)
    assert second.source == "context"  # the sequence the first left holds its prompt
    assert second.cached_tokens >= 64
    assert second.restored_tokens >= second.cached_tokens
    assert first.reply == cold(single, QUESTIONS[0], stream=False).reply
    assert second.reply == cold(single, QUESTIONS[1]).reply


def test_scopes_stay_isolated_when_their_requests_run_at_once(batched: ServerProcess) -> None:
    a, b, c = fresh("agent-a"), fresh("agent-b"), fresh("agent-c")
    assert ask(batched, QUESTIONS[0], scope=a).source == "none"
    answers = at_once(
        [
            lambda: ask(batched, QUESTIONS[1], scope=a),
            lambda: ask(batched, QUESTIONS[2], scope=b),
            lambda: ask(batched, QUESTIONS[3], scope=c, stream=False),
        ]
    )
    assert answers[0].source == "context"
    assert answers[0].cached_tokens >= 64
    assert [(x.source, x.cached_tokens) for x in answers[1:]] == [("none", 0), ("none", 0)]
    again = at_once(
        [lambda: ask(batched, QUESTIONS[4], scope=b), lambda: ask(batched, QUESTIONS[4], scope=c)]
    )
    assert all(x.source == "context" and x.cached_tokens >= 64 for x in again)
    status, why, _ = http_json("GET", f"{batched.base_url}/snapcache/why?scope={b}")
    assert status == 200
    assert why["restored_tokens"] == again[0].restored_tokens
    scopes = stats(batched)["scopes"]
    assert [(scopes[s]["requests"], scopes[s]["misses"]) for s in (a, b, c)] == [(2, 1), (2, 1), (2, 1)]


def test_a_state_warmed_over_http_serves_a_batched_request(batched: ServerProcess) -> None:
    scope = fresh("warmed")
    body = json.dumps({"system": SYSTEM, "scope": scope}).encode()
    status, report, _ = http_json("POST", f"{batched.base_url}/snapcache/warm", body)
    assert status == 200, report
    assert report["token_count"] >= 64
    answer = ask(batched, QUESTIONS[0], scope=scope)
    assert answer.source == "ram"
    assert answer.cached_tokens >= report["token_count"] - 1


def test_a_client_gone_mid_stream_frees_its_sequence(batched: ServerProcess) -> None:
    api = openai.OpenAI(base_url=batched.api_url, api_key="unused", max_retries=0)
    streams = []
    for question in QUESTIONS[:4]:
        stream = api.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": question}],
            max_tokens=1500,
            logit_bias={str(EOS_TOKEN): -100},  # no early end: only the disconnect stops it
            temperature=0,
            stream=True,
        )
        next(iter(stream))
        streams.append(stream)
    assert stats(batched)["parallel"]["running"] == 4
    for stream in streams:
        stream.close()
    # The four answers would take about 8 s to the end on 2 cores: their sequences go long before.
    deadline = time.monotonic() + 3
    while stats(batched)["parallel"]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats(batched)["parallel"]["running"] == 0, "a closed stream kept its sequence"
    started = time.monotonic()
    answers = at_once([lambda q=q: ask(batched, q, scope="after-gone") for q in QUESTIONS[:4]])
    assert all(a.completion_tokens > 0 for a in answers)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("which", ["batched", "single"])
def test_a_one_at_a_time_stream_whose_client_goes_gives_the_model_back(
    batched: ServerProcess, single: ServerProcess, which: str
) -> None:
    """A stream on the Llama's own context (mirostat takes it with --parallel 4; every request does
    with --parallel 1) whose client goes: its reader, llama-cpp-python's event publisher, never
    closes it. It used to keep the context until a garbage collection (a warm then waited for ever)
    and to save its state whenever that came; now it ends at its next token and saves then."""
    server = {"batched": batched, "single": single}[which]
    scope = fresh("gone-one-at-a-time")
    api = openai.OpenAI(
        base_url=server.api_url, api_key="unused", max_retries=0, default_headers={"X-Snapcache-Scope": scope}
    )
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[2]}]
    stream = api.chat.completions.create(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=1500,
        temperature=0,
        stream=True,
        extra_body={"logit_bias": {str(EOS_TOKEN): -100}, "mirostat_mode": 2},
    )
    next(iter(stream))
    stream.close()
    started = time.monotonic()
    body = json.dumps({"system": SYSTEMS[3], "scope": fresh("after-gone")}).encode()
    status, report, _ = http_json("POST", f"{server.base_url}/snapcache/warm", body, timeout=60)
    assert status == 200, report
    # 1,500 tokens take the one-sequence path about 20 s here; a stream that ends at once, well under.
    assert time.monotonic() - started < 10
    # What the stream read was saved when it ended, and answers as a cold read does.
    again = ask(server, QUESTIONS[2], scope=scope, stream=False)
    assert again.cached_tokens >= 64
    assert again.reply == cold(single, QUESTIONS[2], stream=False).reply


def test_a_burst_larger_than_the_sequences_queues_and_every_request_is_answered(
    batched: ServerProcess,
) -> None:
    scope = fresh("burst")
    calls = [
        lambda q=q, s=i % 2 == 0: ask(batched, q, scope=scope, stream=s) for i, q in enumerate(QUESTIONS * 2)
    ]
    answers = at_once(calls)
    assert len(answers) == 12
    assert all(a.text and a.finish_reason in {"stop", "length"} for a in answers)
    # The same question gets the same answer whichever turn it waited for, but for batching's drift.
    assert sum(a.cached_tokens >= 64 for a in answers) >= 8
    assert stats(batched)["parallel"]["waiting"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_max_completion_tokens_caps_the_answer(
    batched: ServerProcess, single: ServerProcess, stream: bool
) -> None:
    capped = ask(batched, QUESTIONS[5], scope=fresh("cap"), stream=stream, max_completion_tokens=4)
    assert capped.finish_reason == "length"
    assert capped.completion_tokens <= 4 + 3  # a UTF-8 character may take a few tokens more, as alone
    assert capped.reply == cold(single, QUESTIONS[5], stream=stream, max_completion_tokens=4).reply
    assert (
        ask(batched, QUESTIONS[5], scope=fresh("cap"), stream=stream).completion_tokens
        > capped.completion_tokens
    )


def test_bad_input_gets_a_json_4xx_and_the_server_keeps_serving(batched: ServerProcess) -> None:
    from test_serve import BAD_REQUESTS

    for name, path, body, headers, expected in BAD_REQUESTS:
        data = body if isinstance(body, bytes) else body.encode()
        status, document, _ = http_json("POST", batched.base_url + path, data, headers)
        assert status == expected, f"{name}: {status} {document}"
        assert isinstance(document, dict), f"{name}: not a JSON error"
        assert "Traceback" not in json.dumps(document), name
    assert ask(batched, QUESTIONS[0], scope=fresh("after-bad")).completion_tokens > 0
    assert batched.process.poll() is None


def test_sigkill_during_a_burst_then_a_restart_restores_the_next_burst(
    tiny_model_path: Path, tmp_path: Path, single: ServerProcess
) -> None:
    cache = tmp_path / "cache"
    systems = SYSTEMS
    first = start_server(tiny_model_path, cache, tmp_path / "first.log", "--parallel", "4")
    try:
        at_once(
            [lambda i=i: ask(first, QUESTIONS[0], scope=f"agent-{i}", system=systems[i]) for i in range(4)]
        )
        wait_until_written(first)
        burst = threading.Thread(
            target=lambda: at_once(
                [lambda i=i: _ask_until_killed(first, systems[i], f"agent-{i}") for i in range(4)]
            )
        )
        burst.start()
        time.sleep(0.3)
    finally:
        first.kill()  # SIGKILL: no shutdown, no final flush
    burst.join(timeout=60)
    # A prompt warmed while no server runs is served by the next one too.
    prompt_file = tmp_path / "system.txt"
    prompt_file.write_text("You are the warmed agent. " + SYSTEM)
    warm = [sys.executable, "-m", "snapcache", "--cache-dir", str(cache), "warm", str(prompt_file)]
    warmed = subprocess.run(
        [*warm, "--model", str(tiny_model_path), "--scope", "warmed", "--threads", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert warmed.returncode == 0, warmed.stderr
    with running_server(
        tiny_model_path, cache, tmp_path / "second.log", "--parallel", "4", "--batch-mode", "exact"
    ) as second:
        calls = [
            lambda i=i: ask(second, QUESTIONS[2], scope=f"agent-{i}", system=systems[i]) for i in range(4)
        ]
        calls.append(
            lambda: ask(second, QUESTIONS[2], scope="warmed", system="You are the warmed agent. " + SYSTEM)
        )
        answers = at_once(calls)
    for answer in answers:
        assert answer.source in {"ram", "disk"}
        assert answer.cached_tokens >= 64
    expected = [cold(single, QUESTIONS[2], system=system).reply for system in systems]
    assert [a.reply for a in answers[:4]] == expected


def _ask_until_killed(server: ServerProcess, system: str, scope: str) -> None:
    # The server dies under it, as intended: openai's or httpx's error.
    with contextlib.suppress(Exception):
        ask(server, QUESTIONS[1], scope=scope, system=system, max_tokens=400)


def test_gemma_in_exact_mode_answers_as_one_request_at_a_time(gemma_model_path: Path, tmp_path: Path) -> None:
    """A real model (sliding windows, a chat template): two chats at once, each as when sent alone."""
    systems = [
        "You are a mail triager. Sort each message into urgent, later or spam, and say why in a line.",
        "You are a calendar agent. Answer with the date and time of the meeting asked about, nothing else.",
    ]
    question = "What should I look at first this morning?"
    with running_server(
        gemma_model_path,
        tmp_path / "exact",
        tmp_path / "exact.log",
        "--parallel",
        "2",
        "--batch-mode",
        "exact",
    ) as server:
        answers = at_once([lambda s=s: ask(server, question, scope="gemma", system=s) for s in systems])
    with running_server(gemma_model_path, tmp_path / "one", tmp_path / "one.log", "--parallel", "1") as one:
        expected = [ask(one, question, scope=f"alone-{i}", system=s) for i, s in enumerate(systems)]
    assert [a.reply for a in answers] == [e.reply for e in expected]
    assert all(a.completion_tokens > 0 for a in answers)
    assert answers[0].text != answers[1].text, answers


def test_a_grammar_takes_the_model_s_own_path_beside_batched_requests(batched: ServerProcess) -> None:
    scope = fresh("grammar")
    grammar = 'root ::= "yes" | "no"'
    answers = at_once(
        [
            lambda: ask(batched, QUESTIONS[0], scope=scope, stream=False, extra_body={"grammar": grammar}),
            lambda: ask(batched, QUESTIONS[1], scope=scope),
        ]
    )
    assert answers[0].text in {"yes", "no"}
    assert answers[1].completion_tokens > 0
    # The grammar's request ran on the Llama's own context through the cache hook: it restores too.
    again = ask(batched, QUESTIONS[2], scope=scope, stream=False, extra_body={"grammar": grammar})
    assert again.text in {"yes", "no"}
    assert again.source in {"ram", "context"}
    assert again.cached_tokens >= 64


def test_inexact_requests_are_batched(tiny_model_path: Path, tmp_path: Path) -> None:
    """--inexact no longer sends every request to the model's own context one at a time: they take
    the scheduler's sequences, restore and reuse prefixes there (under the inexact fingerprint)."""
    log = tmp_path / "log.txt"
    with running_server(tiny_model_path, tmp_path / "cache", log, "--parallel", "2", "--inexact") as server:
        scope = fresh("inexact")
        assert ask(server, QUESTIONS[0], scope=scope).source == "none"
        answers = at_once([lambda q=q: ask(server, q, scope=scope) for q in QUESTIONS[1:3]])
        assert all(a.completion_tokens > 0 and a.finish_reason in ("stop", "length") for a in answers)
        assert any(a.source == "context" and a.cached_tokens > 0 for a in answers)
        assert stats(server)["parallel"]["sequences"] == 2
    assert "one at a time" not in log.read_text(encoding="utf-8")
