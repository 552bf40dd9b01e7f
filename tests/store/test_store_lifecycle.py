"""Opening and closing a store: reads racing close(), and debris of crashed writers reclaimed at open."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_store import FP, OTHER_DOC, SCOPE, add, assert_right, cost

from snapcache import SnapshotKey, StoreUnavailable
from snapcache.store import SnapshotStore

DISK = 1 << 26  # room for everything: what is missing after close was lost, not evicted
HOUR = 3600.0


def keys_on_disk(directory: Path) -> set[SnapshotKey]:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK) as reopened:
        assert reopened.check(repair=False, verify=True, grace_seconds=0).ok
        return {row.key for row in reopened.entries()}


OLD_STATE = 2 << 20  # large enough that a disk read is still in flight when close() begins
FRESH_STATE = 512 << 10


@pytest.mark.parametrize("round_", range(5))
def test_reads_racing_close_never_leave_a_ram_entry_off_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, round_: int
) -> None:
    """A disk hit promoted into RAM evicts RAM entries; once close() has begun, no eviction may go
    into a write queue that is not drained again. Every entry RAM held must be on disk after close.

    To make the race likely, four readers start disk reads just before close(), and close's final
    write-out looks at RAM a little late (a delay wrapped around RamTier.snapshots).
    """
    directory = tmp_path / "cache"
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK) as first:
        old = [add(first, n, doc=OTHER_DOC, size=OLD_STATE) for n in range(10, 18)]

    store = SnapshotStore(directory, ram_bytes=6 * cost(30, FRESH_STATE) + 4096, disk_bytes=DISK)
    disk, ram = store._disk, store._ram
    assert disk is not None
    assert ram is not None
    real_put, real_snapshots = disk.put, ram.snapshots

    def unavailable(snapshot: object) -> bool:
        raise StoreUnavailable("simulated full disk")

    # Fresh entries whose writes failed: RAM holds the only copy until close() writes them out.
    monkeypatch.setattr(disk, "put", unavailable)
    fresh = [add(store, n, size=FRESH_STATE) for n in range(20, 26)]
    store.flush()
    assert store.stats().write_errors == len(fresh)
    monkeypatch.setattr(disk, "put", real_put)

    def late_snapshots() -> list:
        time.sleep(0.03)
        return real_snapshots()

    monkeypatch.setattr(ram, "snapshots", late_snapshots)
    start = threading.Barrier(5)
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        try:
            while True:
                key = old[int(rng.integers(len(old)))]
                if rng.random() < 0.5:
                    snap = store.get(key)
                else:
                    snap = store.lookup(FP, SCOPE, OTHER_DOC[: key.token_count])
                if snap is not None:
                    assert snap.key.matches(snap.tokens)
        except StoreUnavailable:
            return  # closed: the end of this reader
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(100 * round_ + i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(0.0005 * round_)
    store.close()
    for thread in threads:
        thread.join()
    assert errors == []
    on_disk = keys_on_disk(directory)
    assert set(fresh) <= on_disk, f"lost {len(set(fresh) - on_disk)} of {len(fresh)} fresh entries"
    assert set(old) <= on_disk


def test_evicting_an_entry_the_disk_holds_queues_no_write(tmp_path: Path) -> None:
    with SnapshotStore(tmp_path / "cache", ram_bytes=3 * cost(40), disk_bytes=DISK) as store:
        keys = [add(store, n) for n in range(30, 40)]  # RAM holds three of the ten
        store.flush()
        writes = store._writes
        assert writes is not None
        before = store.stats()
        for _ in range(3):
            for n, key in zip(range(30, 40), keys, strict=True):
                # A disk hit is promoted and evicts an entry that is on disk already: nothing to write.
                assert_right(store.get(key), n)
                with store._lock:
                    assert not list(writes.snapshots())
        after = store.stats()
        assert after.promotions - before.promotions >= 20
        assert after.ram_evictions - before.ram_evictions >= 20
        assert after.spills == before.spills
        assert after.write_errors == 0


# -- debris of interrupted writes ---------------------------------------------------------------------


def age(path: Path, seconds: float) -> None:
    when = time.time() - seconds
    os.utime(path, (when, when))


def test_debris_older_than_the_grace_period_is_reclaimed_at_open(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK) as store:
        kept = add(store, 30)
    files = directory / "snapshots"
    (real,) = files.glob("*.snap")
    # What a crash leaves: a write cut short, and a file renamed whose index row never committed.
    old_temp, young_temp = files / ".tmp-00000000000000aa.partial", files / ".tmp-00000000000000bb.partial"
    old_orphan = files / f"{kept.id}-{'a' * 12}.snap"
    young_orphan = files / f"{kept.id}-{'b' * 12}.snap"
    for temp in (old_temp, young_temp):
        temp.write_bytes(b"half a snapshot")
    for orphan in (old_orphan, young_orphan):
        shutil.copyfile(real, orphan)
    age(old_temp, 2 * HOUR)
    age(old_orphan, 2 * HOUR)
    age(young_temp, 60)  # younger than ten minutes: a writer in another process may own it

    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK) as reopened:
        assert not old_temp.exists()
        assert not old_orphan.exists()
        assert young_temp.exists()
        assert young_orphan.exists()
        assert real.exists()
        assert_right(reopened.get(kept), 30)
        report = reopened.check(repair=False, grace_seconds=0)
        assert sorted(report.temp_files) == [young_temp.name]
        assert sorted(report.orphan_files) == [young_orphan.name]


def test_debris_is_reclaimed_by_a_ram_and_disk_store_too(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK).close()
    temp = directory / "snapshots" / ".tmp-00000000000000cc.partial"
    temp.write_bytes(b"x")
    age(temp, 2 * HOUR)
    with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK) as store:
        assert not temp.exists()
        assert store.check(repair=False, grace_seconds=0).ok
