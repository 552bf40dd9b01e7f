"""Puts made off the caller's path: jobs a caller hands the store, run in order by one thread.

A save of an 8B model's 1,024-token state (128 MiB) cost its request 262 ms on 2026-11-26, 11x
llama.cpp's own capture: most of it was cutting the state into blocks and copying them into the
store. A caller that captured into a buffer of its own hands that work over as a job and returns;
the job makes its puts on this thread. Every other call of the store waits until the jobs handed
over before it are done (`wait`), so that a read never misses what a save before it stored and a
put never races an older one: the store behaves as if the job had run where it was handed over.
A process killed meanwhile loses the job like any write still in flight.

Jobs run on a one-thread executor: they run in the order they were handed over, so waiting for the
last one waits for all. Handing over and stopping take one lock, so a job is either queued before
the executor shuts down (and runs then) or runs at once on the caller's thread; a job never waits on
a queue that nobody reads. Without a background thread (`background=False`, a store that writes in
the foreground) a job runs at once, on the caller's thread.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for

__all__ = ["DeferredPuts"]

log = logging.getLogger("snapcache")

# A wait this long says where the saver is, once: the store still waits (a save of a large state to
# a slow disk may take that long), but a hang leaves its cause in the log.
_SLOW_WAIT_SECONDS = 60.0


class DeferredPuts:
    """Jobs handed over by `add`, run in order on one thread; `wait` for those handed over so far."""

    def __init__(self, *, background: bool) -> None:
        self._background = background
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0
        self._last: Future[None] | None = None
        self._saver: int | None = None  # the executor thread's ident, once it ran a job
        self._stopped = False

    def add(self, job: Callable[[], object]) -> None:
        """Run `job` soon, after those added before it (now, in the foreground or on the jobs' own
        thread). A job that raises is logged; the store serves on."""
        with self._lock:
            queued = self._background and not self._stopped and not self._on_own_thread()
            if queued:
                self._last = self._executor_here().submit(self._run_queued, job)
        if not queued:
            if self._stopped:
                self.wait()  # the store is closing: after the jobs queued before, as if queued too
            self._run(job)

    def wait(self) -> None:
        """Wait until every job added so far is done; at once on the jobs' own thread (a job's own
        calls of the store) and in a forked child (its parent's jobs are its parent's)."""
        with self._lock:
            last = self._last if self._pid == os.getpid() else None
        if last is None or last.done() or self._on_own_thread():
            return
        if not wait_for([last], timeout=_SLOW_WAIT_SECONDS).done:
            log.warning(
                "snapcache: waiting for a deferred save for %.0f s; it is at:\n%s",
                _SLOW_WAIT_SECONDS,
                self._saver_stack(),
            )
            wait_for([last])

    def stop(self) -> None:
        """Run what was added and end the thread (the store closing); later jobs run at once."""
        with self._lock:
            self._stopped = True
            executor = self._executor if self._pid == os.getpid() else None
        if executor is not None and not self._on_own_thread():
            executor.shutdown(wait=True)

    def _executor_here(self) -> ThreadPoolExecutor:
        """This process's executor (a forked child starts its own: its parent's thread is not here)."""
        if self._executor is None or self._pid != os.getpid():
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="snapcache-saver")
            self._pid = os.getpid()
            self._saver = None
        return self._executor

    def _on_own_thread(self) -> bool:
        return self._saver is not None and threading.get_ident() == self._saver

    def _saver_stack(self) -> str:
        frame = None if self._saver is None else sys._current_frames().get(self._saver)
        return "(not started)" if frame is None else "".join(traceback.format_stack(frame))

    def _run_queued(self, job: Callable[[], object]) -> None:
        self._saver = threading.get_ident()
        self._run(job)

    @staticmethod
    def _run(job: Callable[[], object]) -> None:
        try:
            job()
        except Exception:  # the store serves on: a failed save is a later miss, never a crash
            log.exception("snapcache: a deferred save failed")
