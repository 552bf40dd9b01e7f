"""Uses of disk entries are recorded by a background thread, not on the read's path: a read returns
without the index transaction, `flush` and `close` wait for what is queued, the latest use counts
as the most recent, and a writer in another process no longer makes a use be dropped."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from multiprocessing import Queue
from pathlib import Path

import pytest
from block_snapshots import block_snapshots

from snapcache.disk.files import INDEX_NAME
from snapcache.key import SnapshotKey
from snapcache.store import SnapshotStore, deferred_uses


def last_uses(directory: Path) -> dict[SnapshotKey, float]:
    """Each block's recorded last use, from the index alone (a store of its own, with no RAM)."""
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 30) as store:
        return {row.key: row.last_used_at for row in store.entries(blocks=True)}


def put_blocks(directory: Path, n: int, seed: int) -> list[SnapshotKey]:
    blocks = block_snapshots(n, seed=seed)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 30) as store:
        store.put_many([(b.key, b.tokens, b.state, b.priority) for b in blocks])
    return [block.key for block in blocks]


@pytest.mark.parametrize("background_writes", [True, False])
def test_the_latest_restore_counts_as_the_most_recent_use(tmp_path: Path, background_writes: bool) -> None:
    first = put_blocks(tmp_path, 3, seed=1)
    second = put_blocks(tmp_path, 3, seed=2)
    options = {"ram_bytes": 0, "disk_bytes": 1 << 30, "background_writes": background_writes}
    with SnapshotStore(tmp_path, **options) as store:
        assert len(store.get_blocks(second)) == 3
        store.touch_blocks(second)
        assert store.copy_blocks(first, lambda _i, _state: None) == ["disk"] * 3
        store.flush()
        # Recorded by now, with a background thread or without one.
        used = {row.key: row.last_used_at for row in store.entries(blocks=True)}
    order = [used[key] for key in first + second]
    assert order == sorted(order, reverse=True)  # the first block of the latest restore first
    assert len(set(order)) == len(order)


def test_uses_still_queued_when_the_store_closes_are_recorded(tmp_path: Path) -> None:
    keys = put_blocks(tmp_path, 2, seed=3)
    before = last_uses(tmp_path)
    with SnapshotStore(tmp_path, ram_bytes=0, disk_bytes=1 << 30) as store:
        assert store.copy_blocks(keys, lambda _i, _state: None) == ["disk"] * 2
    after = last_uses(tmp_path)
    assert all(after[key] > before[key] for key in keys)


def test_a_get_from_disk_records_its_use(tmp_path: Path) -> None:
    snapshot = block_snapshots(1, seed=4)[0]
    with SnapshotStore(tmp_path, ram_bytes=0, disk_bytes=1 << 30) as store:
        store.put(snapshot.key, snapshot.tokens, snapshot.state)
        store.flush()
        (before,) = [entry.last_used_at for entry in store.entries(blocks=True)]
        got = store.get(snapshot.key)
        assert got is not None
        assert bytes(got.state) == bytes(snapshot.state)
        store.flush()
        (after,) = [entry.last_used_at for entry in store.entries(blocks=True)]
    assert after > before


def test_a_use_made_while_another_process_writes_is_recorded_once_it_lets_go(tmp_path: Path) -> None:
    keys = put_blocks(tmp_path, 2, seed=5)
    before = last_uses(tmp_path)
    with SnapshotStore(tmp_path, ram_bytes=0, disk_bytes=1 << 30) as store:
        blocker = sqlite3.connect(tmp_path / INDEX_NAME, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the index's write lock
        got: list[int] = []

        def restore() -> None:
            got.append(len(store.copy_blocks(keys, lambda _i, _state: None)))

        reader = threading.Thread(target=restore)
        try:
            reader.start()
            reader.join(timeout=10)
            assert not reader.is_alive(), "the read waited for the writer's lock"
            assert got == [2]
            threading.Event().wait(0.3)  # well past the 50 ms a use recorded on the read's path waited
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
            reader.join()
        store.flush()
    after = last_uses(tmp_path)
    assert all(after[key] > before[key] for key in keys)  # recorded once the writer let go, not dropped


def test_uses_pile_up_into_batches_recorded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deferred_uses, "_BATCH_KEYS", 2)
    a, b, c, d = (key for key in block_snapshots_keys(4))
    # Three uses, the oldest first; c was used again last.
    batches = deferred_uses._batches([[a, b], [c], [d, c]])
    # Recorded in this order, so a later batch counts as more recent: d and c last, d the most recent.
    assert batches == [[a, b], [d, c]]


def block_snapshots_keys(n: int) -> list[SnapshotKey]:
    return [block.key for block in block_snapshots(n, seed=6)]


def _restore_in_child(store: SnapshotStore, keys: list[SnapshotKey], results: Queue[bool]) -> None:
    served = store.copy_blocks(keys, lambda _i, _state: None)
    store.flush()  # must not wait for a use the parent's thread was recording
    results.put(served == ["disk"] * len(keys))


def test_a_forked_child_records_its_uses_on_a_thread_of_its_own(tmp_path: Path) -> None:
    keys = put_blocks(tmp_path, 2, seed=7)
    before = last_uses(tmp_path)
    with SnapshotStore(tmp_path, ram_bytes=0, disk_bytes=1 << 30) as store:
        assert store.copy_blocks(keys, lambda _i, _state: None) == ["disk"] * 2  # the parent's thread runs
        store.flush()
        parent_use = last_uses(tmp_path)
        context = multiprocessing.get_context("fork")
        results: Queue[bool] = context.Queue()
        child = context.Process(target=_restore_in_child, args=(store, keys, results))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        assert results.get(timeout=5)
    after = last_uses(tmp_path)
    assert all(before[key] < parent_use[key] < after[key] for key in keys)  # the child's use is on disk too
