"""Recording the uses of stored entries off a read's path: a background thread writes them to the
disk index, so that a restore waits neither for that transaction nor for another process's writer.

Each use moves an entry up in the disk tier's least-recently-used order. Recording the uses of a
9,344-token Gemma restore (146 blocks and a record) is two index transactions, 2 to 3 ms of a 40 ms
disk hit, and a writer in another process made a read wait for it (up to the index's short busy
timeout, after which the use was dropped). Here the read hands the keys over and returns; the thread
records what has piled up in one transaction, the keys of the latest use first, and tries again
for up to 2 s while another process writes (letting go of the index between tries).

The thread waits until uses stop coming for SETTLE_S (at most MAX_HOLD_S) before it writes. A
restore reads a record, then its blocks: the transaction for the record's use ran just as the
blocks' index query wanted the same connection (one connection, one lock: they wait for each
other), and a restore cost two transactions instead of one. A use is on disk within SETTLE_S of
the last read: `flush` waits for it (and cuts the wait short), and an eviction meanwhile sees the
order as it was (the cost of a stale order is one entry evicted a little early, never a wrong byte).

Without a background thread (`background=False`, a store that writes in the foreground) uses are
recorded at once, as a read would.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey

__all__ = ["DeferredUses"]

log = logging.getLogger("snapcache")

# Keys one transaction records at most; more wait for the next.
_BATCH_KEYS = 4096
# The thread writes once no use has come for this long, or once the first waits this long.
SETTLE_S = 0.05
MAX_HOLD_S = 1.0


class _Signal(enum.Enum):
    FLUSH = "write what is queued now"
    STOP = "write what is queued and end"


_Item = list[SnapshotKey] | _Signal


class DeferredUses:
    """Uses handed over by `add`, recorded by `record(keys)` (the first key the most recent)."""

    def __init__(self, record: Callable[[list[SnapshotKey]], None], *, background: bool) -> None:
        self._record = record
        self._background = background
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._thread_pid = 0
        self._start_lock = threading.Lock()
        self._stopped = False

    def add(self, keys: list[SnapshotKey]) -> None:
        """Record a use of `keys`, the first as the most recent, soon (or now, in the foreground).
        Once stopped (the store closing) a use is not recorded: a read racing `close` drops it."""
        if not keys or self._stopped:
            return
        if not self._background:
            self._record_now(keys)
            return
        self._ensure_thread()
        self._queue.put(list(keys))

    def flush(self) -> None:
        """Wait until every use added so far is recorded (or failed with a logged warning)."""
        if self._thread_pid != os.getpid():
            return  # none queued in this process (a forked child leaves its parent's to the parent)
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_Signal.FLUSH)
            self._queue.join()
        else:
            self._record_queued()

    def stop(self) -> None:
        """Record what is queued and end the thread; later uses are dropped."""
        with self._start_lock:
            self._stopped = True
            thread = self._thread
        if self._thread_pid != os.getpid():
            return
        if thread is not None and thread.is_alive():
            self._queue.put(_Signal.STOP)
            thread.join()
        self._record_queued()

    def _ensure_thread(self) -> None:
        with self._start_lock:
            # A forked child has none of its parent's threads, and its copy of the queue may count a
            # use the parent's thread was recording: it starts a queue and a thread of its own.
            if self._thread is None or self._thread_pid != os.getpid():
                self._queue = queue.Queue()
                self._thread = threading.Thread(target=self._loop, name="snapcache-uses", daemon=True)
                self._thread_pid = os.getpid()
                self._thread.start()

    def _loop(self) -> None:
        while True:
            items = self._settled([self._queue.get()])  # what piled up: one transaction
            self._record_items(items)
            if _Signal.STOP in items:
                return

    def _settled(self, items: list[_Item]) -> list[_Item]:
        """`items` and what comes after them until no use has come for SETTLE_S, MAX_HOLD_S have
        passed, or `flush` or `stop` asks."""
        deadline = time.monotonic() + MAX_HOLD_S
        while not isinstance(items[-1], _Signal):  # a signal ends the wait, and comes last
            wait = min(SETTLE_S, deadline - time.monotonic())
            if wait <= 0:
                break
            try:
                items.append(self._queue.get(timeout=wait))
            except queue.Empty:
                break
        return items + self._take_waiting()

    def _record_queued(self) -> None:
        """Record, on this thread, whatever the queue still holds."""
        self._record_items(self._take_waiting())

    def _take_waiting(self) -> list[_Item]:
        items: list[_Item] = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _record_items(self, items: list[_Item]) -> None:
        """Record the uses taken from the queue (a signal has none) and mark them done."""
        try:
            for batch in _batches([item for item in items if not isinstance(item, _Signal)]):
                self._record_now(batch)
        finally:
            for _ in items:
                self._queue.task_done()

    def _record_now(self, keys: list[SnapshotKey]) -> None:
        try:
            self._record(keys)
        except (StoreUnavailable, OSError) as exc:
            log.warning("snapcache: disk record uses failed: %s", exc)
        except Exception:  # the thread must survive whatever one transaction does
            log.exception("snapcache: recording uses failed")


def _batches(uses: list[list[SnapshotKey]]) -> list[list[SnapshotKey]]:
    """The keys of `uses` (the oldest use first), each once where it was used last, in batches in
    the order to record them: a batch recorded later counts as more recent, and within one the
    first key is the most recent."""
    latest_first = list(dict.fromkeys(key for keys in reversed(uses) for key in keys))
    starts = range(0, len(latest_first), _BATCH_KEYS)
    return [latest_first[start : start + _BATCH_KEYS] for start in reversed(starts)]
