"""`snapcache serve` with a remote tier: a real server process and a real redis-server on loopback.

Every request is bounded (REQUEST_TIMEOUT_S; the openai client would wait 600 s) and a failure
carries the servers' logs: a server that stops answering fails the test in minutes, with its reason.
"""

from __future__ import annotations

import contextlib
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_process import ServerProcess, http_json, running_server, start_server
from test_serve import MAX_TOKENS, ONE_CHARACTER_PER_TOKEN, QUESTIONS, _cached, client, messages

pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")

from redis_server import running_redis

pytestmark = pytest.mark.model

# A chat turn of the tiny model takes well under a second; minutes leave room for a loaded machine.
REQUEST_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 4000


def chat(
    server: ServerProcess, question: str, *, scope: str = "default"
) -> tuple[str, int, int, dict[str, str]]:
    """(reply text, completion tokens, cached tokens, response headers) of one greedy chat turn,
    within REQUEST_TIMEOUT_S."""
    args: dict[str, Any] = {"model": "m", "messages": messages(question), "max_tokens": MAX_TOKENS}
    args.update(temperature=0, logit_bias=ONE_CHARACTER_PER_TOKEN)
    with client(server, default_headers={"X-Snapcache-Scope": scope}, timeout=REQUEST_TIMEOUT_S) as api:
        raw = api.chat.completions.with_raw_response.create(**args)
        result = raw.parse()
        return (
            result.choices[0].message.content,
            result.usage.completion_tokens,
            _cached(result.usage),
            dict(raw.headers),
        )


def assert_ours(server: ServerProcess, model: Path) -> ServerProcess:
    """`server` is running and it is what answers on its port: its free port was not taken meanwhile by
    another process's server (which start_server's wait for an answer would accept)."""
    assert server.process.poll() is None, f"snapcache serve exited with {server.process.returncode}"
    status, models, _ = http_json("GET", f"{server.base_url}/v1/models", timeout=REQUEST_TIMEOUT_S)
    assert status == 200, status
    assert [entry["id"] for entry in models["data"]] == [model.name], f"another server answers: {models}"
    return server


@contextlib.contextmanager
def logs_on_failure(*logs: Path) -> Iterator[None]:
    """Re-raise a failure with the end of each server log, which says why a server failed or hung."""
    try:
        yield
    except Exception as exc:
        tails = [
            f"--- {log.name}:\n{log.read_text(errors='replace')[-LOG_TAIL_CHARS:]}"
            for log in logs
            if log.exists()
        ]
        raise AssertionError(f"{type(exc).__name__}: {exc}\n" + "\n".join(tails)) from exc


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with running_redis(tmp_path) as server:
        yield server.url


def test_an_empty_cache_restores_from_redis_and_says_remote(
    tiny_model_path: Path, tmp_path: Path, redis_url: str
) -> None:
    with logs_on_failure(tmp_path / "a.log", tmp_path / "b.log"):
        served_from_redis(tiny_model_path, tmp_path, redis_url)


def served_from_redis(tiny_model_path: Path, tmp_path: Path, redis_url: str) -> None:
    first = start_server(
        tiny_model_path,
        tmp_path / "a",
        tmp_path / "a.log",
        "--remote",
        redis_url,
        "--remote-budget",
        "256MiB",
    )
    try:
        assert_ours(first, tiny_model_path)
        assert chat(first, QUESTIONS[0])[2] == 0
        cold = chat(first, QUESTIONS[1], scope="cold")  # another scope: nothing to restore
        assert cold[2] == 0
    finally:
        first.kill(signal.SIGTERM)  # closing the store sends what waits for Redis
    with running_server(tiny_model_path, tmp_path / "b", tmp_path / "b.log", "--remote", redis_url) as second:
        assert_ours(second, tiny_model_path)
        text, tokens, cached, headers = chat(second, QUESTIONS[1])
        _, stats, _ = http_json("GET", f"{second.base_url}/snapcache/stats", timeout=REQUEST_TIMEOUT_S)
        with urllib.request.urlopen(f"{second.base_url}/metrics", timeout=REQUEST_TIMEOUT_S) as response:
            metrics = response.read().decode()
    assert cached >= 64, "the system prompt the first server put in Redis was not restored"
    assert (text, tokens) == cold[:2]
    assert headers["x-snapcache-source"] == "remote"
    assert stats["scopes"]["default"]["restored_from_remote"] == 1
    assert stats["store"]["remote_hits"] == 1  # the lookup (blocks are not counted)
    assert 'snapcache_requests_total{scope="default",source="remote"} 1.0' in metrics
    assert 'snapcache_store_lookups_total{result="hit",tier="remote"}' in metrics
