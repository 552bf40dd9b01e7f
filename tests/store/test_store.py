"""SnapshotStore: the two tiers together — spill, promote, persist, isolate, look up, count."""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from snapcache import InvalidArgument, KeyMismatch, SnapcacheError, SnapshotKey, StoreUnavailable
from snapcache.store import SnapshotStore, StoreEntry
from snapcache.tier_contract import Tier

FP = "fp-store"
SCOPE = "store"
STATE = 2_000
RNG = np.random.default_rng(1234)
DOC = RNG.integers(0, 30_000, size=2_000, dtype=np.int32)
OTHER_DOC = RNG.integers(0, 30_000, size=2_000, dtype=np.int32)


def state_for(tokens: np.ndarray, size: int = STATE) -> bytes:
    """Incompressible bytes that follow from the tokens alone, so any reader can check them."""
    seed = int.from_bytes(
        hashlib.blake2b(np.asarray(tokens, "<i4").tobytes(), digest_size=8).digest(), "little"
    )
    return np.random.default_rng(seed).bytes(size)


def add(
    store: SnapshotStore,
    n: int,
    *,
    doc: np.ndarray = DOC,
    priority: int = 0,
    scope: str = SCOPE,
    fp: str = FP,
    size: int = STATE,
) -> SnapshotKey:
    tokens = doc[:n]
    key = SnapshotKey.for_tokens(fp, scope, tokens)
    assert store.put(key, tokens, state_for(tokens, size), priority=priority) is not None
    return key


def assert_right(snapshot: object, n: int, doc: np.ndarray = DOC) -> None:
    assert snapshot is not None
    assert snapshot.key.token_count == n  # type: ignore[attr-defined]
    assert np.array_equal(snapshot.tokens, doc[:n])  # type: ignore[attr-defined]
    assert bytes(snapshot.state) == state_for(doc[:n], len(snapshot.state))  # type: ignore[attr-defined]


def cost(n: int, size: int = STATE) -> int:
    """RAM cost of the snapshot of DOC[:n]: state plus int32 tokens."""
    return size + 4 * n


def disk_tier(store: SnapshotStore) -> Tier:
    tier = store._disk
    assert tier is not None
    return tier


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def small(directory: Path) -> Iterator[SnapshotStore]:
    """RAM for three ~2 KB snapshots, plenty of disk."""
    with SnapshotStore(directory, ram_bytes=3 * cost(20) + 100, disk_bytes=1 << 22) as store:
        yield store


# -- spill, promote, persist ----------------------------------------------------------------------


def test_ram_evictions_stay_retrievable_from_disk(small: SnapshotStore) -> None:
    for n in range(10, 20):
        add(small, n)
    small.flush()
    stats = small.stats()
    assert stats.ram_entries == 3
    assert stats.ram_evictions == 7
    assert stats.disk_entries == 10
    for n in range(10, 20):
        assert_right(small.get(SnapshotKey.for_tokens(FP, SCOPE, DOC[:n])), n)
    assert small.stats().disk_hits >= 7


def test_an_eviction_before_the_write_is_a_spill(
    small: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = disk_tier(small)
    release = threading.Event()
    real_put = disk.put
    calls = []

    def slow_put(snapshot):  # holds the writer on its first snapshot until released
        calls.append(snapshot.key)
        if len(calls) == 1:
            assert release.wait(10)
        return real_put(snapshot)

    monkeypatch.setattr(disk, "put", slow_put)
    # RAM holds three: 10 is evicted unwritten (the one snapshot allowed to wait outside RAM).
    keys = [add(small, n) for n in range(10, 14)]
    assert small.stats().ram_evictions == 1
    for n, key in zip(range(10, 14), keys, strict=True):
        assert_right(small.get(key), n)  # served from memory while the writes wait
    release.set()
    small.flush()
    stats = small.stats()
    assert stats.spills == 1
    assert stats.disk_entries == 4
    small.close()
    with SnapshotStore(small.directory, ram_bytes=0) as reopened:
        for n, key in zip(range(10, 14), keys, strict=True):
            assert_right(reopened.get(key), n)


def test_a_disk_hit_is_promoted_into_ram(small: SnapshotStore) -> None:
    keys = [add(small, n) for n in range(10, 14)]
    small.flush()
    assert keys[0] not in small._ram  # type: ignore[operator]
    assert_right(small.get(keys[0]), 10)
    stats = small.stats()
    assert (stats.disk_hits, stats.promotions) == (1, 1)
    assert_right(small.get(keys[0]), 10)
    stats = small.stats()
    assert (stats.ram_hits, stats.disk_hits, stats.promotions) == (1, 1, 1)
    assert stats.ram_used_bytes <= stats.ram_budget_bytes


def test_close_leaves_every_ram_entry_on_disk(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=1 << 22)
    disk = disk_tier(store)
    real_put = disk.put
    failing = True

    def flaky_put(snapshot):
        if failing:
            raise StoreUnavailable("simulated full disk")
        return real_put(snapshot)

    monkeypatch.setattr(disk, "put", flaky_put)
    keys = [add(store, n) for n in range(5, 12)]
    store.flush()
    assert store.stats().write_errors == 7
    assert store.stats().disk_entries == 0
    failing = False
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreUnavailable):
        store.get(keys[0])
    with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=1 << 22) as reopened:
        assert reopened.stats().disk_entries == 7
        for n, key in zip(range(5, 12), keys, strict=True):
            assert_right(reopened.get(key), n)
        assert_right(reopened.lookup(FP, SCOPE, DOC[:100]), 11)


