"""One contract, three tiers: the RAM tier, the disk tier and the remote tier (a real redis-server,
tests/redis_server.py) pass the same suite; where Redis differs by design, see RemoteTier's docstring."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from snapcache.disk.disk_tier import DiskTier
from snapcache.key import SnapshotKey, as_token_array
from snapcache.snapshot import Snapshot
from snapcache.store.ram import RamTier
from snapcache.tier_contract import Tier

if TYPE_CHECKING:
    from redis_server import RedisServer

STATE_BYTES = 4_000
MakeTier = Callable[[int], Tier]


def make_snapshot(
    n: int, *, priority: int = 0, scope: str = "contract", state_seed: int = 0, size: int = STATE_BYTES
) -> Snapshot:
    """Snapshot number `n`: its own tokens, incompressible state bytes derived from (n, state_seed)."""
    tokens = as_token_array([n, n + 1, n + 2, 7])
    seed = int.from_bytes(hashlib.blake2b(f"{n}/{state_seed}".encode(), digest_size=8).digest(), "little")
    state = np.random.default_rng(seed).bytes(size)
    key = SnapshotKey.for_tokens("fp-contract", scope, tokens)
    return Snapshot(key, tokens, state, priority=priority)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")
    from redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["ram", "disk", "remote"])
def make_tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeTier]:
    """Factory: a tier of the parametrized kind with the given budget (each in its own directory, or
    its own Redis namespace)."""
    made: list[Tier] = []
    url = ""
    if request.param == "remote":
        from redis_server import emptied

        url = emptied(request.getfixturevalue("redis_server")).url

    def factory(budget: int) -> Tier:
        tier: Tier
        if request.param == "ram":
            tier = RamTier(budget)
        elif request.param == "disk":
            tier = DiskTier(tmp_path / f"disk-{len(made)}", budget)
        else:
            from snapcache.remote.remote_tier import RemoteTier

            tier = RemoteTier(
                url, secret=b"contract", prefix=f"contract-{len(made)}", budget_bytes=budget, background=False
            )
        made.append(tier)
        return tier

    yield factory
    for tier in made:
        tier.close()


def entry_cost(make_tier: MakeTier) -> int:
    """What one make_snapshot() costs this kind of tier (its own accounting unit)."""
    probe = make_tier(1 << 30)
    assert probe.put(make_snapshot(10_000))
    return probe.used_bytes


def keys_of(tier: Tier) -> set[SnapshotKey]:
    return {row.key for row in tier.entries()}


def test_round_trip(make_tier: MakeTier) -> None:
    tier = make_tier(1 << 20)
    snap = make_snapshot(1, priority=7)
    assert tier.put(snap)
    got = tier.get(snap.key)
    assert got is not None
    assert got.key == snap.key
    assert np.array_equal(got.tokens, snap.tokens)
    assert bytes(got.state) == bytes(snap.state)
    assert got.priority == 7
    assert tier.get(make_snapshot(2).key) is None
    [row] = tier.entries()
    assert (row.key, row.tier, row.priority, row.state_bytes) == (snap.key, tier.name, 7, STATE_BYTES)
    assert row.nbytes == tier.used_bytes


def test_put_replaces_an_existing_key(make_tier: MakeTier, request: pytest.FixtureRequest) -> None:
    tier = make_tier(1 << 20)
    first = make_snapshot(1, state_seed=1)
    second = make_snapshot(1, state_seed=2, size=STATE_BYTES // 2)
    assert tier.put(first)
    used_before = tier.used_bytes
    assert tier.put(second)
    assert len(tier) == 1
    got = tier.get(first.key)
    assert got is not None
    if request.node.callspec.params["make_tier"] == "remote":
        # A key Redis holds at the same priority is not sent again (RemoteTier's docstring): the
        # machines sharing it agree on the first value, as on any value under one key.
        assert bytes(got.state) == bytes(first.state)
        assert tier.used_bytes == used_before == sum(row.nbytes for row in tier.entries())
        return
    assert bytes(got.state) == bytes(second.state)
    assert tier.used_bytes < used_before
    assert tier.used_bytes == sum(row.nbytes for row in tier.entries())


def test_remove(make_tier: MakeTier) -> None:
    tier = make_tier(1 << 20)
    snap = make_snapshot(1)
    tier.put(snap)
    assert tier.remove(snap.key)
    assert not tier.remove(snap.key)
    assert tier.get(snap.key) is None
    assert snap.key not in tier
    assert tier.used_bytes == 0


def test_contains_and_len(make_tier: MakeTier) -> None:
    tier = make_tier(1 << 20)
    snaps = [make_snapshot(n) for n in range(5)]
    for count, snap in enumerate(snaps, start=1):
        assert snap.key not in tier
        tier.put(snap)
        assert snap.key in tier
        assert len(tier) == count
    assert "not a key" not in tier
    assert keys_of(tier) == {s.key for s in snaps}


def test_budget_accounting_is_exact(make_tier: MakeTier) -> None:
    cost = entry_cost(make_tier)
    budget = 5 * cost + cost // 2
    tier = make_tier(budget)
    for n in range(12):
        tier.put(make_snapshot(n))
        if n % 3 == 2:
            tier.remove(make_snapshot(n - 1).key)
        assert tier.used_bytes == sum(row.nbytes for row in tier.entries())
        assert tier.used_bytes <= budget
    # Room for five, oldest out first: 0, 2, 3, 5 were evicted; 1, 4, 7, 10 removed.
    assert keys_of(tier) == {make_snapshot(n).key for n in (6, 8, 9, 11)}
    assert tier.evictions == 4
    assert tier.budget_bytes == budget


def test_eviction_takes_lowest_priority_then_least_recently_used(make_tier: MakeTier) -> None:
    cost = entry_cost(make_tier)
    tier = make_tier(3 * cost + cost // 2)  # room for three
    a, b, c = make_snapshot(1), make_snapshot(2, priority=5), make_snapshot(3)
    for snap in (a, b, c):
        assert tier.put(snap)
    assert tier.get(a.key) is not None  # a is now more recent than c
    d = make_snapshot(4)
    assert tier.put(d)
    assert keys_of(tier) == {a.key, b.key, d.key}  # c: lowest priority, least recently used
    e = make_snapshot(5)
    assert tier.put(e)
    assert keys_of(tier) == {b.key, d.key, e.key}  # then a, though b is older: b has priority 5
    f = make_snapshot(6, priority=5)
    assert tier.put(f)  # priority 5 may evict priority 0 (d, the least recently used)
    assert keys_of(tier) == {b.key, e.key, f.key}
    assert tier.evictions == 3


def test_a_put_never_evicts_a_higher_priority(make_tier: MakeTier) -> None:
    """A stream of priority-0 puts leaves priority-10 entries alone; what cannot fit stays out."""
    cost = entry_cost(make_tier)
    tier = make_tier(3 * cost + cost // 2)  # room for three
    warm = [make_snapshot(n, priority=10) for n in (1, 2)]
    for snap in warm:
        assert tier.put(snap)
    for n in range(100, 120):
        assert tier.put(make_snapshot(n))  # only the one priority-0 slot cycles
        assert {s.key for s in warm} <= keys_of(tier)
    assert tier.evictions == 19
    used = tier.used_bytes
    wide = make_snapshot(200, size=2 * STATE_BYTES)  # needs two slots: one of them is priority 10
    assert not tier.put(wide)
    assert wide.key not in tier
    assert tier.used_bytes == used
    assert tier.evictions == 19
    assert tier.put(make_snapshot(201, priority=10))  # an equal priority may evict
    assert len(tier) == 3


def test_a_higher_priority_evicts_lower_ones_only(make_tier: MakeTier) -> None:
    cost = entry_cost(make_tier)
    tier = make_tier(3 * cost + cost // 2)
    low, mid, high = make_snapshot(1), make_snapshot(2, priority=5), make_snapshot(3, priority=9)
    for snap in (low, mid, high):
        assert tier.put(snap)
    assert not tier.put(make_snapshot(4, priority=-1))  # lower than everything held
    assert tier.put(make_snapshot(5, priority=5))  # evicts low, the only one it may
    assert keys_of(tier) == {mid.key, high.key, make_snapshot(5).key}
    assert not tier.put(make_snapshot(6, priority=4))


def test_an_entry_larger_than_the_budget_is_refused_without_emptying(make_tier: MakeTier) -> None:
    cost = entry_cost(make_tier)
    tier = make_tier(3 * cost + cost // 2)
    kept = [make_snapshot(n) for n in range(3)]
    for snap in kept:
        tier.put(snap)
    used = tier.used_bytes
    huge = make_snapshot(99, size=8 * STATE_BYTES, priority=100)
    assert not tier.put(huge)
    assert huge.key not in tier
    assert keys_of(tier) == {s.key for s in kept}
    assert tier.used_bytes == used
    assert tier.evictions == 0


def test_a_zero_budget_keeps_nothing(make_tier: MakeTier) -> None:
    tier = make_tier(0)
    assert not tier.put(make_snapshot(1))
    assert len(tier) == 0
    assert tier.used_bytes == 0
