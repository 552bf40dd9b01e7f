"""What the RAM tier adds to the tier contract: eviction callbacks, a bounded heap, peeks."""

from __future__ import annotations

import pytest

from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey, as_token_array
from snapcache.snapshot import Snapshot
from snapcache.store.ram import RamTier


def snap(n: int, *, priority: int = 0, size: int = 100) -> Snapshot:
    tokens = as_token_array([n, 1, 2])
    return Snapshot(
        SnapshotKey.for_tokens("fp", "ram", tokens), tokens, bytes([n % 256]) * size, priority=priority
    )


COST = snap(0).nbytes


def test_on_evict_receives_every_evicted_snapshot_in_order() -> None:
    evicted: list[Snapshot] = []
    tier = RamTier(3 * COST, on_evict=evicted.append)
    snaps = [snap(n, priority=p) for n, p in enumerate([0, 2, 1, 0])]
    for s in snaps[:3]:
        tier.put(s)
    tier.put(snaps[3])
    assert [s.key for s in evicted] == [snaps[0].key]
    assert tier.put(snap(9, priority=1, size=2 * 100 + 12))  # needs two slots: lowest priority first
    assert [s.key for s in evicted] == [snaps[0].key, snaps[3].key, snaps[2].key]
    assert tier.evictions == 3


def test_replacing_or_removing_is_not_an_eviction() -> None:
    evicted: list[Snapshot] = []
    tier = RamTier(2 * COST, on_evict=evicted.append)
    tier.put(snap(1))
    tier.put(snap(1))
    tier.remove(snap(1).key)
    assert evicted == []
    assert tier.evictions == 0


def test_peek_does_not_refresh_recency_but_get_does() -> None:
    tier = RamTier(2 * COST)
    a, b = snap(1), snap(2)
    tier.put(a)
    tier.put(b)
    assert tier.peek(a.key) is a
    tier.put(snap(3))
    assert a.key not in tier  # the peek did not save it
    assert tier.get(b.key) is b
    tier.put(snap(4))
    assert b.key in tier


def test_heap_stays_bounded_under_many_gets() -> None:
    tier = RamTier(10 * COST)
    snaps = [snap(n) for n in range(10)]
    for s in snaps:
        tier.put(s)
    for _ in range(1_000):
        for s in snaps:
            tier.get(s.key)
    assert len(tier._heap) <= 2 * len(tier) + 32
    # Order still right after compactions: the least recently used goes first.
    tier.get(snaps[0].key)
    tier.put(snap(99))
    assert snaps[1].key not in tier
    assert snaps[0].key in tier


def test_snapshots_lists_least_valuable_first() -> None:
    tier = RamTier(10 * COST)
    low, high, mid = snap(1, priority=-3), snap(2, priority=9), snap(3)
    for s in (high, mid, low):
        tier.put(s)
    assert [s.key for s in tier.snapshots()] == [low.key, mid.key, high.key]


def test_entries_describe_each_snapshot() -> None:
    tier = RamTier(10 * COST)
    s = snap(5, priority=4)
    tier.put(s)
    (row,) = tier.entries()
    assert (row.key, row.tier, row.priority, row.nbytes, row.state_bytes) == (s.key, "ram", 4, s.nbytes, 100)


@pytest.mark.parametrize("budget", [-1, 1.5, "10", True])
def test_bad_budget(budget: object) -> None:
    with pytest.raises(InvalidArgument):
        RamTier(budget)  # type: ignore[arg-type]
