"""The remote tier against a real redis-server on a free loopback port (tests/redis_server.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

redis = pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")

from redis_server import RedisServer, emptied, running_redis  # noqa: E402

from snapcache.formats.codec import ZSTD  # noqa: E402
from snapcache.formats.snapshot_file import encode  # noqa: E402
from snapcache.key import SnapshotKey, as_token_array, block_keys, rolling_hash  # noqa: E402
from snapcache.remote.remote_tier import RemoteTier  # noqa: E402
from snapcache.remote.writes import RemoteWrites  # noqa: E402
from snapcache.snapshot import Snapshot  # noqa: E402

SECRET = b"team secret"
FINGERPRINT = "fp-remote-test"
# Each call a lookup makes is bounded by the tier's timeout; this is the bound asserted, generous for
# a shared machine (the timeout is 0.1 s).
CALL_BOUND_S = 1.5


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    """The module's server, running and empty."""
    if redis_server.process is None:
        redis_server.start()
    redis_server.resume()
    return emptied(redis_server)


@pytest.fixture
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client, for looking at and tampering with what the tier stored."""
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def tiers() -> Iterator[list[RemoteTier]]:
    """Tiers a test opens, closed afterwards."""
    made: list[RemoteTier] = []
    yield made
    for tier in made:
        tier.close(timeout=5)


def open_tier(tiers: list[RemoteTier], url: str, **kwargs: object) -> RemoteTier:
    kwargs.setdefault("secret", SECRET)
    kwargs.setdefault("background", False)
    tier = RemoteTier(url, **kwargs)  # type: ignore[arg-type]
    tiers.append(tier)
    return tier


def make_snapshot(
    seed: int, n_tokens: int = 40, state_bytes: int = 4096, *, priority: int = 0, scope: str = "team-a"
) -> Snapshot:
    rng = np.random.default_rng(seed)
    tokens = as_token_array(rng.integers(0, 32_000, n_tokens))
    key = SnapshotKey.for_tokens(FINGERPRINT, scope, tokens)
    state = rng.integers(0, 256, state_bytes, dtype=np.uint8).tobytes()  # incompressible: sizes known
    logits = rng.standard_normal(32).astype(np.float32)
    return Snapshot(key, tokens, state, logits, priority)


def assert_same(found: Snapshot | None, expected: Snapshot) -> None:
    assert found is not None
    assert found.key == expected.key
    assert bytes(found.state) == bytes(expected.state)
    assert np.array_equal(found.tokens, expected.tokens)
    assert found.logits is not None
    assert expected.logits is not None
    assert np.array_equal(found.logits, expected.logits)
    assert found.priority == expected.priority


# -- round trip and namespacing -----------------------------------------------------------------------


def test_round_trip_verifies_and_namespaces(server, raw, tiers):
    tier = open_tier(tiers, server.url, prefix="acme")
    snapshot = make_snapshot(1, priority=7)
    assert tier.write(snapshot)
    assert_same(tier.get(snapshot.key), snapshot)
    assert tier.held(snapshot.key)
    assert tier.held_priority(snapshot.key) == 7

    name = f"acme:{FINGERPRINT}:team-a:{snapshot.key.id}"
    assert tier.value_key(snapshot.key) == name
    value = raw.get(name)
    assert value is not None
    assert value.startswith(b"\x89SNAPC\r\n")
    stats = tier.stats()
    assert stats.reachable
    assert (stats.entries, stats.used_bytes) == (1, len(value))
    assert (stats.hits, stats.writes, stats.errors) == (1, 1, 0)

    # Another namespace on the same server sees nothing of it.
    other = open_tier(tiers, server.url, prefix="other-team")
    assert other.get(snapshot.key) is None
    assert other.stats().entries == 0

    assert tier.remove(snapshot.key)
    assert tier.get(snapshot.key) is None
    assert not tier.held(snapshot.key)
    assert (tier.stats().entries, tier.stats().used_bytes) == (0, 0)


def test_background_put_reaches_redis(server, tiers):
    tier = open_tier(tiers, server.url, background=True)
    snapshots = [make_snapshot(seed) for seed in range(5)]
    for snapshot in snapshots:
        tier.put(snapshot)
    assert tier.flush(timeout=10)
    for snapshot in snapshots:
        assert_same(tier.get(snapshot.key), snapshot)


def test_no_secret_warns_once(server, tiers, caplog):
    caplog.set_level(logging.WARNING, logger="snapcache")
    prefix = f"warn-{time.monotonic_ns()}"
    open_tier(tiers, server.url, secret=None, prefix=prefix)
    open_tier(tiers, server.url, secret=None, prefix=prefix)
    warnings = [r for r in caplog.records if "has no secret" in r.getMessage()]
    assert len(warnings) == 1
    assert "SNAPCACHE_SECRET" in warnings[0].getMessage()


def test_password_is_kept_out_of_reports(server, tiers):
    tier = open_tier(tiers, f"redis://:hunter2@127.0.0.1:{server.port}/0")
    assert "hunter2" not in tier.url
    assert "hunter2" not in repr(tier.stats())


# -- values tampered with in Redis are misses ----------------------------------------------------------


def test_flipped_byte_is_a_miss_and_deleted(server, raw, tiers):
    tier = open_tier(tiers, server.url)
    snapshot = make_snapshot(2)
    assert tier.write(snapshot)
    name = tier.value_key(snapshot.key)
    value = bytearray(raw.get(name))
    for position in (20, len(value) // 2, len(value) - 1):  # header, body, payload
        damaged = bytearray(value)
        damaged[position] ^= 0x01
        raw.set(name, bytes(damaged))
        assert tier.get(snapshot.key) is None
        assert raw.get(name) is None  # deleted, with its records
        assert tier.stats().used_bytes == 0
        assert tier.write(snapshot)  # a writer with the secret stores it again
    assert tier.stats().rejected == 3
    assert_same(tier.get(snapshot.key), snapshot)


def test_value_from_another_key_is_a_miss(server, raw, tiers):
    tier = open_tier(tiers, server.url)
    first, second = make_snapshot(3), make_snapshot(4)
    assert tier.write(first)
    assert tier.write(second)
    raw.set(tier.value_key(first.key), raw.get(tier.value_key(second.key)))
    assert tier.get(first.key) is None
    assert_same(tier.get(second.key), second)


def test_local_file_copied_into_redis_is_a_miss(server, raw, tiers):
    """A disk store's file is valid under the same secret, but names its store, not the namespace."""
    tier = open_tier(tiers, server.url)
    snapshot = make_snapshot(5)
    local = encode(snapshot, store_id="0123456789abcdef", state_codec=ZSTD, mac_secret=None)
    raw.set(tier.value_key(snapshot.key), b"".join(local.parts))
    assert tier.get(snapshot.key) is None


