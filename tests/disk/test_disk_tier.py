"""The disk tier: durable files under an exact budget, shared by processes, never serving bad bytes."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import shutil
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from reliability_workers.disk_files import garbage_inside, garbage_over

from snapcache.disk.cache_dir import default_cache_dir, prepare_cache_dir
from snapcache.disk.disk_tier import FILES_DIR, INDEX_NAME, TEMP_PREFIX, DiskTier
from snapcache.errors import (
    InsecureDirectory,
    InvalidArgument,
    KeyMismatch,
    SnapcacheError,
    StoreUnavailable,
)
from snapcache.formats import snapshot_file
from snapcache.formats.codec import StateCodec
from snapcache.key import SnapshotKey, rolling_hash
from snapcache.snapshot import Snapshot

STATE_BYTES = 40_000
MB = 1 << 20


def make_snapshot(
    seed: int,
    *,
    n_tokens: int = 50,
    state_bytes: int = STATE_BYTES,
    priority: int = 0,
    fingerprint: str = "fp-a",
    scope: str = "default",
    logits: bool = False,
) -> Snapshot:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 32_000, n_tokens, dtype=np.int32)
    tokens.flags.writeable = False
    state = rng.integers(0, 256, state_bytes, dtype=np.uint8).tobytes()  # incompressible: sizes stay put
    return Snapshot(
        key=SnapshotKey.for_tokens(fingerprint, scope, tokens),
        tokens=tokens,
        state=state,
        logits=rng.standard_normal(300).astype(np.float32) if logits else None,
        priority=priority,
        created_at=1_700_000_000.0 + seed,
    )


def assert_same(got: Snapshot | None, want: Snapshot) -> None:
    assert got is not None
    assert got.key == want.key
    assert bytes(got.state) == bytes(want.state)
    assert np.array_equal(got.tokens, want.tokens)
    assert not got.tokens.flags.writeable
    assert got.priority == want.priority
    assert got.created_at == want.created_at
    if want.logits is None:
        assert got.logits is None
    else:
        assert got.logits is not None
        assert np.array_equal(got.logits, want.logits)


def snapshot_files(directory: Path) -> list[Path]:
    return sorted((directory / FILES_DIR).iterdir())


def file_of(tier: DiskTier, snapshot: Snapshot) -> Path:
    (path,) = [p for p in snapshot_files(tier.directory) if p.name.startswith(snapshot.key.id)]
    return path


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def tier(tmp_path: Path):
    with_tier = DiskTier(tmp_path / "cache", 64 * MB)
    yield with_tier
    with_tier.close()


# -- round trips and persistence ---------------------------------------------------------------


@pytest.mark.parametrize("logits", [False, True])
def test_put_get_round_trip(tier: DiskTier, logits: bool) -> None:
    snap = make_snapshot(1, logits=logits, priority=7)
    assert tier.put(snap)
    assert snap.key in tier
    assert len(tier) == 1
    assert_same(tier.get(snap.key), snap)
    assert tier.get(make_snapshot(2).key) is None


def test_round_trip_of_odd_sized_compressible_state(tier: DiskTier) -> None:
    snap = make_snapshot(3)
    snap = Snapshot(snap.key, snap.tokens, bytes(12_345) + b"\x01", priority=-5)
    assert tier.put(snap)
    got = tier.get(snap.key)
    assert got is not None
    assert bytes(got.state) == bytes(snap.state)
    assert tier.used_bytes < 2_000  # compressed


def test_entries_describe_what_is_stored(tier: DiskTier) -> None:
    a = make_snapshot(1, priority=3)
    b = make_snapshot(2, scope="other")
    c = make_snapshot(3, fingerprint="fp-b")
    for snap in (a, b, c):
        assert tier.put(snap)
    rows = {row.key: row for row in tier.entries()}
    assert set(rows) == {a.key, b.key, c.key}
    row = rows[a.key]
    assert row.tier == "disk"
    assert row.priority == 3
    assert row.state_bytes == STATE_BYTES
    assert row.nbytes == file_of(tier, a).stat().st_size
    assert row.created_at == a.created_at
    assert row.rolling_hash == rolling_hash(a.tokens)
    assert {r.key for r in tier.entries("fp-a")} == {a.key, b.key}
    assert [r.key for r in tier.entries("fp-a", "default")] == [a.key]
    assert [r.key for r in tier.entries(scope="other")] == [b.key]
    assert tier.entries("nope") == []


def test_replace_keeps_one_file_and_exact_accounting(tier: DiskTier) -> None:
    first = make_snapshot(1)
    second = Snapshot(first.key, first.tokens, b"\x05" * 999, priority=4)
    assert tier.put(first)
    assert tier.put(second)
    assert len(tier) == 1
    assert len(snapshot_files(tier.directory)) == 1
    assert tier.used_bytes == sum(p.stat().st_size for p in snapshot_files(tier.directory))
    assert_same(tier.get(first.key), second)


def test_remove(tier: DiskTier) -> None:
    snap = make_snapshot(1)
    tier.put(snap)
    assert tier.remove(snap.key)
    assert not tier.remove(snap.key)
    assert snap.key not in tier
    assert tier.get(snap.key) is None
    assert snapshot_files(tier.directory) == []
    assert tier.used_bytes == 0


def test_reopened_directory_serves_everything_committed(tmp_path: Path) -> None:
    snaps = [make_snapshot(i, priority=i) for i in range(5)]
    first = DiskTier(tmp_path / "c", 64 * MB)
    for snap in snaps:
        assert first.put(snap)
    first.close()
    second = DiskTier(tmp_path / "c", 64 * MB)
    assert len(second) == 5
    for snap in snaps:
        assert_same(second.get(snap.key), snap)
    second.close()


def test_two_tiers_on_one_directory_see_each_others_writes(tmp_path: Path) -> None:
    one = DiskTier(tmp_path / "c", 64 * MB)
    two = DiskTier(tmp_path / "c", 64 * MB)
    before = two.data_version()
    assert two.data_version() == before  # stable while nothing changes
    snap = make_snapshot(1)
    assert one.put(snap)
    after_put = two.data_version()
    assert after_put != before
    assert_same(two.get(snap.key), snap)
    own = one.data_version()
    assert two.remove(snap.key)
    assert one.data_version() != own
    assert one.get(snap.key) is None
    one.close()
    two.close()


def test_data_version_counts_own_changes(tier: DiskTier) -> None:
    version = tier.data_version()
    snap = make_snapshot(1)
    tier.put(snap)
    assert tier.data_version() != version
    version = tier.data_version()
    tier.remove(snap.key)
    assert tier.data_version() != version


def test_data_version_ignores_reads_and_their_last_use(tmp_path: Path) -> None:
    one = DiskTier(tmp_path / "c", 64 * MB)
    two = DiskTier(tmp_path / "c", 64 * MB)
    snap = make_snapshot(1)
    one.put(snap)
    version = one.data_version()
    assert two.data_version() == version
    used = one.entries()[0].last_used_at
    time.sleep(0.002)
    assert_same(two.get(snap.key), snap)
    assert one.entries()[0].last_used_at > used  # the use was recorded in the index...
    assert_same(one.get(snap.key), snap)
    assert one.data_version() == two.data_version() == version  # ...and is no catalog change
    assert not two.remove(make_snapshot(2).key)  # nothing removed: no change
    assert one.data_version() == version
    one.close()
    two.close()


def test_on_change_reports_each_transaction_exactly(tmp_path: Path) -> None:
    from snapcache.disk.disk_tier import Change

    changes: list[Change] = []
    size = file_size(tmp_path)
    tier = DiskTier(tmp_path / "c", int(size * 2.5), on_change=changes.append)
    a, b, c = make_snapshot(1), make_snapshot(2), make_snapshot(3)
    for snap in (a, b):
        assert tier.put(snap)
    assert tier.put(c)  # evicts a
    assert tier.remove(b.key)
    assert tier.get(a.key) is None
    assert [([r.key() for r in ch.added], [r.key() for r in ch.removed]) for ch in changes] == [
        ([a.key], []),
        ([b.key], []),
        ([c.key], [a.key]),
        ([], [b.key]),
    ]
    for earlier, later in itertools.pairwise(changes):
        assert earlier.after == later.before  # nothing else wrote in between
    assert changes[-1].after == tier.data_version()
    tier.close()


def test_catalog_gives_the_lookup_fields_of_one_group(tier: DiskTier) -> None:
    a = make_snapshot(1, priority=3)
    b = make_snapshot(2, n_tokens=70)
    other = make_snapshot(3, scope="other")
    for snap in (a, b, other):
        assert tier.put(snap)
    catalog = tier.catalog("fp-a", "default")
    assert catalog.generation == tier.data_version()
    rows = {(row[0], row[1]): row for row in catalog.rows}
    assert set(rows) == {(s.key.token_count, s.key.prefix_hash) for s in (a, b)}
    row = rows[(a.key.token_count, a.key.prefix_hash)]
    assert row == (a.key.token_count, a.key.prefix_hash, rolling_hash(a.tokens))  # unsigned, as lookup
    assert tier.catalog("fp-b", "default").rows == []


def test_put_validates_tokens_against_key(tier: DiskTier) -> None:
    snap = make_snapshot(1)
    other = make_snapshot(2)
    with pytest.raises(KeyMismatch):
        tier.put(Snapshot(snap.key, other.tokens, snap.state))
    assert len(tier) == 0


@pytest.mark.parametrize(("priority", "created_at"), [(10**7, 1.0), (1, float("nan")), (1, float("inf"))])
def test_put_refuses_values_it_could_not_read_back(tier: DiskTier, priority: int, created_at: float) -> None:
    snap = make_snapshot(1)
    with pytest.raises(InvalidArgument):
        tier.put(Snapshot(snap.key, snap.tokens, snap.state, priority=priority, created_at=created_at))
    assert len(tier) == 0
    assert snapshot_files(tier.directory) == []


def test_closed_tier_refuses_work(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "c", MB)
    tier.close()
    tier.close()  # idempotent
    with pytest.raises(StoreUnavailable):
        tier.put(make_snapshot(1))


@pytest.mark.parametrize("budget", [-1, 1.5, True, "10"])
def test_invalid_budget(tmp_path: Path, budget: object) -> None:
    with pytest.raises(InvalidArgument):
        DiskTier(tmp_path / "c", budget)  # type: ignore[arg-type]


# -- budget and eviction -------------------------------------------------------------------------


def file_size(tmp_path: Path) -> int:
    probe = DiskTier(tmp_path / "probe", 64 * MB)
    probe.put(make_snapshot(99))
    size = probe.used_bytes
    probe.close()
    return size


def test_budget_holds_exactly(tmp_path: Path) -> None:
    size = file_size(tmp_path)
    budget = int(size * 3.5)
    tier = DiskTier(tmp_path / "c", budget)
    for i in range(12):
        assert tier.put(make_snapshot(i))
        on_disk = sum(p.stat().st_size for p in snapshot_files(tier.directory))
        assert on_disk == tier.used_bytes <= budget
    assert len(tier) == 3
    assert tier.evictions == 9
    tier.close()


def test_eviction_drops_lowest_priority_then_least_recently_used(tmp_path: Path) -> None:
    size = file_size(tmp_path)
    tier = DiskTier(tmp_path / "c", int(size * 3.5))
    a, b, c = make_snapshot(1), make_snapshot(2, priority=5), make_snapshot(3)
    for snap in (a, b, c):
        assert tier.put(snap)
        time.sleep(0.002)
    assert tier.get(a.key) is not None  # a is now more recent than c
    time.sleep(0.002)
    d = make_snapshot(4)
    assert tier.put(d)
    assert {row.key for row in tier.entries()} == {a.key, b.key, d.key}  # c: priority 0, least recent
    time.sleep(0.002)
    e = make_snapshot(5)
    assert tier.put(e)
    assert {row.key for row in tier.entries()} == {b.key, d.key, e.key}  # then a
    assert tier.evictions == 2
    assert tier.get(c.key) is None
    tier.close()


def test_entry_larger_than_budget_is_refused_without_evicting(tmp_path: Path) -> None:
    size = file_size(tmp_path)
    tier = DiskTier(tmp_path / "c", int(size * 2.5))
    small = [make_snapshot(1), make_snapshot(2)]
    for snap in small:
        assert tier.put(snap)
    huge = make_snapshot(3, state_bytes=STATE_BYTES * 3)
    assert not tier.put(huge)
    assert huge.key not in tier
    assert {row.key for row in tier.entries()} == {s.key for s in small}
    assert tier.evictions == 0
    assert len(snapshot_files(tier.directory)) == 2
    tier.close()


def test_zero_budget_stores_nothing(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "c", 0)
    assert not tier.put(make_snapshot(1))
    assert len(tier) == 0
    assert snapshot_files(tier.directory) == []
    tier.close()


# -- check() -------------------------------------------------------------------------------------


def test_check_finds_and_repairs_debris(tier: DiskTier) -> None:
    kept, lost = make_snapshot(1), make_snapshot(2)
    for snap in (kept, lost):
        tier.put(snap)
    files = tier.directory / FILES_DIR
    file_of(tier, lost).unlink()  # row without file
    orphan = files / f"{'ab' * 32}-{'0' * 12}.snap"  # file without row
    shutil.copyfile(file_of(tier, kept), orphan)
    stale = files / f"{TEMP_PREFIX}crashed.partial"
    stale.write_bytes(b"half a snapshot")
    fresh = files / f"{TEMP_PREFIX}in-flight.partial"  # a writer that is still running
    fresh.write_bytes(b"being written")
    for path in (orphan, stale):
        age(path, 3600)

    report = tier.check(repair=False)
    assert not report.ok
    assert report.missing_files == (lost.key.id,)
    assert report.orphan_files == (orphan.name,)
    assert report.temp_files == (stale.name,)
    assert report.corrupt_files == ()
    assert orphan.exists()
    assert stale.exists()
    assert len(tier) == 2

    repaired = tier.check(repair=True)
    assert repaired.repaired
    assert repaired.missing_files == report.missing_files
    assert not orphan.exists()
    assert not stale.exists()
    assert fresh.exists()
    assert len(tier) == 1
    assert tier.check().ok
    assert_same(tier.get(kept.key), kept)


def test_check_with_zero_grace_removes_fresh_temp_files(tier: DiskTier) -> None:
    fresh = tier.directory / FILES_DIR / f"{TEMP_PREFIX}x.partial"
    fresh.write_bytes(b"x")
    assert tier.check(grace_seconds=3600).ok
    assert tier.check(grace_seconds=0).temp_files == (fresh.name,)
    assert not fresh.exists()


def test_check_verify_finds_corrupt_files(tier: DiskTier, caplog: pytest.LogCaptureFixture) -> None:
    good, bad = make_snapshot(1), make_snapshot(2)
    tier.put(good)
    tier.put(bad)
    path = file_of(tier, bad)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert tier.check(repair=False).ok  # structure only
    report = tier.check(repair=True, verify=True)
    assert report.corrupt_files == (path.name,)
    assert not path.exists()
    assert bad.key not in tier
    assert_same(tier.get(good.key), good)
    assert "failed verification" in caplog.text


# -- permissions and the directory -----------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_files_and_directories_are_private(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        tier = DiskTier(tmp_path / "cache", 64 * MB)
        tier.put(make_snapshot(1))
        tier.get(make_snapshot(1).key)
        paths = [tier.directory, *tier.directory.rglob("*")]  # SQLite's -wal and -shm exist now
    finally:
        os.umask(old)
    names = {p.name for p in paths}
    assert {INDEX_NAME, f"{INDEX_NAME}-wal", f"{INDEX_NAME}-shm", FILES_DIR} <= names
    for path in paths:
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    tier.close()


def test_missing_parents_are_created_private(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c"
    DiskTier(path, MB).close()
    for directory in (tmp_path / "a", tmp_path / "a" / "b", path):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_world_writable_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCACHE_ALLOW_SHARED_DIR", raising=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InsecureDirectory) as info:
        DiskTier(shared, MB)
    assert isinstance(info.value, StoreUnavailable)
    assert isinstance(info.value, PermissionError)
    assert isinstance(info.value, SnapcacheError)
    message = str(info.value)
    assert str(shared) in message
    assert "chmod" in message
    assert "allow_shared_dir=True" in message
    DiskTier(shared, MB, allow_shared_dir=True).close()
    monkeypatch.setenv("SNAPCACHE_ALLOW_SHARED_DIR", "1")
    DiskTier(shared, MB).close()


def test_group_writable_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCACHE_ALLOW_SHARED_DIR", raising=False)
    path = tmp_path / "group"
    path.mkdir()
    path.chmod(0o770)
    with pytest.raises(InsecureDirectory):
        prepare_cache_dir(path, allow_shared=False)
    path.chmod(0o700)
    assert prepare_cache_dir(path, allow_shared=False) == path


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(InsecureDirectory, match="another user"):
        prepare_cache_dir(path, allow_shared=False)


def test_unusable_directory_is_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable) as info:
        DiskTier(blocker / "cache", MB)
    assert not isinstance(info.value, InsecureDirectory)
    assert str(blocker / "cache") in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(StoreUnavailable, match="not a directory"):
        prepare_cache_dir(blocker, allow_shared=False)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_directory_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "ro"
    path.mkdir(mode=0o500)
    with pytest.raises(StoreUnavailable, match="not writable"):
        DiskTier(path, MB)


def test_default_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPCACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv("SNAPCACHE_DIR")
    assert default_cache_dir().name == "snapcache"


# -- secrets and bad files -------------------------------------------------------------------------


def test_secret_files_carry_a_mac_and_other_secrets_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "c"
    snap = make_snapshot(1)
    with_secret = DiskTier(directory, 64 * MB, secret=b"s3cret")
    assert with_secret.put(snap)
    path = file_of(with_secret, snap)
    raw = path.read_bytes()
    assert int.from_bytes(raw[10:12], "little") & snapshot_file.FLAG_MAC
    assert_same(with_secret.get(snap.key), snap)
    with_secret.close()

    # A misconfigured reader misses, and leaves the file and its row to the readers it belongs to.
    other = DiskTier(directory, 64 * MB, secret=b"another")
    assert other.get(snap.key) is None
    assert "MAC mismatch" in caplog.text
    assert snap.key in other
    assert path.read_bytes() == raw
    other.close()
    assert_same(DiskTier(directory, 64 * MB, secret=b"s3cret").get(snap.key), snap)

    # A file without MAC is refused by a tier with a secret, and the other way round.
    plain = DiskTier(directory, 64 * MB)
    plain.put(snap)
    assert DiskTier(directory, 64 * MB, secret=b"s3cret").get(snap.key) is None
    assert "carries no MAC" in caplog.text
    assert_same(plain.get(snap.key), snap)  # still there for the tier without a secret
    keyed = DiskTier(directory, 64 * MB, secret=b"s3cret")
    keyed.put(snap)
    assert plain.get(snap.key) is None
    assert "authenticated with a secret" in caplog.text
    assert_same(keyed.get(snap.key), snap)


def test_an_unauthenticated_file_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "c"
    snap = make_snapshot(1)
    DiskTier(directory, 64 * MB, secret=b"s3cret").put(snap)
    reader = DiskTier(directory, 64 * MB, secret=b"another")
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        for _ in range(5):
            assert reader.get(snap.key) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "MAC" in r.getMessage()]
    assert len(warnings) == 1
    assert "kept" in warnings[0].getMessage()
    reader.close()


def test_check_keeps_files_authenticated_under_another_secret(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    signed, damaged = make_snapshot(1), make_snapshot(2)
    owner = DiskTier(directory, 64 * MB, secret=b"s3cret")
    owner.put(signed)
    owner.put(damaged)
    path = file_of(owner, damaged)
    data = bytearray(path.read_bytes())
    data[16] ^= 0x01  # the header: its digest fails before any MAC is looked at
    path.write_bytes(bytes(data))
    stranger = DiskTier(directory, 64 * MB, secret=b"another")
    report = stranger.check(repair=True, verify=True)
    assert report.unauthenticated_files == (file_of(owner, signed).name,)
    assert report.corrupt_files == (path.name,)
    assert not path.exists()
    assert signed.key in stranger
    assert_same(owner.get(signed.key), signed)
    assert owner.check(repair=False, verify=True).ok
    owner.close()
    stranger.close()


def damage_flip(data: bytearray, at: int) -> bytearray:
    data[at] ^= 0x04
    return data


DAMAGES = {
    "flip magic": lambda d: damage_flip(d, 0),
    "flip version": lambda d: damage_flip(d, 8),
    "flip header length": lambda d: damage_flip(d, 13),
    "flip header": lambda d: damage_flip(d, 40),
    "flip header digest": lambda d: damage_flip(d, _header_end(d) + 3),
    "flip tokens": lambda d: damage_flip(d, _header_end(d) + 40),
    "flip logits": lambda d: damage_flip(d, _header_end(d) + 32 + 4 * 50 + 8),
    "flip payload": lambda d: damage_flip(d, len(d) // 2 + 300),
    "flip last byte": lambda d: damage_flip(d, len(d) - 1),
    "truncate": lambda d: d[:-1],
    "truncate to header": lambda d: d[:100],
    "empty": lambda d: bytearray(),
    "append": lambda d: d + b"\x00",
    "append frame": lambda d: d + d[-200:],
}


def _header_end(data: bytearray) -> int:
    return 16 + int.from_bytes(data[12:16], "little")


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_file_is_a_logged_miss_and_removed(
    tier: DiskTier, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    snap = make_snapshot(1, logits=True)
    tier.put(snap)
    path = file_of(tier, snap)
    path.write_bytes(bytes(DAMAGES[damage](bytearray(path.read_bytes()))))
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        assert tier.get(snap.key) is None
    assert not path.exists()
    assert snap.key not in tier
    assert len(tier) == 0
    assert any(r.levelno == logging.WARNING and r.name == "snapcache" for r in caplog.records)
    assert path.name in caplog.text
    assert tier.put(snap)  # the key can be stored again
    assert_same(tier.get(snap.key), snap)


def test_file_copied_under_another_keys_name_is_a_miss(
    tier: DiskTier, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_snapshot(1), make_snapshot(2)
    tier.put(a)
    tier.put(b)
    shutil.copyfile(file_of(tier, a), file_of(tier, b))
    assert tier.get(b.key) is None
    assert "another key" in caplog.text
    assert b.key not in tier
    assert_same(tier.get(a.key), a)


def test_file_from_another_store_is_a_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    snap = make_snapshot(1)
    ours = DiskTier(tmp_path / "ours", 64 * MB)
    theirs = DiskTier(tmp_path / "theirs", 64 * MB)
    ours.put(snap)
    theirs.put(snap)
    # Same key, same size and a valid checksum: only the store id tells them apart.
    assert file_of(ours, snap).stat().st_size == file_of(theirs, snap).stat().st_size
    shutil.copyfile(file_of(theirs, snap), file_of(ours, snap))
    assert ours.get(snap.key) is None
    assert "another store" in caplog.text
    assert snap.key not in ours
    ours.close()
    theirs.close()


def test_planted_file_without_row_is_never_served(tier: DiskTier) -> None:
    snap = make_snapshot(1)
    other_dir = tier.directory.parent / "other"
    other = DiskTier(other_dir, 64 * MB)
    other.put(snap)
    shutil.copy(file_of(other, snap), tier.directory / FILES_DIR)
    assert tier.get(snap.key) is None
    other.close()


def test_index_row_naming_a_path_outside_is_ignored(tier: DiskTier, caplog: pytest.LogCaptureFixture) -> None:
    import sqlite3

    snap = make_snapshot(1)
    tier.put(snap)
    victim = tier.directory / "precious.txt"
    victim.write_text("keep me")
    with sqlite3.connect(tier.directory / INDEX_NAME) as conn:
        conn.execute("UPDATE entries SET file_name = '../precious.txt'")
    assert tier.get(snap.key) is None
    assert victim.read_text() == "keep me"
    assert "invalid file" in caplog.text


# -- several writers -------------------------------------------------------------------------------

_WRITER = """
import sys
from pathlib import Path
sys.path[:0] = sys.argv[4:]
from test_disk_tier import make_snapshot
from snapcache.disk.disk_tier import DiskTier
tier = DiskTier(Path(sys.argv[1]), int(sys.argv[2]))
first = int(sys.argv[3])
for seed in range(first, first + 15):
    # priority 0 may be kept out once priority 1 fills the budget; priority 1 always gets in
    assert tier.put(make_snapshot(seed, priority=seed % 2)) or seed % 2 == 0
    tier.get(make_snapshot(seed - 1).key)
