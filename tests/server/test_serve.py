"""`snapcache serve` as a real process on a loopback port, driven by the real `openai` client."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, http_json, running_server, start_server, wait_until_written

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

MAX_TOKENS = 16
QUESTIONS = ("Where did I save the invoice?", "What is on my calendar?", "Open the last report.")
DOCUMENT = "Notes: the quick brown fox jumps over the lazy dog near the river bank. " * 8
OTHER_SYSTEM = "You are a terse assistant for a travel agency. " * 6
# The tiny model's tokens are <unk>, <s>, </s> and one per byte (3 + byte). With <unk>, <s> and the
# bytes outside ASCII ruled out, every generated token but the end is one character of the answer:
# answers equal in text and token count are equal token by token.
ONE_CHARACTER_PER_TOKEN = {str(token): -100.0 for token in (0, 1, *range(3 + 0x80, 3 + 0x100))}
_cold_scopes = itertools.count()


def client(server: ServerProcess, **kwargs: Any) -> Any:
    return openai.OpenAI(
        base_url=server.api_url, api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs
    )


def messages(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def chat(
    server: ServerProcess,
    question: str,
    *,
    scope: str = "default",
    stream: bool = False,
    system: str = SYSTEM,
):
    """(reply text, completion tokens, cached tokens, response headers) of one greedy chat turn."""
    args: dict[str, Any] = {"model": "m", "messages": messages(question, system), "max_tokens": MAX_TOKENS}
    args.update(temperature=0, logit_bias=ONE_CHARACTER_PER_TOKEN)
    with client(server, default_headers={"X-Snapcache-Scope": scope}) as api:
        if not stream:
            raw = api.chat.completions.with_raw_response.create(**args)
            result = raw.parse()
            usage, headers = result.usage, dict(raw.headers)
            return result.choices[0].message.content, usage.completion_tokens, _cached(usage), headers
        raw = api.chat.completions.with_raw_response.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
        text, usage = "", None
        for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None, "the stream asked for usage and got none"
        return text, usage.completion_tokens, _cached(usage), dict(raw.headers)


def complete(server: ServerProcess, prompt: str, *, scope: str = "default", stream: bool = False):
    with client(server, default_headers={"X-Snapcache-Scope": scope}) as api:
        args: dict[str, Any] = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        args["logit_bias"] = ONE_CHARACTER_PER_TOKEN
        if not stream:
            raw = api.completions.with_raw_response.create(**args)
            result = raw.parse()
            return (
                result.choices[0].text,
                result.usage.completion_tokens,
                _cached(result.usage),
                dict(raw.headers),
            )
        raw = api.completions.with_raw_response.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
        text, usage = "", None
        for chunk in raw.parse():
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None
        return text, usage.completion_tokens, _cached(usage), dict(raw.headers)


def _cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    assert details is not None, "usage.prompt_tokens_details is missing"
    return int(details.cached_tokens)


@pytest.fixture(scope="module")
def cold_server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server whose every request runs in a scope of its own: nothing is ever restored."""
    home = tmp_path_factory.mktemp("cold")
    with running_server(tiny_model_path, home / "cache", home / "log.txt") as server:
        yield server


def cold_chat(cold_server: ServerProcess, question: str, **kwargs: Any):
    reply = chat(cold_server, question, scope=f"cold-{next(_cold_scopes)}", **kwargs)
    assert reply[2] == 0, "the cold server restored something"
    return reply


