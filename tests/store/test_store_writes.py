"""The store's disk writes under threads: one writer at a time, back-pressure, and closing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from snapcache import SnapshotKey, StoreUnavailable
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore

FP = "fp-writes"
SCOPE = "writes"
DOC = np.random.default_rng(7).integers(0, 30_000, size=500, dtype=np.int32)
STATE = 4_000


def key_of(n: int) -> SnapshotKey:
    return SnapshotKey.for_tokens(FP, SCOPE, DOC[:n])


def put(store: SnapshotStore, n: int) -> Snapshot | None:
    return store.put(key_of(n), DOC[:n], bytes([n % 256]) * STATE)


def held_disk_put(store: SnapshotStore, hold: set[SnapshotKey]) -> tuple[threading.Event, threading.Event]:
    """Make the disk tier's put of a key in `hold` wait: (entered, release)."""
    disk = store._disk
    assert disk is not None
    real_put: Callable[[Snapshot], bool] = disk.put
    entered, release = threading.Event(), threading.Event()

    def put_held(snapshot: Snapshot) -> bool:
        if snapshot.key in hold:
            entered.set()
            assert release.wait(30)
        return real_put(snapshot)

    disk.put = put_held  # type: ignore[method-assign]
    return entered, release


def run(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Start `target` on a thread; the list receives its result or exception."""
    outcome: list[object] = []

    def body() -> None:
        try:
            outcome.append(target())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def test_a_remove_during_another_threads_write_is_not_missed(tmp_path: Path) -> None:
    """Without a background writer several threads write; a remove must still catch the key in flight."""
    with SnapshotStore(tmp_path / "c", ram_bytes=0, background_writes=False) as store:
        entered, release = held_disk_put(store, {key_of(10)})
        first, first_outcome = run(lambda: put(store, 10))
        assert entered.wait(30)  # the first thread is writing key 10
        second, second_outcome = run(lambda: put(store, 20))
        second.join(0.5)  # it may finish (another writer) or wait for the first: either is fine
        assert store.remove(key_of(10))  # while 10 is still being written
        release.set()
        first.join(30)
        second.join(30)
        assert not first.is_alive()
        assert not second.is_alive()
        assert not any(isinstance(o, Exception) for o in first_outcome + second_outcome)
        assert store.get(key_of(10)) is None
        assert key_of(10) not in {row.key for row in store.entries()}
        assert store.get(key_of(20)) is not None
        assert store.check(repair=False, verify=True).ok


def test_a_put_waiting_for_the_writer_fails_once_the_store_closes(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "c", ram_bytes=0)
    entered, release = held_disk_put(store, {key_of(10)})
    assert put(store, 10) is not None
    assert entered.wait(30)
    # ram_bytes=0: only the one snapshot in flight may wait outside the (empty) RAM budget.
    assert store.stats().pending_write_bytes == STATE + 4 * 10
    waiting, outcome = run(lambda: put(store, 20))
    waiting.join(0.5)
    assert waiting.is_alive()  # back-pressure: waits for the held write
    closing, _ = run(store.close)
    waiting.join(30)
    assert not waiting.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], StoreUnavailable)
    release.set()
    closing.join(30)
    assert not closing.is_alive()
    with SnapshotStore(tmp_path / "c", ram_bytes=0) as reopened:
        assert reopened.get(key_of(10)) is not None
        assert reopened.get(key_of(20)) is None


def test_snapshots_waiting_outside_ram_stay_within_the_ram_budget(tmp_path: Path) -> None:
    cost = STATE + 4 * 10  # about the same for every n used here
    ram_bytes = 3 * cost + 3 * 4 * 10
    store = SnapshotStore(tmp_path / "c", ram_bytes=ram_bytes)
    try:
        entered, release = held_disk_put(store, {key_of(10)})
        put(store, 10)
        assert entered.wait(30)
        for n in (11, 12):
            put(store, n)
        assert store.stats().pending_write_bytes == 0  # all three waiting writes are in RAM
        put(store, 13)  # evicts 10, still waiting: now outside RAM
        stats = store.stats()
        assert stats.pending_write_bytes == STATE + 4 * 10
        waiting, outcome = run(lambda: [put(store, n) for n in range(14, 20)])
        waiting.join(0.5)
        assert waiting.is_alive()  # more would exceed a twentieth of ram_bytes outside RAM
        stats = store.stats()
        assert stats.pending_write_bytes <= max(ram_bytes // 20, cost)
        assert stats.ram_used_bytes <= ram_bytes
        release.set()
        waiting.join(30)
        assert not waiting.is_alive()
        assert all(s is not None for s in outcome[0])  # type: ignore[union-attr]
        store.flush()
        assert store.stats().pending_write_bytes == 0
        assert store.stats().disk_entries == 10
    finally:
        release.set()
        store.close()


def test_pending_write_bytes_count_a_snapshot_too_large_for_ram(tmp_path: Path) -> None:
    with SnapshotStore(tmp_path / "c", ram_bytes=STATE // 2) as store:
        entered, release = held_disk_put(store, {key_of(10)})
        put(store, 10)
        assert entered.wait(30)
        assert store.stats().pending_write_bytes == STATE + 4 * 10
        assert store.stats().ram_used_bytes == 0
        release.set()
        store.flush()
        assert store.stats().pending_write_bytes == 0


@pytest.mark.parametrize("background_writes", [True, False])
def test_close_is_idempotent_and_later_calls_fail(tmp_path: Path, background_writes: bool) -> None:
    store = SnapshotStore(tmp_path / "c", ram_bytes=1 << 20, background_writes=background_writes)
    put(store, 10)
    store.close()
    store.close()
    with pytest.raises(StoreUnavailable):
        put(store, 11)
