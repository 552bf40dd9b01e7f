"""Puts handed to the store as jobs (`SnapshotStore.defer`): every other call waits for them, close
runs them, a failing one is logged, and a foreground store runs them at once."""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from snapcache import SnapshotKey, StoreUnavailable
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore
from snapcache.store.deferred_puts import DeferredPuts

FP = "fp-deferred"
SCOPE = "deferred"
DOC = np.random.default_rng(11).integers(0, 30_000, size=300, dtype=np.int32)


def key_of(n: int) -> SnapshotKey:
    return SnapshotKey.for_tokens(FP, SCOPE, DOC[:n])


def held_put(store: SnapshotStore, n: int, release: threading.Event, started: threading.Event) -> None:
    """A deferred job that waits for `release`, then puts the state of DOC[:n]."""

    def job() -> None:
        started.set()
        assert release.wait(30)
        store.put(key_of(n), DOC[:n], bytes([n]) * 1_000)

    store.defer(job)


@pytest.mark.parametrize("directory", [None, "disk"])
def test_reads_wait_for_the_puts_deferred_before_them(tmp_path: Path, directory: str | None) -> None:
    store = SnapshotStore(None if directory is None else tmp_path / directory, ram_bytes=1 << 20)
    release, started = threading.Event(), threading.Event()
    held_put(store, 10, release, started)
    assert started.wait(30)  # on the store's own thread, off the caller's
    found: list[Snapshot | None] = []
    reader = threading.Thread(target=lambda: found.append(store.get(key_of(10))))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive()  # the get waits for the job handed over before it
    release.set()
    reader.join(30)
    snapshot = found[0]
    assert snapshot is not None
    assert bytes(snapshot.state) == bytes([10]) * 1_000
    assert store.stats().ram_entries == 1
    store.close()


def test_close_runs_what_was_deferred_and_refuses_more(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "cache", ram_bytes=1 << 20)
    release, started = threading.Event(), threading.Event()
    held_put(store, 20, release, started)
    assert started.wait(30)
    closer = threading.Thread(target=store.close)
    closer.start()
    release.set()
    closer.join(30)
    with pytest.raises(StoreUnavailable):
        store.defer(lambda: None)
    with SnapshotStore(tmp_path / "cache", ram_bytes=0) as reopened:
        assert reopened.get(key_of(20)) is not None  # on disk: the job's put landed before close


def test_a_foreground_store_runs_a_job_at_once(tmp_path: Path) -> None:
    with SnapshotStore(tmp_path / "cache", background_writes=False) as store:
        ran: list[str] = []
        store.defer(lambda: ran.append(threading.current_thread().name))
        assert ran == [threading.current_thread().name]


def test_a_failing_job_is_logged_and_the_store_serves_on(caplog: pytest.LogCaptureFixture) -> None:
    def failing() -> None:
        raise OSError("no room")

    with SnapshotStore(None) as store, caplog.at_level(logging.ERROR, logger="snapcache"):
        store.defer(failing)
        store.put(key_of(5), DOC[:5], b"x" * 100)
        assert store.get(key_of(5)) is not None
    assert "deferred save failed" in caplog.text


def test_a_job_may_use_the_store_it_runs_in() -> None:
    with SnapshotStore(None) as store:
        store.defer(
            lambda: [store.put(key_of(n), DOC[:n], b"y" * 50) for n in (3, 4) if store.get(key_of(n)) is None]
        )
        assert store.stats().ram_entries == 2


def test_put_keeps_bytes_and_owned_buffers_without_a_copy() -> None:
    with SnapshotStore(None) as store:
        data = b"z" * 4_000
        kept = store.put(key_of(7), DOC[:7], data)
        assert kept is not None
        assert kept.state is data
        owned = np.full(4_000, 3, dtype=np.uint8)
        kept = store.put(key_of(8), DOC[:8], owned.data, owned=True)
        assert kept is not None
        assert np.shares_memory(np.frombuffer(kept.state, dtype=np.uint8), owned)
        lent = bytearray(b"w" * 4_000)
        kept = store.put(key_of(9), DOC[:9], lent)
        lent[0] = 0  # the caller's buffer, reused: the store copied it
        assert kept is not None
        assert bytes(kept.state) == b"w" * 4_000


def _hand_over_while_stopping(n_threads: int, n_jobs: int) -> list[tuple[int, int]]:
    """`n_threads` threads hand `n_jobs` jobs each to one DeferredPuts while it stops; what ran."""
    puts = DeferredPuts(background=True)
    ran: list[tuple[int, int]] = []
    ran_lock = threading.Lock()

    def job(thread: int, n: int) -> None:
        with ran_lock:
            ran.append((thread, n))

    def hand_over(thread: int) -> None:
        for n in range(n_jobs):
            puts.add(functools.partial(job, thread, n))
            if n % 10 == 0:
                puts.wait()

    threads = [threading.Thread(target=hand_over, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    puts.stop()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()  # no wait left waiting for a job nobody runs
    waiter = threading.Thread(target=puts.wait)
    waiter.start()
    waiter.join(30)
    assert not waiter.is_alive()
    return ran


def test_jobs_handed_over_while_the_store_closes_all_run_once_in_order() -> None:
    """Many threads hand over jobs while another closes the store: every job runs exactly once, each
    thread's in the order it handed them over, and no wait is left waiting (a job queued after the
    saver stopped would leave every later call of the store waiting for good)."""
    for _ in range(20):
        ran = _hand_over_while_stopping(4, 50)
        assert sorted(ran) == [(t, n) for t in range(4) for n in range(50)]
        for t in range(4):
            assert [n for thread, n in ran if thread == t] == list(range(50))


def test_a_job_that_hands_over_another_runs_it_at_once_and_waits_for_nothing() -> None:
    puts = DeferredPuts(background=True)
    order: list[str] = []
    done = threading.Event()

    def outer() -> None:
        puts.add(lambda: order.append("inner"))  # on the saver itself: run now, not queued behind us
        puts.wait()  # on the saver: returns at once
        order.append("outer")
        done.set()

    puts.add(outer)
    assert done.wait(30)
    puts.stop()
    assert order == ["inner", "outer"]