@pytest.mark.parametrize(
    ("writer_secret", "reader_secret"), [(None, SECRET), (b"other", SECRET), (SECRET, None)]
)
def test_value_without_a_valid_mac_is_a_miss_and_kept(server, raw, tiers, writer_secret, reader_secret):
    writer = open_tier(tiers, server.url, secret=writer_secret)
    reader = open_tier(tiers, server.url, secret=reader_secret)
    snapshot = make_snapshot(6)
    assert writer.write(snapshot)
    assert reader.get(snapshot.key) is None
    assert reader.stats().unauthenticated == 1
    assert raw.exists(writer.value_key(snapshot.key))  # kept for the machines that have that secret
    assert not reader.held(snapshot.key)  # so that the reader's own put replaces it
    assert_same(writer.get(snapshot.key), snapshot)
    assert reader.write(snapshot)
    assert_same(reader.get(snapshot.key), snapshot)


def test_forged_mac_is_a_miss(server, raw, tiers):
    """A value re-signed by someone without the secret: the header's digest is fixed up, the MAC not."""
    tier = open_tier(tiers, server.url)
    snapshot = make_snapshot(7)
    forger = open_tier(tiers, server.url, secret=b"guess")
    assert forger.write(snapshot)
    assert tier.get(snapshot.key) is None
    assert tier.stats().hits == 0


def test_garbage_values_are_misses(server, raw, tiers):
    tier = open_tier(tiers, server.url)
    snapshot = make_snapshot(8)
    name = tier.value_key(snapshot.key)
    for garbage in (b"", b"x", b"\x89SNAPC\r\n" + b"\xff" * 100, bytes(range(256)) * 64):
        raw.set(name, garbage)
        assert tier.get(snapshot.key) is None
    raw.delete(name)
    raw.rpush(name, b"a list, not a string")
    assert tier.get(snapshot.key) is None  # the server's WRONGTYPE error is a miss too


