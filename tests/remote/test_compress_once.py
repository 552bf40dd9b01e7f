"""A store with a disk and a remote tier compresses each put once and hands the payload to both writers;
the bytes each tier stores are those it would store on its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

redis = pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")

from block_snapshots import block_snapshots  # noqa: E402
from redis_server import RedisServer, emptied, running_redis  # noqa: E402

from snapcache import SnapshotKey, SnapshotStore  # noqa: E402
from snapcache.formats import codec  # noqa: E402
from snapcache.formats.snapshot_file import encode, mac_key  # noqa: E402
from snapcache.remote.remote_tier import RemoteTier  # noqa: E402
from snapcache.store.shared_payloads import SharedPayloads  # noqa: E402

SECRET = b"compress once"
TOKENS = np.arange(300, dtype=np.int32)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return emptied(redis_server).url


@pytest.fixture
def compressions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the states codec.compress is called on, from any thread."""
    calls: list[int] = []
    real = codec.compress

    def counting(data: Any, **kwargs: Any) -> bytes:
        calls.append(memoryview(data).nbytes)
        return real(data, **kwargs)

    monkeypatch.setattr(codec, "compress", counting)
    return calls


def state(n: int, seed: int) -> bytes:
    """Half random, half zeros: a state that compresses, as KV states do a little."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, n // 2, dtype=np.uint8).tobytes() + bytes(n - n // 2)


def test_a_put_is_compressed_once_for_disk_and_redis(
    tmp_path: Path, url: str, compressions: list[int]
) -> None:
    key = SnapshotKey.for_tokens("fp-once", "s", TOKENS)
    with SnapshotStore(tmp_path / "d", secret=SECRET, remote=url, compression="zstd") as store:
        snapshot = store.put(key, TOKENS, state(200_000, 1), priority=3)
        assert snapshot is not None
        store.flush()
        assert compressions == [200_000]
        value = redis.Redis.from_url(url).get(f"snapcache:fp-once:s:{key.id}")
    # The value is byte for byte what the remote tier encodes on its own.
    alone = encode(snapshot, store_id="remote:snapcache", state_codec=codec.ZSTD,
                   mac_secret=mac_key(SECRET))  # fmt: skip
    assert value == b"".join(bytes(part) for part in alone.parts)
    # Both tiers read it back: the disk in a store without Redis, Redis in a store without a disk.
    with SnapshotStore(tmp_path / "d", secret=SECRET) as disk_only:
        found = disk_only.get(key)
        assert found is not None
        assert bytes(found.state) == state(200_000, 1)
    with SnapshotStore(None, secret=SECRET, remote=url) as remote_only:
        found = remote_only.get(key)
        assert found is not None
        assert bytes(found.state) == state(200_000, 1)
        assert found.priority == 3


def test_blocks_packed_on_disk_are_compressed_once(tmp_path: Path, url: str, compressions: list[int]) -> None:
    blocks = block_snapshots(6)
    with SnapshotStore(tmp_path / "d", secret=SECRET, remote=url, compression="zstd") as store:
        store.put_many([(b.key, b.tokens, b.state, 0) for b in blocks])
        store.flush()
        assert len(compressions) == len(blocks)
    with SnapshotStore(tmp_path / "d", secret=SECRET) as disk_only:
        assert [bytes(s.state) for s, _ in disk_only.get_blocks([b.key for b in blocks])] == [
            bytes(b.state) for b in blocks
        ]
    remote = RemoteTier(url, secret=SECRET, background=False)
    try:
        assert [bytes(s.state) for s in remote.get_many([b.key for b in blocks]) if s is not None] == [
            bytes(b.state) for b in blocks
        ]
    finally:
        remote.close()


def test_without_a_remote_tier_nothing_is_shared(tmp_path: Path, compressions: list[int]) -> None:
    key = SnapshotKey.for_tokens("fp-once", "s", TOKENS)
    with SnapshotStore(tmp_path / "d", secret=SECRET, compression="zstd") as store:
        assert store._payloads is None
        store.put(key, TOKENS, state(10_000, 2))
        store.flush()
    assert compressions == [10_000]


def test_shared_payloads_are_bounded_and_dropped_once_taken(compressions: list[int]) -> None:
    blocks = block_snapshots(4)
    shared = SharedPayloads(max_bytes=1 << 30, max_entries=2)
    for block in blocks:
        shared.expect(block, 2)
    assert len(shared) == 2  # the two oldest were dropped: their writers compress on their own
    first = shared(blocks[0], codec.ZSTD)
    assert len(compressions) == 1
    assert len(shared) == 2
    last = [shared(blocks[3], codec.ZSTD) for _ in range(2)]
    assert len(compressions) == 2  # the second writer reused the first's payload
    assert last[0] is last[1]
    assert len(shared) == 1
    assert shared.held_bytes == 0
    assert bytes(first) == codec.compress(blocks[0].state, level=1, shuffle=True)
