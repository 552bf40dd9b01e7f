"""Priority admission through the store: low-priority traffic never pushes out what was warmed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from test_store import FP, SCOPE, assert_right, state_for

from snapcache import SnapshotKey
from snapcache.store import SnapshotStore, StoreEntry

STATE = 3_000
LENGTH = 32
RNG = np.random.default_rng(77)
DOCS = [RNG.integers(0, 30_000, size=LENGTH, dtype=np.int32) for _ in range(120)]


def put(store: SnapshotStore, i: int, priority: int = 0, size: int = STATE) -> SnapshotKey:
    tokens = DOCS[i]
    key = SnapshotKey.for_tokens(FP, SCOPE, tokens)
    store.put(key, tokens, state_for(tokens, size), priority=priority)
    return key


def ram_cost() -> int:
    with SnapshotStore(None, ram_bytes=1 << 20) as probe:
        put(probe, 0)
        return probe.stats().ram_used_bytes


def file_cost(tmp_path: Path) -> int:
    with SnapshotStore(tmp_path / "probe", ram_bytes=0, disk_bytes=1 << 20) as probe:
        put(probe, 0)
        probe.flush()
        return probe.stats().disk_used_bytes


def tiers(store: SnapshotStore) -> dict[SnapshotKey, tuple[str, ...]]:
    rows = store.entries()
    assert all(isinstance(row, StoreEntry) for row in rows)
    return {row.key: row.tiers for row in rows}  # type: ignore[attr-defined]


def test_a_stream_of_priority_0_puts_never_evicts_priority_10(tmp_path: Path) -> None:
    room = 4  # each tier holds four snapshots
    with SnapshotStore(
        tmp_path / "cache",
        ram_bytes=room * ram_cost() + 100,
        disk_bytes=room * file_cost(tmp_path) + 100,
    ) as store:
        warm = [put(store, i, priority=10) for i in (1, 2)]
        wide = 0
        for i in range(10, 110):
            if i % 7 == 0:  # three slots wide: room only by evicting a warm entry
                put(store, i, size=3 * STATE)
                wide += 1
            else:
                put(store, i)
            if i % 10 == 0:
                store.flush()
                held = tiers(store)
                for key in warm:
                    assert held[key] == ("ram", "disk")
        store.flush()
        stats = store.stats()
        assert stats.ram_evictions >= 80
        assert stats.disk_evictions >= 80
        assert stats.dropped == wide  # kept out of both tiers: each would have evicted priority 10
        held = tiers(store)
        for key in warm:
            assert held[key] == ("ram", "disk")
            assert_right(store.get(key), LENGTH, DOCS[warm.index(key) + 1])


def test_a_put_that_would_evict_a_higher_priority_stays_out_of_ram_but_reaches_disk(
    tmp_path: Path,
) -> None:
    with SnapshotStore(tmp_path / "cache", ram_bytes=2 * ram_cost() + 100, disk_bytes=1 << 22) as store:
        warm = [put(store, i, priority=10) for i in (1, 2)]
        low = put(store, 3, priority=5)
        store.flush()
        held = tiers(store)
        assert held[low] == ("disk",)
        for key in warm:
            assert held[key] == ("ram", "disk")
        before = store.stats()
        assert_right(store.get(low), LENGTH, DOCS[3])  # served from disk, and not promoted either
        after = store.stats()
        assert after.disk_hits == before.disk_hits + 1
        assert after.promotions == before.promotions
        assert tiers(store)[low] == ("disk",)
        equal = put(store, 4, priority=10)  # an equal priority may evict: the least recently used
        store.flush()
        held = tiers(store)
        assert held[equal] == ("ram", "disk")
        assert sum(1 for key in warm if "ram" in held[key]) == 1


def test_a_ram_only_put_that_would_evict_a_higher_priority_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with SnapshotStore(None, ram_bytes=2 * ram_cost() + 100) as store:
        warm = [put(store, i, priority=10) for i in (1, 2)]
        tokens = DOCS[3]
        key = SnapshotKey.for_tokens(FP, SCOPE, tokens)
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            assert store.put(key, tokens, state_for(tokens, STATE), priority=0) is None
        assert "higher priority" in caplog.text
        assert store.get(key) is None
        assert store.stats().dropped == 1
        assert set(tiers(store)) == set(warm)
        assert store.lookup(FP, SCOPE, tokens) is None


def test_the_disk_keeps_out_a_put_that_would_evict_a_higher_priority(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with SnapshotStore(
        tmp_path / "cache", ram_bytes=1 << 20, disk_bytes=2 * file_cost(tmp_path) + 100
    ) as store:
        warm = [put(store, i, priority=10) for i in (1, 2)]
        store.flush()
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            low = put(store, 3)
            store.flush()
        assert "higher priority" in caplog.text
        held = tiers(store)
        assert held[low] == ("ram",)  # RAM keeps it; the disk would have had to evict priority 10
        for key in warm:
            assert held[key] == ("ram", "disk")
        assert store.stats().disk_evictions == 0
        # Refused before its file was written: only the two warm files exist.
        assert len(list((tmp_path / "cache" / "snapshots").iterdir())) == 2
