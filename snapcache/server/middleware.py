"""The ASGI layer around the text completion routes: scope in, reuse out.

In: the `X-Snapcache-Scope` header picks the request's scope (a bad one is a 400), and JSON bodies
are checked (see `checks`) before they queue for the model. Chat routes are left to the chat engine's
own routes, which check their bodies, scope their requests and report what they reused (see
`snapcache.server.chat`). Ollama's POST routes read their body as JSON whatever its Content-Type
says, as Ollama does.
Out: `X-Snapcache-Restored-Tokens` and `X-Snapcache-Source` headers, and
`usage.prompt_tokens_details.cached_tokens` in a JSON response, or in a final usage chunk of a
stream whose request asked for one (`stream_options.include_usage`), as OpenAI's API does.

The response's start is held until its first body bytes: by then the completion has restored its
prefix (its first chunk, or its whole answer, is ready), so the headers can say what it reused. A
completion that fails before sending anything (a prompt longer than the context, in a stream) still
gets a JSON error with a proper status instead of a broken stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, validate_scope
from snapcache.llama.hook.request_streams import RequestStreams
from snapcache.server.chat.dialects.ollama.ollama_routes import OLLAMA_PATHS
from snapcache.server.checks import COMPLETION_PATHS, RequestChecks, parse_body
from snapcache.server.error_answers import BadRequest, client_error, error_document
from snapcache.server.request_record import RECORD_STATE, RequestRecord

__all__ = ["COMPLETION_PATHS", "SCOPE_HEADER", "SnapcacheMiddleware", "error_document"]

_log = logging.getLogger("snapcache")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCOPE_HEADER = "x-snapcache-scope"
_DONE = b"data: [DONE]"


class SnapcacheMiddleware:
    """Wraps the app: JSON bodies checked (see `checks`), completions scoped and reported, and an
    error that escapes a route answered as JSON."""

    def __init__(self, app: ASGIApp, checks: RequestChecks) -> None:
        self.app = app
        self.checks = checks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        if scope.get("method") != "POST" or path not in self.checks.paths:
            if scope.get("method") == "POST" and path in OLLAMA_PATHS:
                scope = {**scope, "headers": _json_headers(scope.get("headers", []))}  # as Ollama reads them
            await _answered_as_json(self.app, scope, receive, send)
            return
        completion = path in COMPLETION_PATHS
        try:
            record = RequestRecord(scope=_scope_header(scope) if completion else DEFAULT_SCOPE)
        except InvalidArgument as exc:
            await _send_error(
                send, 400, error_document(f"invalid {SCOPE_HEADER} header: {exc}", param=SCOPE_HEADER)
            )
            return
        body, more = await _read_body(receive)
        if not more:  # a client gone before its body ended gets nothing, as before
            try:
                request = parse_body(body)
                changed = await anyio.to_thread.run_sync(self.checks.review, path, request)
            except BadRequest as exc:
                await _send_error(send, exc.status, exc.document())
                return
            if changed is not None:
                request, body = changed, json.dumps(changed).encode()
            # The body is JSON whatever its Content-Type said (`curl -d` sends a form's): FastAPI
            # parses it only under a JSON type.
            scope = {**scope, "headers": _json_headers(scope.get("headers", []), len(body))}
            options = request.get("stream_options")
            record.stream_usage = (
                bool(request.get("stream"))
                and isinstance(options, dict)
                and bool(options.get("include_usage"))
            )
        if not completion:
            await _answered_as_json(self.app, scope, _replay(body, more, receive), send)
            return
        response = _Response(send, record)
        scope = {**scope, "state": {**(scope.get("state") or {}), RECORD_STATE: record}}
        try:
            with RequestStreams.opened() as streams:
                await self.app(scope, _replay(body, more, receive, streams.cancel_all), response.send)
            await response.finish()
        except Exception as exc:
            if response.started:
                raise
            status, payload = _failure(exc)
            await _send_error(send, status, payload)


async def _answered_as_json(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run `app`; an exception before the response starts is a JSON 500, not Starlette's plain text."""
    started = False

    async def watched(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, watched)
    except Exception as exc:
        if started:
            raise
        status, payload = _failure(exc)
        await _send_error(send, status, payload)


def _json_headers(headers: list[tuple[bytes, bytes]], length: int | None = None) -> list[tuple[bytes, bytes]]:
    """`headers` saying that the body is JSON, whatever type they said (`curl -d` sends a form's),
    and, where given, that it is `length` bytes long."""
    replaced = (b"content-type",) if length is None else (b"content-type", b"content-length")
    kept = [(name, value) for name, value in headers if name.lower() not in replaced]
    sized = [] if length is None else [(b"content-length", str(length).encode())]
    return [*kept, (b"content-type", b"application/json"), *sized]


