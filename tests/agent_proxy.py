"""A proxy between a real agent (Claude Code, Codex, OpenCode) and a server: forwards each request as
it came, streams the answer back, and keeps both with their timing.

The agent's base URL points here and stays the same while the server behind it restarts
(`upstream_port` changes). Each `Exchange` holds what the agent sent, the answer's bytes, its
status, and from the request's arrival: the first streamed event (sent by both snapcache serve and
llama-server once the prompt is read), the first event with generated output, and when the agent
gave up on the request (the proxy then closes its connection to the server, as a direct one would
be closed). Used by tests/server/test_serve_agents.py and benchmarks/agents_vs_llama_server.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["AgentProxy", "Exchange"]

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "host"})


@dataclass(slots=True)
class Exchange:
    """One request through the proxy: what it asked, what came back and when."""

    method: str
    path: str
    request: Any
    arrived: float  # time.perf_counter() when the proxy had the whole request
    status: int = 0  # 0: no answer (the agent closed the request first, or the server failed)
    streamed: bool = False
    # From the request's arrival at the proxy: to the first streamed event (both servers send it once
    # the prompt is read: the first token), and to the first that carries generated output.
    first_event_s: float | None = None
    first_output_s: float | None = None
    closed_by_agent_s: float | None = None  # the agent closed the request, this long after sending it
    total_s: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    answer: bytes = b""

    def events(self) -> list[dict[str, Any]]:
        """The `data:` documents of a streamed answer, in order."""
        lines = self.answer.decode(errors="replace").splitlines()
        return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]

    @property
    def route(self) -> str:
        return self.path.split("?")[0]

    @property
    def tools(self) -> int:
        tools = self.request.get("tools") if isinstance(self.request, dict) else None
        return len(tools) if isinstance(tools, list) else 0

    @property
    def max_tokens(self) -> int | None:
        if not isinstance(self.request, dict):
            return None
        for key in ("max_tokens", "max_output_tokens", "max_completion_tokens"):
            if isinstance(self.request.get(key), int):
                return int(self.request[key])
        return None

    def prompt_tokens(self) -> tuple[int, int] | None:
        """(prompt tokens, of which restored) from the answer's usage, in the route's own fields."""
        usage = self.usage
        if not usage:
            return None
        if self.route == "/v1/messages":
            restored = int(usage.get("cache_read_input_tokens") or 0)
            fresh = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
            return fresh + restored, restored
        if self.route == "/v1/responses":
            details = usage.get("input_tokens_details") or {}
            return int(usage.get("input_tokens") or 0), int(details.get("cached_tokens") or 0)
        if "prompt_tokens" in usage:
            details = usage.get("prompt_tokens_details") or {}
            return int(usage["prompt_tokens"]), int(details.get("cached_tokens") or 0)
        return None

    def record(self, session_start: float) -> dict[str, Any]:
        tokens = self.prompt_tokens()
        return {
            "method": self.method,
            "path": self.path,
            "sent_s": self.arrived - session_start,
            "status": self.status,
            "streamed": self.streamed,
            "tools": self.tools,
            "max_tokens": self.max_tokens,
            "first_event_s": self.first_event_s,
            "first_output_s": self.first_output_s,
            "closed_by_agent_s": self.closed_by_agent_s,
            "total_s": self.total_s,
            "prompt_tokens": tokens[0] if tokens else None,
            "restored_tokens": tokens[1] if tokens else None,
        }


def is_output(event: dict[str, Any]) -> bool:
    """Whether a streamed event carries generated text or a tool call's arguments, in any of the APIs."""
    kind = event.get("type")
    if kind == "content_block_delta":
        return True
    if kind in (
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
    ):
        return True
    choices = event.get("choices")
    if isinstance(choices, list) and choices:
        delta = choices[0].get("delta") or {}
        return bool(delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))
    return False


def usage_in(event: dict[str, Any]) -> dict[str, Any] | None:
    kind = event.get("type")
    if kind == "message_start":
        usage = (event.get("message") or {}).get("usage")
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        usage = (event.get("response") or {}).get("usage")
    else:
        usage = event.get("usage")
    return usage if isinstance(usage, dict) else None


