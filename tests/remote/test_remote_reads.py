"""The store's reads across RAM, disk and a real redis-server: which tier serves, and what it costs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

redis = pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")

from redis_server import RedisServer, emptied, running_redis  # noqa: E402

from snapcache.key import BLOCK_TOKENS, SnapshotKey, block_keys  # noqa: E402
from snapcache.remote.remote_tier import RemoteTier  # noqa: E402
from snapcache.store import SnapshotStore  # noqa: E402

SECRET = b"team secret"
FINGERPRINT = "fp-remote-reads"
TOKENS = np.arange(1, 1001, dtype=np.int32)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    """The module's server, empty."""
    return emptied(redis_server).url


def open_store(directory: Path, url: str) -> SnapshotStore:
    remote = RemoteTier(url, secret=SECRET, background=False)
    return SnapshotStore(directory, secret=SECRET, remote=remote, background_writes=False)


def state(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8).tobytes()


def test_a_longer_prefix_in_redis_beats_a_shorter_local_one(tmp_path: Path, url: str) -> None:
    long_key = SnapshotKey.for_tokens(FINGERPRINT, "s", TOKENS[:600])
    short_key = SnapshotKey.for_tokens(FINGERPRINT, "s", TOKENS[:200])
    with open_store(tmp_path / "a", url) as elsewhere:
        elsewhere.put(long_key, TOKENS[:600], state(4096, 1))
    with open_store(tmp_path / "b", url) as store:
        store.put(short_key, TOKENS[:200], state(4096, 2))
        found = store.lookup_with_tier(FINGERPRINT, "s", TOKENS[:800])
        assert found is not None
        snapshot, tier = found
        assert (snapshot.key, tier) == (long_key, "remote")
        assert bytes(snapshot.state) == state(4096, 1)
        stats = store.stats()
        assert (stats.remote_hits, stats.ram_misses, stats.disk_misses) == (1, 1, 1)
        # Copied into the local tiers: the next lookup is served from RAM.
        assert store.lookup_with_tier(FINGERPRINT, "s", TOKENS[:800])[1] == "ram"  # type: ignore[index]
        # A query the long prefix does not fit is still served locally.
        assert store.lookup_with_tier(FINGERPRINT, "s", TOKENS[:300])[1] == "ram"  # type: ignore[index]


def test_a_lookup_reads_the_remote_catalog_once(tmp_path: Path, url: str, redis_server: RedisServer) -> None:
    with open_store(tmp_path / "a", url) as elsewhere:
        for n in (100, 200, 300):
            elsewhere.put(SnapshotKey.for_tokens(FINGERPRINT, "s", TOKENS[:n]), TOKENS[:n], state(512, n))
    with open_store(tmp_path / "b", url) as store:
        before = command_calls(redis_server)
        assert store.lookup_with_tier(FINGERPRINT, "s", TOKENS[:1000])[1] == "remote"  # type: ignore[index]
        assert store.lookup(FINGERPRINT, "t", TOKENS[:1000]) is None
        after = command_calls(redis_server)
    # One catalog per scope asked, one GET for the one candidate read.
    assert after.get("hvals", 0) - before.get("hvals", 0) == 2
    assert after.get("get", 0) - before.get("get", 0) == 1


def test_a_records_blocks_come_from_redis_in_one_round_trip(
    tmp_path: Path, url: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    n_blocks = 6
    keys = block_keys(FINGERPRINT, "s", TOKENS, n_blocks)
    blocks = [state(2048, i) for i in range(n_blocks)]
    with open_store(tmp_path / "a", url) as elsewhere:
        elsewhere.put_many(
            [
                (key, TOKENS[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS], blocks[i], 0)
                for i, key in enumerate(keys)
            ]
        )
    sends = count_sends(monkeypatch)
    with open_store(tmp_path / "b", url) as store:
        copied: dict[int, bytes] = {}
        # Connected first: opening a connection sends a few commands of its own.
        assert store.get(SnapshotKey.for_tokens(FINGERPRINT, "s", TOKENS[:5])) is None
        before, sends[0] = command_calls(redis_server), 0

        def copy(i: int, view: memoryview) -> None:
            copied[i] = bytes(view)

        served = store.copy_blocks(keys, copy)
        round_trips = sends[0]
        after = command_calls(redis_server)
        assert served == ["remote"] * n_blocks
        assert [copied[i] for i in range(n_blocks)] == blocks
        assert round_trips == 1
        assert after["get"] - before.get("get", 0) == n_blocks
        # Copied into the local tiers: read again, they come from RAM without a word to Redis.
        sends[0] = 0
        assert store.copy_blocks(keys, copy) == ["ram"] * n_blocks
        assert sends[0] == 0


def command_calls(server: RedisServer) -> dict[str, int]:
    """Calls per command name since the server started (INFO commandstats)."""
    client = server.client()
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def count_sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the requests redis-py writes to a socket (a pipeline writes all its commands at once)."""
    sends = [0]
    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        sends[0] += 1
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    return sends