class _Response:
    """Holds the response start until the first body bytes, then adds what the request reused."""

    def __init__(self, send: Send, record: RequestRecord) -> None:
        self._send = send
        self._record = record
        self._start: Message | None = None
        self._stream = False
        self._buffer: list[bytes] = []
        self._last_chunk: dict[str, Any] | None = None
        self._held_end: Message | None = None
        self.started = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            headers = dict(message.get("headers", []))
            self._stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            return
        if kind != "http.response.body" or self._start is None:
            await self._send(message)
            return
        if self._stream:
            await self._stream_body(message)
        else:
            await self._json_body(message)

    async def _begin(self, extra_length: int | None = None) -> None:
        start = self._start
        assert start is not None
        headers = [
            (name, value)
            for name, value in start.get("headers", [])
            if name != b"content-length" or extra_length is None
        ]
        if extra_length is not None:
            headers.append((b"content-length", str(extra_length).encode()))
        headers.extend(self._record.reuse_headers())
        self.started = True
        await self._send({**start, "headers": headers})

    async def finish(self) -> None:
        """Send what is still held once the app has returned without an error."""
        if self._held_end is not None:
            await self._begin()
            await self._send(self._held_end)
            self._held_end = None

    async def _stream_body(self, message: Message) -> None:
        chunk = bytes(message.get("body", b""))
        if not self.started:
            if not chunk and not message.get("more_body", False):
                # A stream that ends before its first event may have failed: the app's return says.
                self._held_end = message
                return
            await self._begin()
        if chunk.startswith(_DONE) and self._record.stream_usage:
            usage = self._usage_chunk()
            if usage is not None:
                await self._send({"type": "http.response.body", "body": usage, "more_body": True})
        elif chunk.startswith(b"data: {"):
            self._last_chunk = _parse_json(chunk[len(b"data: ") :].strip())
        await self._send(message)

    async def _json_body(self, message: Message) -> None:
        self._buffer.append(bytes(message.get("body", b"")))
        if message.get("more_body", False):
            return
        body = b"".join(self._buffer)
        status = int(self._start["status"]) if self._start is not None else 200
        restore = self._record.restore
        if status == 200 and restore is not None:
            document = _parse_json(body)
            if isinstance(document, dict) and isinstance(document.get("usage"), dict):
                document["usage"]["prompt_tokens_details"] = {"cached_tokens": restore.cached_tokens}
                body = json.dumps(document).encode()
        await self._begin(len(body))
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _usage_chunk(self) -> bytes | None:
        """The last chunk of a stream that asked for usage: no choices, the usage of the request."""
        record, last = self._record, self._last_chunk
        if record.restore is None or not isinstance(last, dict):
            return None
        prompt = record.restore.prompt_tokens
        completion = record.completion_tokens or 0
        chunk = {
            "id": last.get("id"),
            "object": last.get("object", "text_completion"),
            "created": last.get("created"),
            "model": last.get("model"),
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": record.restore.cached_tokens},
            },
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _scope_header(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name.decode("latin-1").lower() == SCOPE_HEADER:
            return validate_scope(value.decode("latin-1").strip())
    return DEFAULT_SCOPE


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole request body; the flag says the client went away before sending all of it."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), True
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), False


def _replay(
    body: bytes, disconnected: bool, receive: Receive, gone: Callable[[], None] | None = None
) -> Receive:
    """A receive that hands the app the body already read, then whatever the client sends next;
    `gone()` is called when the app hears that the client disconnected."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            message: Message = (
                {"type": "http.disconnect"}
                if disconnected
                else {"type": "http.request", "body": body, "more_body": False}
            )
        else:
            message = await receive()
        if gone is not None and message["type"] == "http.disconnect":
            gone()
        return message

    return replay


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and error body for a request that failed before answering."""
    for error in _leaves(exc):
        document = client_error(error)
        if document is not None:
            return 400, document
    _log.error("request failed: %s", exc, exc_info=exc)
    return 500, error_document(f"the request failed: {type(exc).__name__}", kind="internal_server_error")


def _leaves(exc: BaseException) -> list[BaseException]:
    inner = getattr(exc, "exceptions", None)  # an exception group from the stream's task group
    if isinstance(inner, tuple):
        return [leaf for error in inner for leaf in _leaves(error)]
    return [exc]


async def _send_error(send: Send, status: int, document: dict[str, Any]) -> None:
    body = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
