"""The streams a request started, stopped when its client goes and closed when it ends.

A server route that streams a completion may stop reading it (its client went away) and leave the
iterator unclosed until a garbage collection finds it. Until then a one-sequence stream keeps the
Llama mid-completion (and saves its state whenever the collector closes it, on whatever thread, in
the middle of another request), and a batched one keeps its sequence generating. So a server marks
each request with `RequestStreams.opened()`; a completion that starts a stream inside it (in that
context or a copy of it: the request's worker threads) registers, with `stop_with_request`, how to
cancel it (cheap and thread-safe: it ends at its next token) and how to close it. The server calls
`cancel_all` when the client goes and `close_all` when the request ends, while it still holds the
model.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator

__all__ = ["RequestStreams", "current_streams", "stop_with_request"]

_CURRENT: contextvars.ContextVar[RequestStreams | None] = contextvars.ContextVar(
    "snapcache_request_streams", default=None
)


class RequestStreams:
    """How to cancel and close each stream one request started (thread-safe)."""

    def __init__(self) -> None:
        self._streams: list[tuple[Callable[[], None], Callable[[], None] | None]] = []
        self._lock = threading.Lock()

    @classmethod
    @contextlib.contextmanager
    def opened(cls) -> Iterator[RequestStreams]:
        """A new request's streams, current in this context (and the copies made inside it)."""
        streams = cls()
        token = _CURRENT.set(streams)
        try:
            yield streams
        finally:
            with contextlib.suppress(ValueError):  # left in another context than it was entered in
                _CURRENT.reset(token)

    def current_in(self, context: contextvars.Context) -> None:
        """Make these the streams of code running in `context`."""
        context.run(_CURRENT.set, self)

    def add(self, cancel: Callable[[], None], close: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._streams.append((cancel, close))

    def cancel_all(self) -> None:
        """End every stream at its next token (an ended one is left as it is)."""
        for cancel, _ in self._registered():
            cancel()

    def close_all(self) -> None:
        """Cancel every stream, then close those that say how (on a thread that may block)."""
        for cancel, close in self._registered():
            cancel()
            if close is not None:
                close()

    def _registered(self) -> list[tuple[Callable[[], None], Callable[[], None] | None]]:
        with self._lock:
            return list(self._streams)


def current_streams() -> RequestStreams | None:
    """The current request's streams; None outside a request."""
    return _CURRENT.get()


def stop_with_request(cancel: Callable[[], None], close: Callable[[], None] | None = None) -> None:
    """Register a stream with the current request (nothing outside a request)."""
    streams = _CURRENT.get()
    if streams is not None:
        streams.add(cancel, close)