def test_a_disk_write_failure_keeps_the_ram_copy(
    directory: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=1 << 22) as store:
        disk = disk_tier(store)
        real_put = disk.put
        monkeypatch.setattr(disk, "put", lambda s: (_ for _ in ()).throw(StoreUnavailable("disk full")))
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            key = add(store, 30)
            store.flush()
        assert "disk full" in caplog.text
        assert store.stats().write_errors == 1
        assert_right(store.get(key), 30)
        assert_right(store.lookup(FP, SCOPE, DOC[:40]), 30)
        monkeypatch.setattr(disk, "put", real_put)
        later = add(store, 31)  # later writes are tried again
        store.flush()
        assert later in disk
        assert key not in disk
        assert store.stats().write_errors == 1


# -- lookup -----------------------------------------------------------------------------------------


def test_lookup_returns_the_longest_stored_prefix(small: SnapshotStore) -> None:
    for n in (10, 40, 25):
        add(small, n)
    add(small, 35, doc=OTHER_DOC)
    assert_right(small.lookup(FP, SCOPE, DOC[:100]), 40)
    assert_right(small.lookup(FP, SCOPE, DOC[:40]), 40)
    assert_right(small.lookup(FP, SCOPE, DOC[:39]), 25)
    assert_right(small.lookup(FP, SCOPE, DOC[:12]), 10)
    assert small.lookup(FP, SCOPE, DOC[:9]) is None
    assert_right(small.lookup(FP, SCOPE, OTHER_DOC[:36]), 35, OTHER_DOC)
    diverging = np.concatenate([DOC[:30], OTHER_DOC[:20]])
    assert_right(small.lookup(FP, SCOPE, diverging), 25)
    assert small.lookup(FP, SCOPE, []) is None


def test_lookup_searches_both_tiers(small: SnapshotStore) -> None:
    add(small, 60)  # will be evicted from RAM by the three shorter ones
    for n in (10, 20, 30):
        add(small, n)
    small.flush()
    assert small.stats().ram_evictions == 1
    assert_right(small.lookup(FP, SCOPE, DOC[:100]), 60)
    assert small.stats().disk_hits == 1


def test_the_same_tokens_again_replace_the_snapshot_everywhere(directory: Path) -> None:
    # Two matches of equal length are prefixes of one query, so they hold the same tokens and thus
    # share one key: the tie rules only ever choose between the RAM and disk views of that key.
    with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=1 << 22) as store:
        key = add(store, 20, priority=3)
        store.flush()
        snap = store.lookup(FP, SCOPE, DOC[:50])
        assert_right(snap, 20)
        assert snap is not None
        assert snap.priority == 3
        add(store, 20, priority=-2)
        store.flush()
        snap = store.lookup(FP, SCOPE, DOC[:50])
        assert snap is not None
        assert snap.priority == -2
        assert len(store.entries()) == 1
        store.close()
    with SnapshotStore(directory, ram_bytes=0) as reopened:
        snap = reopened.get(key)
        assert snap is not None
        assert snap.priority == -2