@pytest.fixture
def server(tiny_model_path: Path, tmp_path: Path):
    """One request at a time on the model's one context, which another scope's request takes: what
    a scope asks again comes from the store. (With --parallel N a sequence keeps its scope's prompt:
    tests/server/test_serve_parallel.py.)"""
    with running_server(
        tiny_model_path, tmp_path / "cache", tmp_path / "server.log", "--parallel", "1"
    ) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_chat_restores_the_system_prompt_and_answers_as_cold(server, cold_server, stream: bool) -> None:
    first = chat(server, QUESTIONS[0], scope="agent", stream=stream)
    assert first[2] == 0
    assert first[3]["x-snapcache-source"] == "none"
    # Another scope's chat takes the model's context: the next one must come from the store.
    chat(server, QUESTIONS[0], scope="other", system=OTHER_SYSTEM)
    second = chat(server, QUESTIONS[1], scope="agent", stream=stream)
    assert second[2] >= 64, f"the system prompt was not reused: {second}"
    assert second[3]["x-snapcache-source"] == "ram"
    assert int(second[3]["x-snapcache-restored-tokens"]) >= second[2]
    cold = cold_chat(cold_server, QUESTIONS[1], stream=stream)
    assert (second[0], second[1]) == (cold[0], cold[1])
    assert (first[0], first[1]) == cold_chat(cold_server, QUESTIONS[0], stream=stream)[:2]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_completions_restore_a_shared_beginning_and_answer_as_cold(server, cold_server, stream: bool) -> None:
    complete(server, DOCUMENT + "Question: who jumps?", scope="docs", stream=stream)
    complete(server, OTHER_SYSTEM + "Question: where to?", scope="other")
    text, tokens, cached, headers = complete(
        server, DOCUMENT + "Question: where is the dog?", scope="docs", stream=stream
    )
    assert cached >= 64
    assert headers["x-snapcache-source"] == "ram"
    cold = complete(
        cold_server, DOCUMENT + "Question: where is the dog?", scope="cold-raw-" + str(stream), stream=stream
    )
    assert cold[2] == 0
    assert (text, tokens) == cold[:2]


def test_a_restart_after_sigkill_restores_from_disk(
    tiny_model_path: Path, tmp_path: Path, cold_server
) -> None:
    cache = tmp_path / "cache"
    first = start_server(tiny_model_path, cache, tmp_path / "first.log")
    try:
        chat(first, QUESTIONS[0])
        wait_until_written(first)
    finally:
        first.kill()  # SIGKILL: no shutdown, no final flush
    with running_server(tiny_model_path, cache, tmp_path / "second.log") as second:
        text, tokens, cached, headers = chat(second, QUESTIONS[2], stream=True)
        _, stats, _ = http_json("GET", f"{second.base_url}/snapcache/stats")
    assert stats["since_start"]["requests"] == 1
    assert [(row["requests"], row["cached_tokens"]) for row in stats["all_time"]] == [(2, cached)]
    assert cached >= 64
    assert headers["x-snapcache-source"] == "disk"
    assert (text, tokens) == cold_chat(cold_server, QUESTIONS[2], stream=True)[:2]


def test_scopes_are_isolated(server) -> None:
    chat(server, QUESTIONS[0], scope="agent-a")
    other = chat(server, QUESTIONS[1], scope="agent-b")
    assert other[2] == 0, "a request in another scope reused agent-a's prompt"
    assert other[3]["x-snapcache-source"] == "none"
    again = chat(server, QUESTIONS[1], scope="agent-a")
    assert again[2] >= 64

    status, why, _ = http_json("GET", f"{server.base_url}/snapcache/why?scope=agent-b")
    assert status == 200
    assert why["reason"] == "nothing is stored in this scope yet"
    status, why, _ = http_json("GET", f"{server.base_url}/snapcache/why?scope=agent-a")
    assert status == 200
    assert why["closest"] is not None
    assert why["restored_tokens"] == int(again[3]["x-snapcache-restored-tokens"]) > 0
    status, _, _ = http_json("GET", f"{server.base_url}/snapcache/why?scope=nobody")
    assert status == 404


def test_concurrent_clients_are_all_answered(server, cold_server) -> None:
    systems = [f"You are agent number {i}. " + SYSTEM for i in range(4)]
    jobs = [(i, q) for i in range(4) for q in QUESTIONS]

    def ask(job: tuple[int, str]) -> tuple[str, int, int]:
        agent, question = job
        text, tokens, cached, _ = chat(
            server, question, scope=f"agent-{agent}", stream=agent % 2 == 1, system=systems[agent]
        )
        return text, tokens, cached

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(ask, jobs))
    assert len(answers) == len(jobs)
    assert all(tokens > 0 for _, tokens, _ in answers)
    assert sum(cached > 0 for _, _, cached in answers) >= len(jobs) - 4  # all but each agent's first
    for (agent, question), (text, tokens, _) in list(zip(jobs, answers, strict=True))[::5]:
        cold = chat(cold_server, question, scope=f"cold-{next(_cold_scopes)}", system=systems[agent])
        assert (text, tokens) == cold[:2]