# -- a dead, hung or restarted Redis -------------------------------------------------------------------


def timed(action):
    start = time.monotonic()
    result = action()
    return result, time.monotonic() - start


def test_killed_redis_is_a_miss_within_bounded_time_and_writes_resume(server, tiers, caplog):
    caplog.set_level(logging.WARNING, logger="snapcache")
    tier = open_tier(tiers, server.url, background=True, backoff_s=0.3)
    before = make_snapshot(10)
    tier.put(before)
    assert tier.flush(timeout=10)
    assert tier.get(before.key) is not None

    server.kill()
    during = [make_snapshot(seed) for seed in range(11, 16)]
    for snapshot in during:
        _, elapsed = timed(lambda s=snapshot: tier.put(s))
        assert elapsed < CALL_BOUND_S
    for action in (
        lambda: tier.get(before.key),
        lambda: tier.held(before.key),
        lambda: tier.held_priority(before.key),
        lambda: tier.remove(before.key),
    ):
        result, elapsed = timed(action)
        assert result in (None, False)
        assert elapsed < CALL_BOUND_S
    assert tier.flush(timeout=10)
    stats, elapsed = timed(tier.stats)
    assert not stats.reachable
    assert stats.entries is None
    assert stats.errors >= 1
    assert elapsed < CALL_BOUND_S
    outage = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(outage) == 1  # logged once per outage, not once per call

    server.start()  # empty: nothing was persisted
    time.sleep(0.4)  # the back-off passes
    after = make_snapshot(17)
    tier.put(after)
    assert tier.flush(timeout=10)
    assert_same(tier.get(after.key), after)
    assert tier.stats().reachable
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_hung_redis_costs_a_timeout_then_is_skipped(server, tiers):
    tier = open_tier(tiers, server.url, timeout_s=0.1, backoff_s=30)
    snapshot = make_snapshot(20)
    assert tier.write(snapshot)
    server.pause()
    try:
        found, first = timed(lambda: tier.get(snapshot.key))
        assert found is None
        assert first < CALL_BOUND_S
        before = tier.stats()  # backing off: no round trip either
        assert before.errors == 1
        found, second = timed(lambda: tier.get(snapshot.key))
        assert found is None
        # Skipped, not asked: a call to the paused server would have timed out and counted an error.
        after = tier.stats()
        assert (after.errors, after.skipped) == (before.errors, before.skipped + 2)  # the get, the stats
        assert second < CALL_BOUND_S  # the counters prove no call was made; this only catches a hang
    finally:
        server.resume()


def test_full_write_backlog_drops_the_oldest():
    sent: list[int] = []
    started, release = threading.Event(), threading.Event()

    def send(snapshot: Snapshot) -> None:
        started.set()
        release.wait(10)
        sent.append(snapshot.priority)

    writes = RemoteWrites(send, max_items=3, max_bytes=1 << 30)
    try:
        for i in range(8):
            writes.submit(make_snapshot(30 + i, priority=i))
            if i == 0:
                assert started.wait(10)  # the writer took the first
        assert writes.dropped == 4  # 1 in flight, 3 waiting: 1..4 dropped
        release.set()
        assert writes.flush(timeout=10)
    finally:
        writes.close(timeout=10)
    assert sent == [0, 5, 6, 7]


# -- the budget ------------------------------------------------------------------------------------------


def namespace_bytes(raw, prefix: str) -> tuple[int, int]:
    """(values, bytes) under `prefix` as Redis holds them, whatever the records say."""
    names = [n for n in raw.scan_iter(match=f"{prefix}:{FINGERPRINT}:*")]
    return len(names), sum(raw.strlen(n) for n in names)


