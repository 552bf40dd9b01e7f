"""The few threads a restore decodes on: one per usable core, at most codec.DEFAULT_THREADS.

blosc2 and numpy let go of the GIL while they work, so a restore's blocks (each read, verified and
decompressed on its own) are spread over the cores llama.cpp is not using at that moment. The pool
starts with the first call that has work for more than one thread.

A restore into a GPU's memory (blocks read and copied into the pinned buffer llama.cpp reads it
from) may use up to HOST_COPY_THREADS, inside `wider(n)`: while it waits for its blob, llama.cpp's
own threads are idle, and one core copies at a fraction of the memory's speed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from snapcache.formats import codec

__all__ = ["HOST_COPY_THREADS", "RESTORE_THREADS", "copy_in_parallel", "map_in_parallel", "wider"]

RESTORE_THREADS = codec.DEFAULT_THREADS
HOST_COPY_THREADS = max(RESTORE_THREADS, min(8, codec.usable_cores()))
# `copy_in_parallel` copies in pieces of this size, at most.
_COPY_PIECE_BYTES = 8 << 20
# How many threads `map_in_parallel` uses on this thread (see `wider`).
_workers: contextvars.ContextVar[int] = contextvars.ContextVar(
    "snapcache_restore_threads", default=RESTORE_THREADS
)


@contextlib.contextmanager
def wider(workers: int) -> Iterator[None]:
    """Inside it, `map_in_parallel` on this thread uses up to `workers` threads (HOST_COPY_THREADS
    at most) rather than RESTORE_THREADS: for a restore a GPU waits for."""
    token = _workers.set(max(1, min(workers, HOST_COPY_THREADS)))
    try:
        yield
    finally:
        _workers.reset(token)


_T = TypeVar("_T")
_R = TypeVar("_R")

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0  # a forked child has none of its parent's threads: it starts its own pool
_pool_lock = threading.Lock()


def map_in_parallel(function: Callable[[_T], _R], items: Sequence[_T], *, dealt: bool = False) -> list[_R]:
    """`[function(item) for item in items]`, the items cut into one contiguous run per thread, or
    with `dealt` dealt out to the threads in turn (item k to thread k modulo their number), on
    RESTORE_THREADS threads at most, this one among them (see `wider`).

    An exception in any call is raised here, after every run has ended.
    """
    workers = min(_workers.get(), len(items))
    if workers < 2:
        return [function(item) for item in items]
    if dealt:
        runs = [items[first::workers] for first in range(workers)]
    else:
        step = -(-len(items) // workers)
        runs = [items[start : start + step] for start in range(0, len(items), step)]
    futures = [_executor().submit(_run, function, run) for run in runs[1:]]
    try:
        first = _run(function, runs[0])  # this thread takes the first run
    finally:
        done = [future.exception() for future in futures]  # wait for every run, even after a failure
    for exception in done:
        if exception is not None:
            raise exception
    per_run = [first, *(future.result() for future in futures)]
    if not dealt:
        return [result for run in per_run for result in run]
    results: list[_R] = [None] * len(items)  # type: ignore[list-item]  # every place is filled below
    for first_item, run_results in enumerate(per_run):
        results[first_item::workers] = run_results
    return results


def copy_in_parallel(out: npt.NDArray[np.uint8], source: npt.NDArray[np.uint8]) -> None:
    """`out[:] = source` in pieces on the threads `map_in_parallel` uses."""
    if out.shape != source.shape:
        raise ValueError(f"cannot copy {source.nbytes} bytes into {out.nbytes}")
    starts = range(0, source.nbytes, _COPY_PIECE_BYTES)

    def copy(start: int) -> None:
        end = start + _COPY_PIECE_BYTES
        np.copyto(out[start:end], source[start:end])

    map_in_parallel(copy, starts)


def _run(function: Callable[[_T], _R], run: Sequence[_T]) -> list[_R]:
    return [function(item) for item in run]


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            # Threads start as work comes: a restore's decode never starts more than it uses.
            _pool = ThreadPoolExecutor(HOST_COPY_THREADS - 1, thread_name_prefix="snapcache-decode")
            _pool_pid = os.getpid()
        return _pool
