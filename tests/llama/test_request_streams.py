"""Streams that cannot outlive their request: `DetachedStream` (a one-at-a-time stream made in its own
thread under the Llama's lock) and `RequestStreams` (what a server stops when a client goes).

These use plain generators in place of a completion: what is checked is who holds the lock and
when it is given back, which no model output changes. The server tests drive the same code with
real streams (tests/server/test_serve_parallel.py).
"""

from __future__ import annotations

import contextvars
import gc
import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from snapcache.llama.hook.detached_stream import DetachedStream
from snapcache.llama.hook.request_streams import RequestStreams, current_streams, stop_with_request

_LABEL: contextvars.ContextVar[str] = contextvars.ContextVar("label", default="none")


def endless(closed: threading.Event) -> Iterator[int]:
    """A stream that never ends by itself; `closed` is set when it is closed."""
    try:
        yield from itertools.count()
    finally:
        closed.set()


def wait_free(lock: threading.Lock, seconds: float = 5.0) -> bool:
    if lock.acquire(timeout=seconds):
        lock.release()
        return True
    return False


def test_a_stream_its_reader_drops_gives_the_lock_back() -> None:
    lock, closed = threading.Lock(), threading.Event()
    stream = DetachedStream(lambda: endless(closed), lock)
    assert next(stream) == 0
    assert lock.locked()
    del stream  # a reader gone, its iterator never closed
    gc.collect()
    assert wait_free(lock), "a dropped stream kept the lock"
    assert closed.wait(5), "the stream's own generator was not closed"


def test_closing_a_stream_ends_it_and_gives_the_lock_back() -> None:
    lock, closed = threading.Lock(), threading.Event()
    stream = DetachedStream(lambda: endless(closed), lock)
    next(stream)
    stream.close()
    with pytest.raises(StopIteration):
        next(stream)
    assert wait_free(lock)
    assert closed.is_set()


def test_closing_waits_for_the_stream_to_end_and_cancelling_never_does() -> None:
    lock, closed, entered = threading.Lock(), threading.Event(), threading.Event()

    def slow() -> Iterator[int]:
        try:
            yield 0
            entered.set()
            time.sleep(0.5)  # a token being decoded
            yield 1
        finally:
            time.sleep(0.2)  # what the stream does when it ends: a state saved, say
            closed.set()

    cancelled = DetachedStream(slow, lock)
    assert next(cancelled) == 0
    assert entered.wait(5)
    started = time.monotonic()
    cancelled.cancel()  # on an event loop, when a client goes
    assert time.monotonic() - started < 0.1
    assert not closed.is_set()
    assert closed.wait(5)
    assert wait_free(lock)
    closed.clear()
    entered.clear()
    stream = DetachedStream(slow, lock)
    assert next(stream) == 0
    assert entered.wait(5)
    stream.close()  # on a worker thread, when the request is done with it
    assert closed.is_set()
    assert not lock.locked()


def test_a_request_that_ends_stops_the_streams_it_started() -> None:
    lock, closed = threading.Lock(), threading.Event()
    with RequestStreams.opened() as streams:
        stream = DetachedStream(lambda: endless(closed), lock)
        stop_with_request(stream.cancel)
        next(stream)
    assert current_streams() is None
    streams.cancel_all()  # the client went: the reader is still blocked, or gone
    assert wait_free(lock)
    assert closed.wait(5)


def test_a_stream_runs_in_its_caller_s_context_and_raises_to_its_reader() -> None:
    def failing() -> Iterator[str]:
        yield _LABEL.get()
        raise ValueError("the prompt is too long")

    lock = threading.Lock()
    _LABEL.set("request 7")
    stream = DetachedStream(failing, lock)
    assert next(stream) == "request 7"
    with pytest.raises(ValueError, match="too long"):
        next(stream)
    assert wait_free(lock)


def test_a_stream_waits_for_the_lock_its_owner_holds() -> None:
    lock = threading.Lock()
    lock.acquire()
    stream = DetachedStream(lambda: iter([1, 2]), lock)
    time.sleep(0.1)
    lock.release()
    assert list(stream) == [1, 2]


def test_close_all_cancels_then_closes_each_stream() -> None:
    calls: list[str] = []
    streams = RequestStreams()
    streams.add(lambda: calls.append("cancel a"), lambda: calls.append("close a"))
    streams.add(lambda: calls.append("cancel b"))
    streams.close_all()
    assert calls == ["cancel a", "close a", "cancel b"]