def test_budget_holds_under_a_stream_of_puts(server, raw, tiers):
    budget = 100_000
    writers = [open_tier(tiers, server.url, budget_bytes=budget, background=True) for _ in range(2)]
    keep = make_snapshot(40, priority=5)
    assert writers[0].write(keep)
    snapshots = [make_snapshot(100 + i, state_bytes=9_000) for i in range(60)]

    seen: list[int] = []

    def stream(tier: RemoteTier, part: list[Snapshot]) -> None:
        for snapshot in part:
            tier.put(snapshot)
            time.sleep(0.002)
            seen.append(namespace_bytes(raw, "snapcache")[1])

    threads = [threading.Thread(target=stream, args=(w, snapshots[i::2])) for i, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        assert writer.flush(timeout=30)

    values, used = namespace_bytes(raw, "snapcache")
    stats = writers[0].stats()
    assert len(seen) == len(snapshots)
    assert max(seen) <= budget
    assert used <= budget
    assert (stats.entries, stats.used_bytes) == (values, used)
    assert 5 <= values < 12  # about ten 9 KB values fit in 100 KB
    assert sum(w.stats().evictions for w in writers) >= 40
    assert_same(writers[0].get(keep.key), keep)  # a higher priority is never evicted by a lower one
    # The newest stay: the write that came last, the last of one stream or the other (on a loaded
    # machine one stream can fall ten puts behind the other, and its last value is then old).
    lasts = [snapshots[-2], snapshots[-1]]
    kept = [last for last, writer in zip(lasts, writers, strict=True) if writer.get(last.key) is not None]
    assert kept, "neither stream's last value stayed"
    for last in kept:
        assert_same(writers[0].get(last.key), last)


def test_budget_refuses_what_would_evict_a_higher_priority(server, tiers):
    tier = open_tier(tiers, server.url, budget_bytes=12_000)
    high = make_snapshot(50, state_bytes=8_000, priority=3)
    assert tier.write(high)
    low = make_snapshot(51, state_bytes=8_000, priority=1)
    assert not tier.write(low)
    assert tier.get(low.key) is None
    assert_same(tier.get(high.key), high)
    assert not tier.write(make_snapshot(52, state_bytes=20_000, priority=9))  # larger than the budget
    higher = make_snapshot(53, state_bytes=8_000, priority=3)  # equal priority: evicts the older one
    assert tier.write(higher)
    assert tier.get(high.key) is None
    stats = tier.stats()
    assert (stats.refused, stats.evictions, stats.entries) == (2, 1, 1)


def test_value_evicted_by_redis_itself_is_a_miss_and_leaves_the_records(server, raw, tiers):
    tier = open_tier(tiers, server.url)
    snapshot = make_snapshot(60)
    assert tier.write(snapshot)
    raw.delete(tier.value_key(snapshot.key))  # what maxmemory with allkeys-lru may do
    assert tier.get(snapshot.key) is None
    stats = tier.stats()
    assert (stats.entries, stats.used_bytes) == (0, 0)


def test_scopes_and_blocks_share_a_namespace(server, raw, tiers):
    tier = open_tier(tiers, server.url)
    tokens = as_token_array(range(128))
    keys = block_keys(FINGERPRINT, "team:b", tokens, 2)
    for i, key in enumerate(keys):
        snap = Snapshot(key, tokens[i * 64 : (i + 1) * 64], b"\x01" * 100)
        assert tier.write(snap)
        assert tier.get(key) is not None
    names = sorted(n.decode() for n in raw.scan_iter(match=f"snapcache:{FINGERPRINT}:team:b:*"))
    assert names == sorted(tier.value_key(k) for k in keys)
    assert tier.catalog(FINGERPRINT, "team:b") == []  # blocks are found by their keys alone


def test_catalog_lists_records_and_follows_evictions(server, raw, tiers):
    tier = open_tier(tiers, server.url, budget_bytes=12_000)
    first = make_snapshot(70, state_bytes=8_000)
    assert tier.write(first)
    assert tier.catalog(FINGERPRINT, "team-a") == [
        (first.key.token_count, first.key.prefix_hash, rolling_hash(first.tokens))
    ]
    assert tier.catalog(FINGERPRINT, "team-b") == []
    second = make_snapshot(71, state_bytes=8_000)
    assert tier.write(second)  # evicts the first, and its catalog row
    assert [row[1] for row in tier.catalog(FINGERPRINT, "team-a")] == [second.key.prefix_hash]
    assert tier.remove(second.key)
    assert tier.catalog(FINGERPRINT, "team-a") == []
    assert raw.hlen("snapcache:#catalog-of") == 0


def test_a_held_value_is_not_sent_again_unless_its_priority_rises(server, tiers):
    tier = open_tier(tiers, server.url)
    snapshot = make_snapshot(80, priority=1)
    assert tier.write(snapshot)
    assert tier.write(snapshot)
    assert (tier.stats().writes, tier.stats().already_held) == (1, 1)
    higher = Snapshot(snapshot.key, snapshot.tokens, snapshot.state, snapshot.logits, 4)
    assert tier.write(higher)
    assert tier.stats().writes == 2
    assert tier.held_priority(snapshot.key) == 4


# -- two stores ("two machines") sharing one Redis ---------------------------------------------------


def open_store(directory, url, **kwargs):
    from snapcache.store import SnapshotStore

    return SnapshotStore(
        directory, ram_bytes=64 << 20, disk_bytes=256 << 20, secret=SECRET, remote=url, **kwargs
    )


@pytest.mark.model
def test_second_machine_restores_from_redis_like_cold(server, tmp_path, make_llama, tiny_model_path):
    from chat_support import DOCUMENT, GREEDY, N_CTX, context_of

    from snapcache.llama.hook.cached import CachedLlama

    prompt = DOCUMENT + "Question: what does the fox do?\nAnswer:"
    with open_store(tmp_path / "machine-a", server.url) as first:
        warmed = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), first).warm(DOCUMENT, raw=True)
        first.flush()
        sent = first.remote_stats()
        assert sent is not None
        assert sent.writes >= 2  # the record and its blocks

    cold = make_llama(tiny_model_path, n_ctx=N_CTX)
    cold_text = cold.create_completion(prompt, **GREEDY)["choices"][0]["text"]

    with open_store(tmp_path / "machine-b", server.url) as second:
        assert second.entries() == []
        restored = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), second)
        text = restored.create_completion(prompt, **GREEDY)["choices"][0]["text"]
        info = restored.last_restore
        assert info is not None
        assert info.restored_tokens == warmed.token_count
        assert (text, context_of(restored.llm)) == (cold_text, context_of(cold))
        stats = second.remote_stats()
        assert stats is not None
        assert stats.hits >= 2
        assert stats.rejected == stats.unauthenticated == 0
        second.flush()
        assert any(e.key.token_count == warmed.token_count for e in second.entries())  # copied in

        # Redis gone: the second machine keeps restoring from its own tiers, with no exception.
        server.kill()
        again = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), second)
        text = again.create_completion(prompt, **GREEDY)["choices"][0]["text"]
        assert again.last_restore is not None
        # at least what came from Redis: the first completion here stored a longer prefix too
        assert again.last_restore.restored_tokens >= warmed.token_count
        assert (text, context_of(again.llm)) == (cold_text, context_of(cold))