tier.close()
"""


def test_processes_sharing_a_directory_never_overshoot_the_budget(tmp_path: Path) -> None:
    import subprocess
    import sys

    size = file_size(tmp_path)
    budget = int(size * 5.5)
    directory = tmp_path / "shared"
    DiskTier(directory, budget).close()
    repo = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRITER,
                str(directory),
                str(budget),
                str(100 * i + 1),
                str(repo),
                str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parents[1]),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outcomes = [(proc.communicate(timeout=120)[1], proc.returncode) for proc in procs]
    assert [code for _, code in outcomes] == [0, 0, 0], outcomes
    tier = DiskTier(directory, budget)
    on_disk = sum(p.stat().st_size for p in snapshot_files(directory))
    assert on_disk == tier.used_bytes <= budget
    assert len(tier) == 5
    assert tier.check(repair=False, verify=True, grace_seconds=0).ok
    for row in tier.entries():
        assert tier.get(row.key) is not None
    tier.close()


def test_threads_sharing_one_tier(tier: DiskTier) -> None:
    import threading

    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for seed in range(offset, offset + 10):
                snap = make_snapshot(seed)
                assert tier.put(snap)
                assert_same(tier.get(snap.key), snap)
                if seed % 3 == 0:
                    assert tier.remove(snap.key)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(100 * i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(tier) == sum(1 for i in range(4) for seed in range(100 * i, 100 * i + 10) if seed % 3)
    assert tier.check(repair=False, grace_seconds=0).ok


# -- forged headers: valid checksums, hostile contents ----------------------------------------------


def rewrite_header(path: Path, change) -> None:
    """Edit the JSON header of a file and recompute its header digest, as a forger without a secret could."""
    import hashlib
    import json
    import struct

    data = path.read_bytes()
    magic, version, flags, length = struct.unpack_from("<8sHHI", data)
    header = json.loads(data[16 : 16 + length])
    raw = change(header)
    new_header = raw if isinstance(raw, bytes) else json.dumps(header).encode()
    head = struct.pack("<8sHHI", magic, version, flags, len(new_header)) + new_header
    path.write_bytes(head + hashlib.sha256(head).digest() + data[16 + length + 32 :])


def _set(field: str, value: object):
    def change(header: dict) -> None:
        header[field] = value

    return change


FORGERIES = {
    "huge state": _set("state_bytes", 1 << 40),
    "negative state": _set("state_bytes", -1),
    "state size off by one": lambda h: h.__setitem__("state_bytes", h["state_bytes"] + 1),
    "huge payload": _set("payload_bytes", 1 << 45),
    "logits shape too big": _set("logits_shape", [1 << 20, 1 << 20]),
    "logits shape nested": _set("logits_shape", [[3]]),
    "logits shape bool": _set("logits_shape", [True]),
    "non-ascii digest": _set("body_sha256", "é" * 64),
    "short digest": _set("body_sha256", "ab"),
    "unknown codec": _set("codec", {"name": "lz4", "level": 1, "shuffle": 0}),
    "unknown shuffle": _set("codec", {"name": "zstd", "level": 1, "shuffle": 4}),
    "priority too big": _set("priority", 10**9),
    "created_at infinite": lambda h: b'{"created_at": 1e999}',
    "not an object": lambda h: b"[1, 2, 3]",
    "not json": lambda h: b"\xff\xfe{",
    "deeply nested": lambda h: b"[" * 30_000 + b"]" * 30_000,
    "other key": lambda h: h["key"].__setitem__("scope", "elsewhere"),
    "bad key": lambda h: h["key"].__setitem__("prefix_hash", "zz"),
    "token count mismatch": lambda h: h["key"].__setitem__("token_count", 10**9),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_forged_header_is_a_miss(tier: DiskTier, forgery: str, caplog: pytest.LogCaptureFixture) -> None:
    snap = make_snapshot(1, logits=True)
    tier.put(snap)
    path = file_of(tier, snap)
    rewrite_header(path, FORGERIES[forgery])
    assert tier.get(snap.key) is None
    assert not path.exists()
    assert "unusable" in caplog.text


def test_decode_checks_sizes_before_decompressing(tier: DiskTier, monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcache.formats import codec

    snap = make_snapshot(1)
    tier.put(snap)
    rewrite_header(file_of(tier, snap), _set("state_bytes", 1 << 40))
    calls = []
    monkeypatch.setattr(codec, "decompress", lambda *a, **k: calls.append(1))
    assert tier.get(snap.key) is None
    assert calls == []


def test_with_a_secret_the_mac_reaches_the_payload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tier = DiskTier(tmp_path / "c", 64 * MB, secret=b"k")
    snap = make_snapshot(1)
    tier.put(snap)
    path = file_of(tier, snap)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the zstd frame: the SHA-256 in the header catches it first
    path.write_bytes(bytes(data))
    assert tier.get(snap.key) is None
    assert "payload checksum mismatch" in caplog.text
    tier.close()


def test_payload_of_another_snapshot_is_refused(tier: DiskTier, caplog: pytest.LogCaptureFixture) -> None:
    a, b = make_snapshot(1), make_snapshot(2)  # same sizes, different states
    tier.put(a)
    tier.put(b)
    path_a, path_b = file_of(tier, a), file_of(tier, b)
    data_a, data_b = path_a.read_bytes(), path_b.read_bytes()
    assert len(data_a) == len(data_b)
    tail = STATE_BYTES  # the incompressible state is stored in raw zstd blocks of its own size
    path_a.write_bytes(data_a[:-tail] + data_b[-tail:])
    assert tier.get(a.key) is None
    assert "payload checksum differs" in caplog.text


# -- a damaged or lost index -------------------------------------------------------------------------


INDEX_DAMAGE = {
    "garbage over": garbage_over,
    "garbage inside": garbage_inside,
    "truncated to half": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "replaced by a directory": lambda path: (path.unlink(), path.mkdir()),
}
INDEX_LOSS = {
    "emptied": lambda path: path.write_bytes(b""),
    "deleted": lambda path: path.unlink(),
}


def fill_and_close(directory: Path, snaps: list[Snapshot], secret: bytes | None = None) -> None:
    tier = DiskTier(directory, 64 * MB, secret=secret)
    for snap in snaps:
        assert tier.put(snap)
    tier.close()
    for extra in directory.glob(f"{INDEX_NAME}-*"):  # what a crash may leave: nothing to recover
        extra.unlink()


@pytest.mark.parametrize("damage", [*INDEX_DAMAGE, *INDEX_LOSS])
def test_a_damaged_or_lost_index_is_rebuilt_from_the_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    from snapcache.disk.disk_tier import QUARANTINE_DIR

    directory = tmp_path / "c"
    snaps = [make_snapshot(i, priority=i, logits=i % 2 == 1, n_tokens=20 + i) for i in range(6)]
    fill_and_close(directory, snaps)
    {**INDEX_DAMAGE, **INDEX_LOSS}[damage](directory / INDEX_NAME)
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        tier = DiskTier(directory, 64 * MB)
    assert "rebuilt the snapshot index" in caplog.text
    for snap in snaps:
        assert_same(tier.get(snap.key), snap)
    rows = {row.key: row for row in tier.entries()}
    assert {key: row.priority for key, row in rows.items()} == {s.key: s.priority for s in snaps}
    assert {key: row.rolling_hash for key, row in rows.items()} == {
        s.key: rolling_hash(s.tokens) for s in snaps
    }
    assert tier.used_bytes == sum(p.stat().st_size for p in snapshot_files(directory))
    assert tier.check(repair=False, verify=True, grace_seconds=0).ok
    quarantine = directory / QUARANTINE_DIR
    if damage in INDEX_DAMAGE:
        assert "damaged" in caplog.text
        moved = list(quarantine.iterdir())
        assert [p.name.startswith(f"{INDEX_NAME}.") for p in moved] == [True]
        assert stat.S_IMODE(quarantine.stat().st_mode) == 0o700
    else:
        assert not quarantine.exists()
    # The rebuilt index is an index like any other: writes work, and a reopen needs no rebuild.
    extra = make_snapshot(50)
    assert tier.put(extra)
    tier.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        again = DiskTier(directory, 64 * MB)
    assert caplog.text == ""
    assert len(again) == len(snaps) + 1
    assert_same(again.get(extra.key), extra)
    again.close()


def test_a_rebuild_leaves_out_damaged_and_foreign_files_and_keeps_the_newest(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    good = [make_snapshot(i) for i in range(3)]
    damaged, moved, planted = make_snapshot(10), make_snapshot(11), make_snapshot(12)
    replaced = Snapshot(good[0].key, good[0].tokens, b"\x07" * 5000)
    fill_and_close(directory, [replaced])
    older = file_of_in(directory, replaced)
    kept_older = older.read_bytes()
    fill_and_close(directory, [*good, damaged, moved])  # replaces `replaced`: its file is deleted
    older.write_bytes(kept_older)  # as if a crash had left the replaced file behind
    age(older, 60)
    flip = file_of_in(directory, damaged)
    flip.write_bytes(bytes(damage_flip(bytearray(flip.read_bytes()), 40)))
    moved_path = file_of_in(directory, moved)
    os.replace(moved_path, moved_path.with_name(f"{good[1].key.id}-{'0' * 12}.snap"))
    theirs = tmp_path / "theirs"
    fill_and_close(theirs, [planted])
    shutil.copy(file_of_in(theirs, planted), directory / FILES_DIR)
    (directory / INDEX_NAME).write_bytes(b"not a database" * 300)

    tier = DiskTier(directory, 64 * MB)
    assert {row.key for row in tier.entries()} == {s.key for s in good}
    for snap in good:
        assert_same(tier.get(snap.key), snap)
    assert tier.get(planted.key) is None
    report = tier.check(repair=True, grace_seconds=0)  # the files left out are orphans now
    assert len(report.orphan_files) == 4
    assert tier.check(repair=False, verify=True, grace_seconds=0).ok
    tier.close()


def file_of_in(directory: Path, snapshot: Snapshot) -> Path:
    (path,) = [p for p in snapshot_files(directory) if p.name.startswith(snapshot.key.id)]
    return path


def test_a_rebuild_keeps_files_of_other_secrets_for_their_readers(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    signed, plain = make_snapshot(1), make_snapshot(2)
    fill_and_close(directory, [signed], secret=b"s3cret")
    tier = DiskTier(directory, 64 * MB)
    assert tier.put(plain)
    tier.close()
    garbage_over(directory / INDEX_NAME)

    rebuilt_by_signed = DiskTier(directory, 64 * MB, secret=b"s3cret")
    assert {row.key for row in rebuilt_by_signed.entries()} == {signed.key, plain.key}
    assert_same(rebuilt_by_signed.get(signed.key), signed)
    assert rebuilt_by_signed.get(plain.key) is None  # not authenticated: a miss, kept
    unsigned = DiskTier(directory, 64 * MB)
    assert_same(unsigned.get(plain.key), plain)
    assert unsigned.get(signed.key) is None
    rebuilt_by_signed.close()
    unsigned.close()


_OPENER = """
import sys
from pathlib import Path
sys.path[:0] = [sys.argv[2]]
from snapcache.disk.disk_tier import DiskTier
tier = DiskTier(Path(sys.argv[1]), 1 << 30)
print(len(tier))
tier.close()
"""


def test_processes_opening_a_damaged_index_together_rebuild_it_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    from snapcache.disk.disk_tier import QUARANTINE_DIR

    directory = tmp_path / "c"
    snaps = [make_snapshot(i) for i in range(8)]
    fill_and_close(directory, snaps)
    garbage_over(directory / INDEX_NAME)
    repo = str(Path(__file__).resolve().parents[2])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, str(directory), repo],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, outcomes
    assert [out.strip() for out, _ in outcomes] == ["8"] * 4
    assert sum("rebuilt" in err for _, err in outcomes) == 1
    assert len(list((directory / QUARANTINE_DIR).iterdir())) == 1
    tier = DiskTier(directory, 64 * MB)
    for snap in snaps:
        assert_same(tier.get(snap.key), snap)
    tier.close()


# -- the last-use update is best effort ----------------------------------------------------------------


def test_a_hit_does_not_wait_for_another_writer_to_record_its_use(tier: DiskTier) -> None:
    import sqlite3
    import threading

    snap = make_snapshot(1)
    assert tier.put(snap)
    used = tier.entries()[0].last_used_at
    blocker = sqlite3.connect(tier.directory / INDEX_NAME, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock for a long time
    got: list[Snapshot | None] = []
    reader = threading.Thread(target=lambda: got.append(tier.get(snap.key)))
    try:
        reader.start()
        reader.join(timeout=10)  # the index's own wait for a writer is 30 s
        assert not reader.is_alive(), "get waited for the writer's lock"
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        reader.join()
    assert_same(got[0], snap)
    assert tier.entries()[0].last_used_at == used  # not recorded: the hit stood anyway
    assert tier.remove(snap.key)  # and the index is writable again, no transaction left open
    assert tier.put(snap)
    assert_same(tier.get(snap.key), snap)


def test_a_hit_is_served_when_the_index_is_read_only(
    tier: DiskTier, caplog: pytest.LogCaptureFixture
) -> None:
    snap = make_snapshot(1)
    assert tier.put(snap)
    # As a read-only directory or a full disk would, refuse every write to the index.
    tier._index._conn.execute("PRAGMA query_only = ON")
    with caplog.at_level(logging.DEBUG, logger="snapcache"):
        assert_same(tier.get(snap.key), snap)
        assert_same(tier.get(snap.key), snap)
    assert "could not record the use" in caplog.text
    tier._index._conn.execute("PRAGMA query_only = OFF")
    assert tier.remove(snap.key)


# -- forged files: an intact header digest proves nothing, since anyone can compute it ---------------


def forge(snapshot: Snapshot, store_id: str, edit: Callable[[bytes], bytes] = lambda h: h) -> bytes:
    """A file for `snapshot` (tokens unchecked) whose header `edit` changed, with a fresh header digest."""
    encoded = snapshot_file.encode(
        snapshot, store_id=store_id, state_codec=StateCodec(level=3), mac_secret=None
    )
    data = b"".join(bytes(part) for part in encoded.parts)
    prelude = snapshot_file.PRELUDE
    magic, version, flags, length = prelude.unpack_from(data)
    header = edit(data[prelude.size : prelude.size + length])
    head = prelude.pack(magic, version, flags, len(header)) + header
    return head + hashlib.sha256(head).digest() + data[prelude.size + length + 32 :]


def negative_tokens(snapshot: Snapshot) -> Snapshot:
    tokens = np.full(snapshot.key.token_count, -1, dtype=np.int32)
    key = SnapshotKey(
        snapshot.key.model_fingerprint,
        snapshot.key.scope,
        len(tokens),
        hashlib.blake2b(tokens.tobytes(), digest_size=16, person=b"snapcache.tok1").hexdigest(),
    )
    return Snapshot(key, tokens, snapshot.state, created_at=snapshot.created_at)


def huge_created_at(header: bytes) -> bytes:
    return re.sub(rb'"created_at":[0-9.e+]+', b'"created_at":1' + b"0" * 400, header)


def two_dimensional_logits(header: bytes) -> bytes:
    return header.replace(b'"logits_shape":[300]', b'"logits_shape":[1,300]')


def empty_logits(header: bytes) -> bytes:
    return header.replace(b'"logits_shape":null', b'"logits_shape":[0]')


FOREIGN_FILES: dict[str, tuple[Callable[[Snapshot], Snapshot], Callable[[bytes], bytes], bool]] = {
    "negative-tokens": (negative_tokens, lambda h: h, False),
    "huge-created-at": (lambda s: s, huge_created_at, False),
    "2d-logits": (lambda s: s, two_dimensional_logits, True),
    "empty-logits": (lambda s: s, empty_logits, False),
}


def plant(tier: DiskTier, real: Snapshot, key: SnapshotKey, data: bytes) -> Path:
    """Put `real`, then replace its file with `data` and make its index row agree: `key`, the size."""
    assert tier.put(real)
    row = tier._index.get(real.key.id)
    assert row is not None
    path = tier.directory / FILES_DIR / row.file_name
    path.write_bytes(data)
    with sqlite3.connect(tier.directory / INDEX_NAME) as conn:
        conn.execute(
            "UPDATE entries SET key_id = ?, prefix_hash = ?, file_bytes = ? WHERE key_id = ?",
            (key.id, key.prefix_hash, len(data), row.key_id),
        )
    conn.close()
    return path


@pytest.mark.parametrize("forgery", FOREIGN_FILES, ids=str)
def test_a_forged_file_is_a_miss_and_removed(tier: DiskTier, forgery: str) -> None:
    change_snapshot, edit, logits = FOREIGN_FILES[forgery]
    real = make_snapshot(1, logits=logits)
    forged = change_snapshot(real)
    data = forge(forged, tier._store_id, edit)
    assert forged is not real or data != forge(forged, tier._store_id)  # the forgery took
    path = plant(tier, real, forged.key, data)
    assert tier.get(forged.key) is None
    assert not path.exists()
    assert forged.key not in tier


@pytest.mark.parametrize("forgery", FOREIGN_FILES, ids=str)
def test_a_forged_file_fails_verification_and_index_rebuild(tmp_path: Path, forgery: str) -> None:
    change_snapshot, edit, logits = FOREIGN_FILES[forgery]
    directory = tmp_path / "cache"
    tier = DiskTier(directory, 64 * MB)
    good = make_snapshot(2)
    assert tier.put(good)
    real = make_snapshot(1, logits=logits)
    forged = change_snapshot(real)
    path = plant(tier, real, forged.key, forge(forged, tier._store_id, edit))
    report = tier.check(repair=False, verify=True, grace_seconds=0)
    assert report.corrupt_files == (path.name,)
    tier.close()
    for suffix in ("", "-wal", "-shm"):
        (directory / (INDEX_NAME + suffix)).unlink(missing_ok=True)
    rebuilt = DiskTier(directory, 64 * MB)
    try:
        assert [row.key for row in rebuilt.entries()] == [good.key]
        assert_same(rebuilt.get(good.key), good)
        assert path.exists()  # unusable files are left to check(); they are never indexed
    finally:
        rebuilt.close()


def test_a_store_turns_a_forged_file_into_a_miss(tmp_path: Path) -> None:
    from snapcache.store import SnapshotStore

    with SnapshotStore(tmp_path / "cache", ram_bytes=0, background_writes=False) as store:
        disk = store._disk
        assert isinstance(disk, DiskTier)
        real = make_snapshot(1)
        forged = negative_tokens(real)
        plant(disk, real, forged.key, forge(forged, disk._store_id))
        assert store.get(forged.key) is None
        created = make_snapshot(3)
        plant(disk, created, created.key, forge(created, disk._store_id, huge_created_at))
        assert store.get(created.key) is None
        assert store.lookup(created.key.model_fingerprint, created.key.scope, created.tokens) is None
        assert store.stats().disk_entries == 0


def test_a_numpy_integer_priority_is_stored_as_an_int(tier: DiskTier) -> None:
    snap = make_snapshot(1)
    assert tier.put(Snapshot(snap.key, snap.tokens, snap.state, priority=np.int64(5)))  # type: ignore[arg-type]
    got = tier.get(snap.key)
    assert got is not None
    assert type(got.priority) is int
    assert got.priority == 5
    with pytest.raises(InvalidArgument):
        tier.put(Snapshot(snap.key, snap.tokens, snap.state, priority=np.int64(10**9)))  # type: ignore[arg-type]