def test_scope_and_fingerprint_isolate(small: SnapshotStore) -> None:
    add(small, 20, scope="a")
    add(small, 30, scope="b")
    add(small, 40, fp="other-model")
    assert_right(small.lookup(FP, "a", DOC[:100]), 20)
    assert_right(small.lookup(FP, "b", DOC[:100]), 30)
    assert_right(small.lookup("other-model", SCOPE, DOC[:100]), 40)
    assert small.lookup(FP, SCOPE, DOC[:100]) is None
    assert small.lookup(FP, "c", DOC[:100]) is None
    assert small.get(SnapshotKey.for_tokens(FP, "a", DOC[:30])) is None
    assert {row.key.scope for row in small.entries(scope="a")} == {"a"}
    assert {row.key.model_fingerprint for row in small.entries(model_fingerprint="other-model")} == {
        "other-model"
    }


def test_lookup_sees_what_another_store_wrote(directory: Path) -> None:
    with (
        SnapshotStore(directory, ram_bytes=1 << 20) as reader,
        SnapshotStore(directory, ram_bytes=1 << 20) as writer,
    ):
        assert reader.lookup(FP, SCOPE, DOC[:100]) is None
        add(writer, 30)
        writer.flush()
        assert_right(reader.lookup(FP, SCOPE, DOC[:100]), 30)
        add(writer, 70)
        writer.flush()
        assert_right(reader.lookup(FP, SCOPE, DOC[:100]), 70)
        # Each process's RAM tier is its own; the shared disk shows another's removal at once.
        with SnapshotStore(directory, ram_bytes=0) as disk_reader:
            assert_right(disk_reader.lookup(FP, SCOPE, DOC[:100]), 70)
            writer.remove(SnapshotKey.for_tokens(FP, SCOPE, DOC[:70]))
            assert_right(disk_reader.lookup(FP, SCOPE, DOC[:100]), 30)


def test_the_disk_catalog_is_read_again_only_when_it_changed(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        SnapshotStore(directory, ram_bytes=0, background_writes=False) as store,
        SnapshotStore(directory, ram_bytes=0, background_writes=False) as other,
    ):
        disk = store._disk
        assert disk is not None
        reads: list[str] = []
        read_catalog = disk.catalog
        monkeypatch.setattr(disk, "catalog", lambda fp, scope: reads.append(scope) or read_catalog(fp, scope))
        add(store, 30)
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)
        assert reads == [SCOPE]
        # Disk hits record their use in the index: no change to the catalog, no re-read.
        for _ in range(3):
            assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)
            assert_right(store.get(SnapshotKey.for_tokens(FP, SCOPE, DOC[:30])), 30)
        assert_right(other.lookup(FP, SCOPE, DOC[:100]), 30)  # another process's hit too
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)
        assert reads == [SCOPE]
        # This store's own writes and removals are applied to its catalog in place.
        add(store, 60)
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 60)
        store.remove(SnapshotKey.for_tokens(FP, SCOPE, DOC[:60]))
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)
        assert reads == [SCOPE]
        # Another process's writes and removals are seen at the next lookup.
        add(other, 80)
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 80)
        other.remove(SnapshotKey.for_tokens(FP, SCOPE, DOC[:80]))
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)
        assert reads == [SCOPE] * 3


def test_an_own_put_that_evicts_updates_the_catalog(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20, background_writes=False) as probe:
        add(probe, 20)
        file_bytes = probe.stats().disk_used_bytes
    with SnapshotStore(
        directory, ram_bytes=0, disk_bytes=int(file_bytes * 2.5), background_writes=False
    ) as store:
        add(store, 40)
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 40)
        add(store, 60)  # evicts 20, the least recently used
        assert {row.key.token_count for row in store.entries()} == {40, 60}
        cached = store._catalogs.cached(FP, SCOPE)
        assert cached is not None
        version, catalog = cached
        assert version == disk_tier(store).data_version()  # type: ignore[attr-defined]
        cataloged = catalog.keys()
        assert {key.token_count for key in cataloged} == {40, 60}
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 60)
        assert store.lookup(FP, SCOPE, DOC[:30]) is None