@pytest.mark.model
def test_a_machine_with_another_secret_reads_the_prompt_itself(server, tmp_path, make_llama, tiny_model_path):
    from chat_support import DOCUMENT, GREEDY, N_CTX, context_of

    from snapcache.llama.hook.cached import CachedLlama
    from snapcache.store import SnapshotStore

    prompt = DOCUMENT + "Question: where is the dog?\nAnswer:"
    with open_store(tmp_path / "machine-a", server.url) as first:
        CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), first).warm(DOCUMENT, raw=True)
    with SnapshotStore(tmp_path / "machine-c", secret=b"another team", remote=server.url) as other:
        llm = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), other)
        text = llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
        assert llm.last_restore is not None
        assert llm.last_restore.restored_tokens == 0
        stats = other.remote_stats()
        assert stats is not None
        assert stats.unauthenticated >= 1
        assert stats.hits == 0
    cold = make_llama(tiny_model_path, n_ctx=N_CTX)
    assert (text, context_of(llm.llm)) == (
        cold.create_completion(prompt, **GREEDY)["choices"][0]["text"],
        context_of(cold),
    )


def test_store_with_a_dead_redis_keeps_working_locally(server, tmp_path):
    from snapcache.remote.remote_tier import RemoteTier

    server.kill()
    remote = RemoteTier(server.url, secret=SECRET, backoff_s=60)
    with open_store(tmp_path / "alone", remote) as store:
        snapshot = make_snapshot(90)
        start = time.monotonic()
        assert store.put(snapshot.key, snapshot.tokens, snapshot.state, logits=snapshot.logits) is not None
        store.flush()
        assert_same(store.get(snapshot.key), snapshot)
        other = make_snapshot(91)
        assert store.get(other.key) is None
        assert store.lookup(FINGERPRINT, "team-a", other.tokens) is None
        found = store.lookup(FINGERPRINT, "team-a", np.concatenate([snapshot.tokens, [5, 6, 7]]))
        assert found is not None
        assert found.key == snapshot.key
        assert time.monotonic() - start < 5 * CALL_BOUND_S
        stats = store.remote_stats()
        assert stats is not None
        assert not stats.reachable