class AgentProxy(ThreadingHTTPServer):
    """Forwards every request to the server as it came, streams the answer back, and times both."""

    daemon_threads = True

    def __init__(self, upstream_port: int, timeout: float) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream_port = upstream_port
        self.upstream_timeout = timeout
        self.exchanges: list[Exchange] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def mark(self) -> int:
        with self.lock:
            return len(self.exchanges)

    def since(self, start: int) -> list[Exchange]:
        with self.lock:
            return self.exchanges[start:]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # An agent that drops a kept-alive connection between requests is no error of anyone's.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AgentProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = bytearray()
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        return bytes(body)

    def _forward(self) -> None:
        body = self._body()
        started = time.perf_counter()
        try:
            document: Any = json.loads(body) if body else None
        except ValueError:
            document = body[:2000]
        exchange = Exchange(self.command, self.path, document, arrived=started)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(
            "127.0.0.1", self.server.upstream_port, timeout=self.server.upstream_timeout
        )
        forwarding = threading.Event()
        watcher = threading.Thread(
            target=self._watch_agent, args=(upstream, exchange, forwarding), daemon=True
        )
        watcher.start()
        kept = bytearray()
        pending = b""
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            exchange.status = answer.status
            exchange.streamed = answer.getheader("Content-Type", "").startswith("text/event-stream")
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_BY_HOP | {"content-length", "date", "server"}:
                    self.send_header(key, value)
            self.send_header("Transfer-Encoding", "chunked")
            self._to_agent(exchange, None)
            while chunk := answer.read1(65536):
                kept += chunk
                if exchange.streamed:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    self._read_events(exchange, lines)
                self._to_agent(exchange, b"%X\r\n%s\r\n" % (len(chunk), chunk))
            self._to_agent(exchange, b"0\r\n\r\n")
        except OSError as exc:
            kept += f"\n[proxy: {exc!r}]".encode()
            if exchange.closed_by_agent_s is not None:
                self.close_connection = True
            elif exchange.status == 0:
                exchange.status = 502
                with contextlib.suppress(OSError):
                    self.send_error(502, repr(exc))
        finally:
            forwarding.set()
            watcher.join()
            upstream.close()
            exchange.total_s = time.perf_counter() - started
            exchange.answer = bytes(kept)
            if not exchange.streamed and exchange.status == 200 and exchange.closed_by_agent_s is None:
                exchange.first_event_s = exchange.first_output_s = exchange.total_s
                with contextlib.suppress(ValueError):
                    whole = json.loads(kept)
                    usage = usage_in(whole) if isinstance(whole, dict) else None
                    exchange.usage.update(usage or {})
            with self.server.lock:
                self.server.exchanges.append(exchange)

    def _to_agent(self, exchange: Exchange, data: bytes | None) -> None:
        """Send `data` (None: the headers) to the agent; a failure means that it closed the request."""
        try:
            if data is None:
                self.end_headers()
            else:
                self.wfile.write(data)
                self.wfile.flush()
        except OSError:
            if exchange.closed_by_agent_s is None:
                exchange.closed_by_agent_s = time.perf_counter() - exchange.arrived
            raise

    def _watch_agent(
        self, upstream: http.client.HTTPConnection, exchange: Exchange, forwarding: threading.Event
    ) -> None:
        """Close the connection to the server once the agent closes its own, as a direct connection
        would be closed (an agent gives up on a slow request: Claude Code after 5 minutes)."""
        while not forwarding.wait(0.2):
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                continue
            try:
                gone = not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                gone = True
            if gone:
                exchange.closed_by_agent_s = time.perf_counter() - exchange.arrived
                if upstream.sock is not None:
                    with contextlib.suppress(OSError):
                        upstream.sock.shutdown(socket.SHUT_RDWR)
                return

    @staticmethod
    def _read_events(exchange: Exchange, lines: list[bytes]) -> None:
        for line in lines:
            if not line.startswith(b"data: {"):
                continue
            try:
                event = json.loads(line[len(b"data: ") :])
            except ValueError:
                continue
            if exchange.first_event_s is None:
                exchange.first_event_s = time.perf_counter() - exchange.arrived
            if exchange.first_output_s is None and is_output(event):
                exchange.first_output_s = time.perf_counter() - exchange.arrived
            usage = usage_in(event)
            if usage:
                exchange.usage.update({k: v for k, v in usage.items() if v is not None})
