"""A streamed answer's body ends with its last event, not when the events' generator ends.

After the last event the engine still gives the model back (on worker threads). An agent that
closes the connection on `response.completed` (Codex does) closed a body not yet ended: the response
looked cut short to it and to anything between. These drive `EventStream` as the ASGI server does,
with events that go on only once the client has the whole body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

from snapcache.server.chat.dialects.streaming import EventStream, Final
from snapcache.server.error_answers import BadRequest


def _error_event(failure: BadRequest) -> bytes:
    return f"event: error\ndata: {failure}\n\n".encode()


def _run(events: AsyncIterator[bytes], body_ended: anyio.Event) -> list[tuple[bytes, bool]]:
    """The body's pieces (bytes, more to come) as `EventStream` sends them; the client disconnects
    once the body ended, as a client that read its whole answer does."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message["more_body"]:
            body_ended.set()

    async def receive() -> dict[str, Any]:
        await body_ended.wait()
        return {"type": "http.disconnect"}

    async def main() -> None:
        stream = EventStream(events, lambda failure: {"error": str(failure)}, _error_event)
        with anyio.fail_after(10):  # without the body ended at `Final`, the events never go on
            await stream({"type": "http"}, receive, send)

    anyio.run(main)
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    return [(bytes(m["body"]), bool(m["more_body"])) for m in sent[1:]]


def test_the_body_ends_with_the_final_event_and_the_events_then_run_to_their_end() -> None:
    body_ended = anyio.Event()
    ran_after: list[str] = []

    async def events() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        yield Final(b"data: [DONE]\n\n")
        await body_ended.wait()  # the model given back: only after the client has its answer
        await anyio.sleep(0.05)  # a checkpoint: a disconnect taken as the client going cancels here
        ran_after.append("given back")

    pieces = _run(events(), body_ended)

    assert pieces == [(b"data: one\n\n", True), (b"data: [DONE]\n\n", False)]
    assert ran_after == ["given back"]  # the disconnect after the answer cancelled nothing


def test_a_failure_after_the_final_event_is_not_sent() -> None:
    body_ended = anyio.Event()

    async def events() -> AsyncIterator[bytes]:
        yield Final(b"event: message_stop\n\n")
        await body_ended.wait()
        raise BadRequest("the model could not be given back", status=500)

    assert _run(events(), body_ended) == [(b"event: message_stop\n\n", False)]


def test_events_without_a_final_event_end_the_body_after_the_last() -> None:
    body_ended = anyio.Event()

    async def events() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        raise BadRequest("the model failed", status=500)

    pieces = _run(events(), body_ended)

    assert pieces[0] == (b"data: one\n\n", True)
    assert pieces[1][1] is True
    assert b"the model failed" in pieces[1][0]
    assert pieces[2:] == [(b"", False)]