def test_the_lowest_priority_goes_first_then_the_least_recently_used(server, tiers):
    tier = open_tier(tiers, server.url, budget_bytes=30_000)
    low_old, low_new, high = (
        make_snapshot(s, state_bytes=8_000, priority=p) for s, p in ((85, 0), (86, 0), (87, 2))
    )
    for snapshot in (low_old, low_new, high):
        assert tier.write(snapshot)
        time.sleep(0.005)  # uses are recorded to the millisecond
    assert tier.get(low_old.key) is not None  # used: now the more recent of the two low ones
    time.sleep(0.005)
    assert tier.write(make_snapshot(88, state_bytes=8_000, priority=1))
    assert tier.get(low_new.key) is None
    for kept in (low_old, high):
        assert tier.get(kept.key) is not None


@pytest.mark.model
def test_a_record_whose_blocks_were_evicted_is_a_shorter_prefix_not_an_error(
    server, raw, tmp_path, make_llama, tiny_model_path
):
    from chat_support import DOCUMENT, GREEDY, N_CTX, context_of

    from snapcache.llama.hook.cached import CachedLlama

    prompt = DOCUMENT + "Question: is the dog lazy?\nAnswer:"
    with open_store(tmp_path / "machine-a", server.url) as first:
        warmed = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), first).warm(DOCUMENT, raw=True)
    blocks = [
        name
        for name in raw.scan_iter(match="snapcache:*:default:*")
        if raw.hget("snapcache:#catalog-of", name) is None
    ]
    assert len(blocks) >= 2
    raw.delete(blocks[len(blocks) // 2])  # what an eviction by Redis itself would do
    with open_store(tmp_path / "machine-b", server.url) as second:
        llm = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), second)
        text = llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
        assert llm.last_restore is not None
        # the blocks before the missing one, copied in as the record's were read: a shorter prefix
        assert llm.last_restore.restored_tokens < warmed.token_count
        assert llm.last_restore.restored_tokens % 64 == 0
    cold = make_llama(tiny_model_path, n_ctx=N_CTX)
    assert (text, context_of(llm.llm)) == (
        cold.create_completion(prompt, **GREEDY)["choices"][0]["text"],
        context_of(cold),
    )


def test_store_reads_the_remote_from_the_environment(server, tmp_path, monkeypatch):
    from snapcache.store import SnapshotStore

    snapshot = make_snapshot(95)
    monkeypatch.setenv("SNAPCACHE_REMOTE", server.url)
    monkeypatch.setenv("SNAPCACHE_SECRET", SECRET.decode())
    with SnapshotStore(tmp_path / "a") as first:
        first.put(snapshot.key, snapshot.tokens, snapshot.state, logits=snapshot.logits)
    with SnapshotStore(tmp_path / "b") as second:
        assert_same(second.get(snapshot.key), snapshot)
    monkeypatch.delenv("SNAPCACHE_REMOTE")
    with SnapshotStore(tmp_path / "c") as third:
        assert third.get(snapshot.key) is None
        assert third.remote_stats() is None


def test_store_survives_redis_killed_and_restarted_amid_puts_and_lookups(server, tmp_path):
    from snapcache.remote.remote_tier import RemoteTier

    remote = RemoteTier(server.url, secret=SECRET, backoff_s=0.2)
    errors: list[BaseException] = []
    with open_store(tmp_path / "machine", remote) as store:
        stop = threading.Event()

        def traffic() -> None:
            seed = 1000
            while not stop.is_set():
                seed += 1
                snapshot = make_snapshot(seed)
                try:
                    store.put(snapshot.key, snapshot.tokens, snapshot.state, logits=snapshot.logits)
                    assert store.get(snapshot.key) is not None  # the local tiers keep working
                    store.lookup(FINGERPRINT, "team-a", make_snapshot(seed + 10_000).tokens)
                except BaseException as exc:
                    errors.append(exc)
                    return

        worker = threading.Thread(target=traffic)
        worker.start()
        try:
            time.sleep(0.3)
            server.kill()
            time.sleep(0.5)
            server.start()
            time.sleep(0.5)
        finally:
            stop.set()
            worker.join(30)
        assert errors == []
        store.flush()
        after = make_snapshot(99)
        store.put(after.key, after.tokens, after.state, logits=after.logits)
        store.flush()
        assert_same(remote.get(after.key), after)  # writes resumed
        stats = store.remote_stats()
        assert stats is not None
        assert stats.errors >= 1
        assert stats.reachable


