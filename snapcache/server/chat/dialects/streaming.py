"""A streamed answer that can still fail with a proper status: events start before the response does.

The first event is awaited before anything is sent, so a request the model refuses (a prompt too
long for the context) gets its error with a 4xx status in its dialect's shape; after that the events
go out as server-sent events, and an error ends the stream with the dialect's error event. The body
ends with the answer's last event (`Final`): what the events do after it (the model given back)
runs after the client has its whole answer, so a client that closes on that event closes a finished
response. The whole answer runs in the task that serves the request (the model's turn is taken and
given back there), and a client gone cancels it: the model's work for it too, even before its first
event (see `snapcache.llama.hook.request_streams`). A whole (not streamed) answer is watched the same way
(`until_disconnect`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from snapcache.llama.hook.request_streams import RequestStreams
from snapcache.server.error_answers import BadRequest

__all__ = ["EventStream", "Final", "as_failure", "until_disconnect"]

_log = logging.getLogger("snapcache")

ErrorBody = Callable[[BadRequest], dict[str, Any]]


def as_failure(exc: BaseException) -> BadRequest:
    """What a failed request answers: its BadRequest (status, message, param, code), or a 500 for any
    other exception, logged with its traceback."""
    if isinstance(exc, BadRequest):
        return exc
    _log.error("request failed: %s", exc, exc_info=exc)
    return BadRequest(f"the request failed: {type(exc).__name__}", status=500)


class Final(bytes):
    """The last event of a streamed answer: the response's body ends with it."""


class Watch:
    """Whether the client of a request `until_disconnect` watched went away, and whether the answer
    was all sent (a disconnect after that is the response's own end, not the client going)."""

    gone = False
    answered = False


@contextlib.asynccontextmanager
async def until_disconnect(receive: Receive, events: AsyncIterator[Any]) -> AsyncIterator[Watch]:
    """The body runs with the request's streams opened (in its context: the model's work it starts
    registers there) and is cancelled if the client goes, the model's work with it at its next step.
    `events`, the answer's async generator, is closed at the end whatever happened."""
    watched = Watch()
    try:
        with RequestStreams.opened() as streams:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    if watched.answered:
                        return
                    watched.gone = True
                    streams.cancel_all()
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                try:
                    yield watched
                finally:
                    group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()  # type: ignore[attr-defined]


class EventStream(Response):
    """A stream of `events` (server-sent events by default; `media_type` says what they are);
    `error_body` and `error_event` give the dialect's error before and after the stream began,
    `headers` those to add once the first event is known."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        error_body: ErrorBody,
        error_event: Callable[[BadRequest], bytes],
        media_type: str = "text/event-stream",
        headers: Callable[[], list[tuple[bytes, bytes]]] = list,
    ) -> None:
        super().__init__(status_code=200)
        self.media_type = media_type
        self._events = events
        self._reuse_headers = headers
        self._error_body = error_body
        self._error_event = error_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        events = self._events
        # The model's streams for this answer are opened in its context when the events start: a
        # client gone cancels them at their next step, also while the prompt is still being read.
        async with until_disconnect(receive, events) as watch:
            await self._answer(events, send, watch)

    async def _answer(self, events: AsyncIterator[bytes], send: Send, watch: Watch) -> None:
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            first = b""
        except Exception as exc:
            failure = as_failure(exc)
            body = json.dumps(self._error_body(failure)).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({"type": "http.response.start", "status": failure.status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        headers = [
            (b"content-type", f"{self.media_type}; charset=utf-8".encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *self._reuse_headers(),  # known once the first event is: what the answer reused
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._send(first, send, watch)
        try:
            async for chunk in events:
                if not watch.answered:
                    await self._send(chunk, send, watch)
        except Exception as exc:
            if watch.answered:  # the client has its answer: the failure is only logged
                _log.error("request failed after its answer: %s", exc, exc_info=exc)
                return
            chunk = self._error_event(as_failure(exc))
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not watch.answered:
            watch.answered = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _send(chunk: bytes, send: Send, watch: Watch) -> None:
        """Send `chunk`, ending the body with it if it is the answer's `Final` event."""
        last = isinstance(chunk, Final)
        watch.answered = last
        await send({"type": "http.response.body", "body": chunk, "more_body": not last})
