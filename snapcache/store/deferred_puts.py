"""Puts made off the caller's path: jobs a caller hands the store, run in order by one thread.

A save of an 8B model's 1,024-token state (128 MiB) cost its request 262 ms on 2026-11-26, 11x
llama.cpp's own capture: most of it was cutting the state into blocks and copying them into the
store. A caller that captured into a buffer of its own hands that work over as a job and returns;
the job makes its puts on this thread. Every other call of the store waits until the jobs handed
over before it are done (`wait`), so that a read never misses what a save before it stored and a
put never races an older one: the store behaves as if the job had run where it was handed over.
A process killed meanwhile loses the job like any write still in flight.

Without a background thread (`background=False`, a store that writes in the foreground) a job runs
at once, on the caller's thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["DeferredPuts"]

log = logging.getLogger("snapcache")


class DeferredPuts:
    """Jobs handed over by `add`, run in order on one thread; `wait` for those handed over so far."""

    def __init__(self, *, background: bool) -> None:
        self._background = background
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._pending = 0
        self._done = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._thread_pid = 0
        self._start_lock = threading.Lock()
        self._stopped = False

    def add(self, job: Callable[[], object]) -> None:
        """Run `job` soon, after those added before it (now, in the foreground or on the jobs' own
        thread). A job that raises is logged; the store serves on."""
        if not self._background or self._stopped or self._on_own_thread():
            self._run(job)  # stopped: the store is closing, and the job's puts fail as any put would
            return
        self._ensure_thread()
        with self._done:
            self._pending += 1
        self._queue.put(job)

    def wait(self) -> None:
        """Wait until every job added so far is done; at once on the jobs' own thread (a job's own
        calls of the store) and in a forked child (its parent's jobs are its parent's)."""
        if self._thread_pid != os.getpid() or self._on_own_thread():
            return
        with self._done:
            while self._pending > 0:
                self._done.wait()

    def stop(self) -> None:
        """Run what was added and end the thread (the store closing)."""
        self.wait()
        with self._start_lock:
            self._stopped = True
            thread = self._thread if self._thread_pid == os.getpid() else None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _on_own_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is not None and self._thread_pid == os.getpid():
                return
            self._thread = threading.Thread(target=self._loop, name="snapcache-saver", daemon=True)
            with self._done:
                # A forked child starts with its parent's count, of jobs that run in the parent.
                self._pending = 0 if self._thread_pid != os.getpid() else self._pending
            self._thread_pid = os.getpid()
            self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._run(job)
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

    @staticmethod
    def _run(job: Callable[[], object]) -> None:
        try:
            job()
        except Exception:  # the store serves on: a failed save is a later miss, never a crash
            log.exception("snapcache: a deferred save failed")
