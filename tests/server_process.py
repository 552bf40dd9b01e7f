"""`snapcache serve` as a real process on a free loopback port, for the server tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ServerProcess:
    """One running server: its process, port and log file."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the server by PID and wait until it is gone."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def start_server(
    model: Path,
    cache_dir: Path,
    log_path: Path,
    *extra: str,
    n_ctx: int = 2048,
    env: dict[str, str] | None = None,
    global_options_after: bool = False,
) -> ServerProcess:
    """Start `python -m snapcache serve` and wait until /v1/models answers; `--cache-dir` goes before
    the command, or after it with `global_options_after`."""
    port = free_port()
    cache = ["--cache-dir", str(cache_dir)]
    before, after = ([], cache) if global_options_after else (cache, [])
    command = [sys.executable, "-m", "snapcache", *before, "serve", str(model), *after]
    command += ["--port", str(port), "--n-ctx", str(n_ctx), "--threads", "2", *extra]
    log = log_path.open("wb")
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    log.close()
    server = ServerProcess(process, port, log_path)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"snapcache serve exited with {process.returncode}:\n{server.log()}")
        if http_json("GET", f"{server.base_url}/v1/models", headers=_auth(extra))[0] == 200:
            return server
        time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"snapcache serve did not answer within {_START_TIMEOUT_S} s:\n{server.log()}")


@contextmanager
def running_server(model: Path, cache_dir: Path, log_path: Path, *extra: str, n_ctx: int = 2048) -> Any:
    server = start_server(model, cache_dir, log_path, *extra, n_ctx=n_ctx)
    try:
        yield server
    finally:
        server.kill(signal.SIGTERM)


def http_json(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 300,
) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON or None, headers) of one request; connection errors are status 0."""
    import json

    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data, status, answer_headers = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        data, status, answer_headers = exc.read(), exc.code, dict(exc.headers)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None, {}
    try:
        return status, json.loads(data), answer_headers
    except ValueError:
        return status, None, answer_headers


def wait_until_written(server: ServerProcess, timeout: float = 60) -> dict[str, Any]:
    """Poll /snapcache/stats until no snapshot waits for its disk write; the stats then."""
    deadline = time.monotonic() + timeout
    while True:
        status, stats, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
        store = stats["store"] if status == 200 else None
        if (
            store is not None
            and store["pending_write_bytes"] == 0
            and store["disk_entries"] >= store["ram_entries"]
        ):
            return dict(stats)
        if time.monotonic() > deadline:
            raise AssertionError(f"writes still pending after {timeout} s: {stats}")
        time.sleep(0.1)


def _auth(extra: tuple[str, ...]) -> dict[str, str]:
    if "--api-key" in extra:
        return {"Authorization": f"Bearer {extra[extra.index('--api-key') + 1]}"}
    return {}