@pytest.mark.parametrize("remote", ["", "http://127.0.0.1:6379", "not a url"])
def test_a_bad_remote_is_a_clear_error_at_opening(tmp_path, remote):
    from snapcache.errors import InvalidArgument
    from snapcache.store import SnapshotStore

    with pytest.raises(InvalidArgument, match="remote"):
        SnapshotStore(tmp_path / "store", remote=remote)


@pytest.mark.parametrize("prefix", ["", "has space", "x" * 101, "naïve"])
def test_a_bad_prefix_is_a_clear_error(prefix):
    from snapcache.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="prefix"):
        RemoteTier("redis://127.0.0.1:1/0", prefix=prefix)


# -- the command line ---------------------------------------------------------------------------------


def test_the_cli_stats_shows_the_remote_tier(server: RedisServer, tmp_path: Any) -> None:
    import json

    from redis_server import free_port
    from typer.testing import CliRunner

    from snapcache.store import SnapshotStore
    from snapcache_cli.app import app

    directory = tmp_path / "cache"
    with SnapshotStore(directory, remote=server.url) as store:
        tokens = np.arange(70, dtype=np.int32)
        store.put(
            SnapshotKey.for_tokens("f" * 32, "cli", tokens), tokens, np.random.default_rng(0).bytes(4096)
        )
        store.flush()
    runner = CliRunner()
    result = runner.invoke(app, ["--cache-dir", str(directory), "--remote", server.url, "stats", "--json"])
    assert result.exit_code == 0, result.output
    remote = json.loads(result.stdout)["remote"]
    assert remote["reachable"] is True
    assert remote["entries"] == 1
    assert remote["used_bytes"] > 4096

    text = runner.invoke(app, ["--cache-dir", str(directory), "--remote", server.url, "stats"])
    assert "reachable" in text.output
    listed = runner.invoke(app, ["--cache-dir", str(directory), "--remote", server.url, "ls"])
    assert listed.exit_code == 0, listed.output
    assert "remote: " in listed.output
    assert "holds: 1 values" in listed.output
    # Nothing listening: the tier is reported unreachable, the command still works.
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    down = runner.invoke(app, ["--cache-dir", str(directory), "--remote", nobody, "stats"])
    assert down.exit_code == 0, down.output
    assert "not reachable" in down.output
    # Not a Redis URL: one clear line, no traceback.
    bad = runner.invoke(app, ["--cache-dir", str(directory), "--remote", "http://example", "stats"])
    assert bad.exit_code == 1
    assert "Traceback" not in bad.output


def test_the_cli_doctor_checks_the_remote_tier(server: RedisServer, tmp_path: Any) -> None:
    import json

    from redis_server import free_port
    from typer.testing import CliRunner

    from snapcache_cli.app import app

    runner = CliRunner()
    base = ["--cache-dir", str(tmp_path / "cache")]
    found = runner.invoke(app, [*base, "--remote", server.url, "doctor", "--json"])
    [check] = [c for c in json.loads(found.stdout)["checks"] if c["name"] == "remote tier"]
    assert check["status"] == "warn"  # reachable, but no secret
    assert "0 values" in check["detail"]
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    down = runner.invoke(app, [*base, "--remote", nobody, "doctor", "--json"])
    [check] = [c for c in json.loads(down.stdout)["checks"] if c["name"] == "remote tier"]
    assert check["status"] == "fail"
    assert down.exit_code == 1


def test_a_value_claiming_a_huge_state_is_refused_before_any_memory_is_taken(
    server: RedisServer, raw: redis.Redis, tiers: list[RemoteTier]
) -> None:
    tier = RemoteTier(server.url, secret=None, prefix="huge")
    tiers.append(tier)
    tokens = as_token_array(np.arange(64))
    key = SnapshotKey.for_tokens(FINGERPRINT, "s", tokens)
    # 64 MiB of zeros compress to almost nothing: a value whose state is far larger than its bytes.
    snapshot = Snapshot(key, tokens, bytes(64 << 20), None, 0)
    assert tier.write(snapshot)
    assert len(raw.get(tier.value_key(key)) or b"") < (64 << 20) // 64
    assert tier.get(key) is None  # refused as crafted, not decompressed