BAD_REQUESTS = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [{"role": "user"', {}, 400),
    (
        "wrong type",
        "/v1/chat/completions",
        json.dumps({"messages": messages("hi"), "max_tokens": "many"}),
        {},
        400,
    ),
    ("not an object", "/v1/completions", b"[1, 2]", {}, 400),
    ("empty messages", "/v1/chat/completions", json.dumps({"messages": []}), {}, 400),
    (
        "bad scope",
        "/v1/chat/completions",
        json.dumps({"messages": messages("hi")}),
        {"X-Snapcache-Scope": "a" * 300},
        400,
    ),
    ("too long", "/v1/completions", json.dumps({"prompt": "word " * 3000, "max_tokens": 4}), {}, 400),
    (
        "too long, streamed",
        "/v1/completions",
        json.dumps({"prompt": "word " * 3000, "stream": True}),
        {},
        400,
    ),
    (
        "too long chat, streamed",
        "/v1/chat/completions",
        json.dumps({"messages": messages("word " * 3000), "stream": True}),
        {},
        400,
    ),
    ("warm: two prompts", "/snapcache/warm", json.dumps({"system": "x", "prompt": "y"}), {}, 400),
    ("warm: too short", "/snapcache/warm", json.dumps({"system": "Be brief."}), {}, 400),
    ("warm: unknown field", "/snapcache/warm", json.dumps({"system": SYSTEM, "colour": "red"}), {}, 422),
    ("warm: not JSON", "/snapcache/warm", b"system: hi", {}, 400),
    ("tokenize: empty body", "/extras/tokenize", b"", {}, 400),
    ("count: not JSON", "/extras/tokenize/count", b"how many?", {}, 400),
    ("count: wrong type", "/extras/tokenize/count", json.dumps({"input": 5}), {}, 400),
    ("detokenize: not an object", "/extras/detokenize", b"[1]", {}, 400),
    # a token id outside the vocabulary aborted the process in llama.cpp
    ("detokenize: no such token", "/extras/detokenize", json.dumps({"tokens": [3, 300]}), {}, 400),
    ("embeddings", "/v1/embeddings", json.dumps({"input": "hi"}), {}, 400),
    ("logprobs", "/v1/completions", json.dumps({"prompt": "hi", "logprobs": 0}), {}, 400),
    (
        "chat logprobs",
        "/v1/chat/completions",
        json.dumps({"messages": messages("hi"), "logprobs": True}),
        {},
        400,
    ),
    # a grammar llama.cpp cannot parse crashed the process
    ("grammar", "/v1/completions", json.dumps({"prompt": "hi", "grammar": "root ::= root"}), {}, 400),
    ("two prompts", "/v1/completions", json.dumps({"prompt": ["a", "b"]}), {}, 400),
    (
        "logit_bias: not a token",
        "/v1/completions",
        json.dumps({"prompt": "hi", "logit_bias": {"x": 1}}),
        {},
        400,
    ),
    ("lone surrogate", "/v1/completions", b'{"prompt": "\\ud800"}', {}, 400),
    # the engine's Chat Completions route, through the dialects' one skeleton
    (
        "lone surrogate, tools",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud800"}], "tools": [{"type": "function", '
        b'"function": {"name": "f", "parameters": {}}}]}',
        {},
        400,
    ),
    ("NaN", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', {}, 400),
    (
        "no such tool",
        "/v1/chat/completions",
        json.dumps(
            {
                "messages": messages("hi"),
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            }
        ),
        {},
        400,
    ),
]


def test_bad_input_gets_a_json_4xx_and_the_server_keeps_serving(server) -> None:
    for name, path, body, headers, expected in BAD_REQUESTS:
        data = body if isinstance(body, bytes) else body.encode()
        status, document, _ = http_json("POST", server.base_url + path, data, headers)
        assert status == expected, f"{name}: {status} {document}"
        assert isinstance(document, dict), f"{name}: not a JSON error"
        assert "Traceback" not in json.dumps(document), name
        if expected == 400:
            assert document["error"]["type"] == "invalid_request_error", (name, document)
    assert chat(server, QUESTIONS[0])[1] > 0
    assert server.process.poll() is None
    assert "Traceback" not in server.log()


def test_detokenize_answers_tokens_that_end_inside_a_character(server) -> None:
    # 0xE2 0x82 0xAC is the euro sign; the tiny model's byte tokens are 3 + byte.
    euro = [3 + 0xE2, 3 + 0x82, 3 + 0xAC]
    for tokens, text in ((euro, "\u20ac"), (euro[:2], "\ufffd")):
        status, document, _ = http_json(
            "POST", server.base_url + "/extras/detokenize", json.dumps({"tokens": tokens}).encode()
        )
        assert (status, document) == (200, {"text": text})


def test_an_api_key_is_required_when_set(tiny_model_path: Path, tmp_path: Path) -> None:
    with running_server(
        tiny_model_path, tmp_path / "cache", tmp_path / "log", "--api-key", "s3cret"
    ) as server:
        with pytest.raises(openai.AuthenticationError), client(server, api_key="wrong") as api:
            api.chat.completions.create(model="m", messages=messages("hi"), max_tokens=2)
        status, _, _ = http_json("GET", server.base_url + "/snapcache/stats")
        assert status == 401
        with client(server, api_key="s3cret") as api:
            reply = api.chat.completions.create(model="m", messages=messages("hi"), max_tokens=2)
        assert reply.usage.completion_tokens > 0


def test_a_damaged_cache_directory_is_a_miss(tiny_model_path: Path, tmp_path: Path, cold_server) -> None:
    cache = tmp_path / "cache"
    with running_server(tiny_model_path, cache, tmp_path / "first.log") as first:
        chat(first, QUESTIONS[0])
        wait_until_written(first)
    files = sorted(p for p in (cache / "snapshots").iterdir() if p.suffix in (".snap", ".pack"))
    assert files, "nothing was written"
    for path in files:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # in a pack, one block
        data[24] ^= 0xFF  # the header: every block of a pack
        path.write_bytes(bytes(data))
    with running_server(tiny_model_path, cache, tmp_path / "second.log") as second:
        text, tokens, cached, _ = chat(second, QUESTIONS[2])
    assert cached == 0
    assert (text, tokens) == cold_chat(cold_server, QUESTIONS[2])[:2]


def test_warm_over_http_then_stats_and_metrics(server, tiny_model_path: Path, tmp_path: Path) -> None:
    prompt_file = tmp_path / "system.txt"
    prompt_file.write_text(SYSTEM)
    command = [sys.executable, "-m", "snapcache", "warm", str(prompt_file), "--server", server.base_url]
    done = subprocess.run(
        [*command, "--scope", "agent-w", "--priority", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["token_count"] >= 64
    assert report["scope"] == "agent-w"
    assert report["from_cache"] is False
    _, _, cached, headers = chat(server, QUESTIONS[0], scope="agent-w")
    assert cached >= report["token_count"] - 1
    assert headers["x-snapcache-source"] in {"ram", "context"}  # the warm left the prompt in the context

    status, stats, _ = http_json("GET", server.base_url + "/snapcache/stats")
    assert status == 200
    scope = stats["scopes"]["agent-w"]
    assert scope["requests"] == 1
    assert scope["cached_tokens"] == cached
    assert scope["restored_from_ram"] + scope["reused_context"] == 1
    assert scope["restore_seconds"] > 0
    assert stats["store"]["ram_entries"] >= 1
    assert stats["all_time"][0]["scope"] == "agent-w"

    with urllib_open(server.base_url + "/metrics") as response:
        metrics = response.read().decode()
    assert f'snapcache_cached_tokens_total{{scope="agent-w"}} {float(cached)}' in metrics
    assert 'snapcache_store_entries{tier="ram"}' in metrics
    source = headers["x-snapcache-source"]
    assert f'snapcache_restore_seconds_count{{source="{source}"}} 1.0' in metrics
    observed = re.search(rf'snapcache_restore_seconds_sum{{source="{source}"}} (\S+)', metrics)
    assert observed is not None
    assert float(observed.group(1)) == pytest.approx(scope["restore_seconds"])

    shown = subprocess.run(
        [sys.executable, "-m", "snapcache", "--cache-dir", str(tmp_path / "cache"), "stats", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    savings = json.loads(shown.stdout)["savings"]
    assert [(row["scope"], row["requests"], row["cached_tokens"]) for row in savings] == [
        ("agent-w", 1, cached)
    ]

    refused = subprocess.run(
        [*command[:-2], "--server", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("snapcache: error: cannot reach the server")
    assert "Traceback" not in refused.stderr


def urllib_open(url: str) -> Any:
    import urllib.request

    return urllib.request.urlopen(url, timeout=30)
