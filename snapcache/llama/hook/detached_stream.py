"""A stream made under a lock in a thread of its own, so that its reader cannot keep the lock.

A server hands a streamed completion's iterator to its event publisher; when the client goes away,
that publisher stops reading and never closes the iterator, which lives on until a garbage
collection finds it. A generator that held the Llama's own context across its `yield`s kept the
context for as long, and every call that needed it (a warm, the next one-at-a-time completion)
waited. Here the stream runs in its own thread, under the lock, to its end whatever the reader does
(its length is bounded by `max_tokens` or the context), and stops at its next token once it is
cancelled, its reader closes it or is collected, or the request it belongs to is cancelled (see
`request_streams`). `close` waits for that, as closing a generator does: once it returns, the lock
is given back and what the stream does when it ends (a state saved, special text put away) is done.
The thread ends with the stream, and llama.cpp's OpenMP team with it (see `setup.openmp_teams`).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from snapcache.llama.hook.request_streams import RequestStreams, stop_with_request
from snapcache.llama.setup.openmp_teams import on_passing_thread

__all__ = ["DetachedStream", "on_own_context"]

T = TypeVar("T")

_CHUNK, _END, _FAILED = range(3)


def on_own_context(run: Callable[[], Any], lock: threading.Lock, *, stream: bool) -> Any:
    """`run()` on the Llama's own context, under `lock`, on a thread that ends with it (its OpenMP
    team goes with it, see `setup.openmp_teams`): its result, or with `stream` its chunks as a
    `DetachedStream`, which the current request cancels when its client goes."""
    if not stream:
        with lock:
            return on_passing_thread(run)
    detached: DetachedStream[Any] = DetachedStream(lambda: iter(run()), lock)
    stop_with_request(detached.cancel)
    return detached


class DetachedStream(Generic[T]):
    """The chunks of `make()`, which runs under `lock` in a thread of its own (in a copy of the
    caller's context variables); an exception it raises is raised to the reader in its place."""

    def __init__(self, make: Callable[[], Iterator[T]], lock: threading.Lock) -> None:
        self._chunks: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._ended = False
        # The thread holds the queue and the event, never this object, so that a reader who drops it
        # lets it be collected, which stops the thread.
        # The completion's own streams answer to this one: `cancel` stops them at their next token.
        self._inner = RequestStreams()
        context = contextvars.copy_context()
        self._inner.current_in(context)
        thread = threading.Thread(
            target=context.run,
            args=(_produce, make, lock, self._chunks, self._stop),
            name="snapcache-one-at-a-time-stream",
            daemon=True,
        )
        thread.start()
        self._thread = thread

    def __iter__(self) -> DetachedStream[T]:
        return self

    def __next__(self) -> T:
        if self._ended:
            raise StopIteration
        kind, value = self._chunks.get()
        if kind == _CHUNK:
            return value  # type: ignore[no-any-return]
        self._ended = True
        if kind == _FAILED:
            raise value
        raise StopIteration

    def cancel(self) -> None:
        """End the stream at its next token (the lock is given back then); thread-safe, never blocks."""
        self._ended = True
        self._stop.set()
        self._inner.cancel_all()

    def close(self) -> None:
        """End the stream and wait for its thread to end (at its next token, or when it has the lock
        and sees it is cancelled); call it where blocking is fine, never on an event loop."""
        self.cancel()
        self._thread.join()

    def __del__(self) -> None:
        self._stop.set()
        self._inner.cancel_all()


def _produce(
    make: Callable[[], Iterator[Any]],
    lock: threading.Lock,
    chunks: queue.SimpleQueue[tuple[int, Any]],
    stop: threading.Event,
) -> None:
    try:
        with lock:
            stream = make()
            try:
                for chunk in stream:
                    if stop.is_set():
                        break
                    chunks.put((_CHUNK, chunk))
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
    except BaseException as exc:  # the reader's to see, in the reader's thread
        chunks.put((_FAILED, exc))
        return
    chunks.put((_END, None))
