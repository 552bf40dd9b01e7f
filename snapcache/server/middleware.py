"""The ASGI layer around llama-cpp-python's completion routes: scope in, reuse out.

In: the `X-Snapcache-Scope` header picks the request's scope (a bad one is a 400), and requests the
model cannot serve (an empty message list) are answered with a 400 before they queue for it.
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

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, validate_scope
from snapcache.server.request import RequestRecord, serving

__all__ = ["COMPLETION_PATHS", "SCOPE_HEADER", "SnapcacheMiddleware", "error_document"]

_log = logging.getLogger("snapcache")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCOPE_HEADER = "x-snapcache-scope"
RESTORED_HEADER = b"x-snapcache-restored-tokens"
SOURCE_HEADER = b"x-snapcache-source"
CHAT_PATH = "/v1/chat/completions"
COMPLETION_PATHS = frozenset({CHAT_PATH, "/v1/completions", "/v1/engines/copilot-codex/completions"})
_DONE = b"data: [DONE]"
_CONTEXT_EXCEEDED = "exceed context window"


def error_document(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An error in the OpenAI API's format, as clients parse it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class SnapcacheMiddleware:
    """Wraps the app; only the completion routes are touched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in COMPLETION_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            record = RequestRecord(scope=_scope_header(scope))
        except InvalidArgument as exc:
            await _send_error(
                send, 400, error_document(f"invalid {SCOPE_HEADER} header: {exc}", param=SCOPE_HEADER)
            )
            return
        body, more = await _read_body(receive)
        request = _parse_json(body)
        if request is None and not more:
            await _send_error(send, 400, error_document("the request body is not valid JSON"))
            return
        if not isinstance(request, dict) and not more:
            await _send_error(send, 400, error_document("the request body must be a JSON object"))
            return
        if isinstance(request, dict):
            problem = _unservable(scope["path"], request)
            if problem is not None:
                await _send_error(send, 400, error_document(problem[1], param=problem[0]))
                return
            options = request.get("stream_options")
            record.stream_usage = (
                bool(request.get("stream"))
                and isinstance(options, dict)
                and bool(options.get("include_usage"))
            )
        response = _Response(send, record, chat=scope["path"] == CHAT_PATH)
        token = serving.set(record)
        try:
            await self.app(scope, _replay(body, more, receive), response.send)
            await response.finish()
        except Exception as exc:
            if response.started:
                raise
            status, payload = _failure(exc)
            await _send_error(send, status, payload)
        finally:
            serving.reset(token)


class _Response:
    """Holds the response start until the first body bytes, then adds what the request reused."""

    def __init__(self, send: Send, record: RequestRecord, *, chat: bool) -> None:
        self._send = send
        self._record = record
        self._chat = chat
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
        restore = self._record.restore
        if restore is not None:
            headers.append((RESTORED_HEADER, str(restore.restored_tokens).encode()))
            headers.append((SOURCE_HEADER, (restore.source or "none").encode()))
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
            "object": last.get("object", "chat.completion.chunk" if self._chat else "text_completion"),
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


def _replay(body: bytes, disconnected: bool, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then whatever the client sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if disconnected:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _unservable(path: str, request: dict[str, Any]) -> tuple[str | None, str] | None:
    """(parameter, message) for a request that no model could answer.

    Bodies are checked against llama-cpp-python's own request models here, because its route
    handler turns a validation error into a 500 whose message quotes its source.
    """
    from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest
    from pydantic import ValidationError

    model = CreateChatCompletionRequest if path == CHAT_PATH else CreateCompletionRequest
    try:
        model.model_validate(request)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or None
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return where, f"{where or 'request'}: {first.get('msg', 'invalid value')}{more}"
    if path == CHAT_PATH and request.get("messages", []) == []:
        return "messages", "messages must hold at least one message"
    return None


def _failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and error body for a completion that failed before answering."""
    for error in _leaves(exc):
        if isinstance(error, ValueError) and _CONTEXT_EXCEEDED in str(error):
            return 400, error_document(str(error), param="messages", code="context_length_exceeded")
    _log.error("completion failed: %s", exc, exc_info=exc)
    return 500, error_document(f"the completion failed: {type(exc).__name__}", kind="internal_server_error")


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