def test_a_corrupted_file_is_a_miss_and_lookup_falls_back(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0) as store:
        add(store, 10)
        add(store, 30)
        store.flush()
        (longest,) = [row for row in store.entries() if row.key.token_count == 30]
        files = sorted((directory / "snapshots").glob(f"{longest.key.id}-*.snap"))
        assert len(files) == 1
        data = bytearray(files[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        files[0].write_bytes(bytes(data))
        assert store.get(longest.key) is None
        add(store, 30)
        store.flush()
        files = sorted((directory / "snapshots").glob(f"{longest.key.id}-*.snap"))
        data = bytearray(files[0].read_bytes())
        data[-1] ^= 0xFF
        files[0].write_bytes(bytes(data))
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 10)


# -- errors and arguments ---------------------------------------------------------------------------


def test_key_mismatch_is_a_snapcache_error_and_a_value_error(small: SnapshotStore) -> None:
    key = SnapshotKey.for_tokens(FP, SCOPE, DOC[:10])
    with pytest.raises(KeyMismatch) as info:
        small.put(key, DOC[:11], b"state")
    assert isinstance(info.value, SnapcacheError)
    assert isinstance(info.value, ValueError)
    assert small.get(key) is None


@pytest.mark.parametrize(
    "kwargs",
    [{"ram_bytes": -1}, {"disk_bytes": -5}, {"ram_bytes": 2.0}, {"ram_bytes": 0, "disk_bytes": 0}],
)
def test_invalid_store_arguments(directory: Path, kwargs: dict) -> None:
    with pytest.raises(InvalidArgument):
        SnapshotStore(directory, **kwargs)


def test_invalid_call_arguments(small: SnapshotStore) -> None:
    key = SnapshotKey.for_tokens(FP, SCOPE, DOC[:10])
    for priority in (1.0, True, 10**7, -(10**7), "1"):
        with pytest.raises(InvalidArgument):
            small.put(key, DOC[:10], b"x", priority=priority)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        small.lookup(FP, "", DOC[:10])
    with pytest.raises(InvalidArgument):
        small.lookup(FP, SCOPE, [1.5, 2.5])
    with pytest.raises(InvalidArgument):
        small.lookup("", SCOPE, DOC[:10])
    with pytest.raises(InvalidArgument):
        small.put(key, DOC[:10], "not bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        small.get("abc")  # type: ignore[arg-type]
    assert small.stats().hits == small.stats().misses == 0


def test_a_snapshot_too_large_for_every_tier_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with SnapshotStore(None, ram_bytes=1_000) as store:
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            assert store.put(SnapshotKey.for_tokens(FP, SCOPE, DOC[:10]), DOC[:10], b"x" * 5_000) is None
        assert "dropped" in caplog.text
        assert store.stats().dropped == 1
        assert store.stats().ram_entries == 0


# -- configurations ---------------------------------------------------------------------------------


def test_ram_only_store(monkeypatch: pytest.MonkeyPatch, snapcache_dir: Path) -> None:
    with SnapshotStore(None, ram_bytes=2 * cost(10) + 50) as store:
        assert store.directory is None
        keys = [add(store, n) for n in (10, 10 + 1, 10 + 2)]
        assert store.get(keys[0]) is None  # evicted, and there is no disk to keep it
        assert_right(store.lookup(FP, SCOPE, DOC[:50]), 12)
        stats = store.stats()
        assert (stats.ram_entries, stats.disk_entries, stats.spills) == (2, 0, 0)
        assert [row.tiers for row in store.entries()] == [("ram",), ("ram",)]  # type: ignore[attr-defined]
        with pytest.raises(InvalidArgument):
            store.check()
    assert not snapcache_dir.exists()


def test_disk_only_store(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 22) as store:
        key = add(store, 15)
        assert_right(store.get(key), 15)  # from the write queue or the disk
        store.flush()
        assert_right(store.get(key), 15)
        assert_right(store.lookup(FP, SCOPE, DOC[:20]), 15)
        stats = store.stats()
        assert (stats.ram_entries, stats.ram_used_bytes, stats.disk_entries, stats.promotions) == (0, 0, 1, 0)
        (row,) = store.entries()
        assert isinstance(row, StoreEntry)
        assert row.tiers == ("disk",)


def test_default_directory_and_secret_come_from_the_environment(
    snapcache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPCACHE_SECRET", "one secret")
    with SnapshotStore(ram_bytes=0) as store:
        assert store.directory == snapcache_dir
        key = add(store, 12)
    assert any(snapcache_dir.rglob("*.snap"))
    with SnapshotStore(ram_bytes=0, secret="one secret") as same:
        assert_right(same.get(key), 12)
    monkeypatch.setenv("SNAPCACHE_SECRET", "another secret")
    with SnapshotStore(ram_bytes=0) as other:
        assert other.get(key) is None  # signed with another secret: refused, a miss


def test_remove_forgets_both_tiers(small: SnapshotStore) -> None:
    key = add(small, 25)
    small.flush()
    assert [row.tiers for row in small.entries()] == [("ram", "disk")]  # type: ignore[attr-defined]
    assert small.remove(key)
    assert not small.remove(key)
    assert small.get(key) is None
    assert small.lookup(FP, SCOPE, DOC[:30]) is None
    assert small.entries() == []


def test_stats_count_hits_and_misses_per_tier(small: SnapshotStore) -> None:
    keys = [add(small, n) for n in (10, 11, 12, 13)]  # 10 goes to disk only
    small.flush()
    assert small.get(keys[3]) is not None  # RAM hit
    assert small.get(keys[0]) is not None  # RAM miss, disk hit, promoted (evicts 11)
    assert small.get(SnapshotKey.for_tokens(FP, SCOPE, DOC[:99])) is None  # misses both
    assert small.lookup(FP, SCOPE, DOC[:5]) is None  # misses both
    small.flush()
    assert small.lookup(FP, SCOPE, DOC[:11]) is not None  # 11 was evicted by the promotion: disk hit
    stats = small.stats()
    assert (stats.hits, stats.misses) == (3, 2)
    assert (stats.ram_hits, stats.ram_misses) == (1, 4)
    assert (stats.disk_hits, stats.disk_misses) == (2, 2)
    assert stats.promotions == 2
    assert stats.ram_evictions == 3
    assert stats.evictions == stats.ram_evictions + stats.disk_evictions
    assert stats.ram_entries == 3
    assert stats.ram_used_bytes == cost(13) + cost(10) + cost(11)  # 12 went for the second promotion
    assert stats.ram_used_bytes <= stats.ram_budget_bytes
    assert stats.disk_entries == 4
    assert stats.disk_used_bytes == sum(row.nbytes for row in disk_tier(small).entries())


# -- threads ----------------------------------------------------------------------------------------


def test_threads_share_a_store(directory: Path) -> None:
    store = SnapshotStore(directory, ram_bytes=12 * cost(60), disk_bytes=40 * (cost(60) + 400))
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(150):
                n = rng.randrange(5, 60)
                doc = DOC if rng.random() < 0.5 else OTHER_DOC
                op = rng.random()
                key = SnapshotKey.for_tokens(FP, SCOPE, doc[:n])
                if op < 0.4:
                    store.put(key, doc[:n], state_for(doc[:n]), priority=rng.randrange(3))
                elif op < 0.6:
                    snap = store.get(key)
                    if snap is not None:
                        assert_right(snap, n, doc)
                elif op < 0.9:
                    snap = store.lookup(FP, SCOPE, doc[: n + 10])
                    if snap is not None:
                        assert_right(snap, snap.key.token_count, doc)
                else:
                    store.remove(key)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    store.flush()
    stats = store.stats()
    assert stats.ram_used_bytes <= stats.ram_budget_bytes
    assert stats.disk_used_bytes <= stats.disk_budget_bytes
    assert store._ram is not None
    assert stats.ram_used_bytes == sum(row.nbytes for row in store._ram.entries())
    assert store._writes is not None
    assert not list(store._writes.snapshots())
    assert set(store._memory_index.keys()) == {row.key for row in store._ram.entries()}
    for snap in store._ram.snapshots():
        assert snap.key.matches(snap.tokens)
        assert bytes(snap.state) == state_for(snap.tokens)
    store.close()
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=40 * (cost(60) + 400)) as reopened:
        assert reopened.check(repair=False).ok
        rows = reopened.entries()
        assert rows
        for row in rows:  # a disk-only store evicts nothing on reads: every row is served
            snap = reopened.get(row.key)
            assert snap is not None
            assert row.key.matches(snap.tokens)
            assert bytes(snap.state) == state_for(snap.tokens)


# -- review fixes -----------------------------------------------------------------------------------


def test_a_ram_only_put_too_large_for_ram_drops_the_older_snapshot_too() -> None:
    with SnapshotStore(None, ram_bytes=cost(10) + 100) as store:
        key = add(store, 10)
        assert_right(store.get(key), 10)
        assert store.put(key, DOC[:10], state_for(DOC[:10], 2 * STATE)) is None
        assert store.get(key) is None  # the older state must not stand in for the newer one
        assert store.lookup(FP, SCOPE, DOC[:50]) is None
        assert store.entries() == []
        assert store.stats().ram_used_bytes == 0


def test_lookup_with_tier_names_the_tier_that_served(small: SnapshotStore) -> None:
    first = add(small, 10)
    for n in range(11, 14):  # evict 10 from RAM
        add(small, n)
    small.flush()
    assert first not in small._ram  # type: ignore[operator]
    found = small.lookup_with_tier(FP, SCOPE, DOC[:10])
    assert found is not None
    assert_right(found[0], 10)
    assert found[1] == "disk"
    found = small.lookup_with_tier(FP, SCOPE, DOC[:10])  # promoted by the disk hit
    assert found is not None
    assert found[1] == "ram"
    found = small.lookup_with_tier(FP, SCOPE, DOC[:12] + 1)
    assert found is None
    stats = small.stats()
    assert (stats.disk_hits, stats.ram_hits, stats.misses) == (1, 1, 1)


def test_lookup_with_tier_of_a_disk_only_store_says_disk(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 22) as store:
        add(store, 15)
        found = store.lookup_with_tier(FP, SCOPE, DOC[:20])  # from the write queue or the disk
        assert found is not None
        assert found[1] == "disk"
        assert_right(found[0], 15)


def test_a_transient_disk_read_failure_does_not_hide_the_entry(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcache.disk import files as disk_files

    with SnapshotStore(directory, ram_bytes=0, background_writes=False) as store:
        add(store, 30)
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)  # the catalog is read and cached
        real_read = disk_files.read_file
        failures = []

        def failing_read(path: Path, *, reuse: bool = False) -> memoryview:
            if not failures:
                failures.append(path)
                raise PermissionError(13, "Permission denied")
            return real_read(path, reuse=reuse)

        monkeypatch.setattr(disk_files, "read_file", failing_read)
        assert store.lookup(FP, SCOPE, DOC[:100]) is None
        assert failures
        # The catalog has not changed, so it is not read again: the entry must still be in it.
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)


def test_a_lasting_disk_miss_is_forgotten_by_the_catalog(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0, background_writes=False) as store:
        key = add(store, 30)
        assert_right(store.lookup(FP, SCOPE, DOC[:100]), 30)
        (path,) = (directory / "snapshots").glob(f"{key.id}-*.snap")
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        assert store.lookup(FP, SCOPE, DOC[:100]) is None
        cached = store._catalogs.cached(FP, SCOPE)
        assert cached is not None
        assert key not in cached[1]
        assert not path.exists()


def test_the_disk_budget_is_recorded_and_reused(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 22, background_writes=False) as store:
        for n in range(10, 20):
            add(store, n)
        used = store.stats().disk_used_bytes
    with SnapshotStore(directory, ram_bytes=0, background_writes=False) as default:
        stats = default.stats()
        assert stats.disk_budget_bytes == 1 << 22  # not the 8 GiB default
        assert (stats.disk_entries, stats.disk_used_bytes) == (10, used)
    # A smaller explicit budget is recorded and enforced at once.
    small_budget = used // 2
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=small_budget, background_writes=False) as store:
        stats = store.stats()
        assert stats.disk_budget_bytes == small_budget
        assert 0 < stats.disk_used_bytes <= small_budget
        assert stats.disk_evictions == 10 - stats.disk_entries
        assert len(list((directory / "snapshots").glob("*.snap"))) == stats.disk_entries
    with SnapshotStore(directory, ram_bytes=0, background_writes=False) as default:
        assert default.stats().disk_budget_bytes == small_budget


def test_a_directory_without_a_recorded_budget_gets_the_default(directory: Path) -> None:
    with SnapshotStore(directory, ram_bytes=0) as store:
        assert store.stats().disk_budget_bytes == 8 << 30
        add(store, 10)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 22) as store:
        assert store.stats().disk_budget_bytes == 1 << 22
