"""The few threads a restore decodes on: one per usable core, at most codec.DEFAULT_THREADS.

blosc2 and numpy let go of the GIL while they work, so a restore's blocks (each read, verified and
decompressed on its own) are spread over the cores llama.cpp is not using at that moment. The pool
starts with the first call that has work for more than one thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from snapcache.formats import codec

__all__ = ["map_in_parallel"]

_T = TypeVar("_T")
_R = TypeVar("_R")

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0  # a forked child has none of its parent's threads: it starts its own pool
_pool_lock = threading.Lock()


def map_in_parallel(function: Callable[[_T], _R], items: Sequence[_T], *, dealt: bool = False) -> list[_R]:
    """`[function(item) for item in items]`, the items cut into one contiguous run per thread, or
    with `dealt` dealt out to the threads in turn (item k to thread k modulo their number).

    An exception in any call is raised here, after every run has ended.
    """
    workers = min(codec.DEFAULT_THREADS, len(items))
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


def _run(function: Callable[[_T], _R], run: Sequence[_T]) -> list[_R]:
    return [function(item) for item in run]


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(codec.DEFAULT_THREADS - 1, thread_name_prefix="snapcache-decode")
            _pool_pid = os.getpid()
        return _pool
