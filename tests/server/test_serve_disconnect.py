"""A client that goes while its prompt is still being read: the server stops reading it, whether
the answer was to be streamed or sent whole.

Claude Code gives up on a request after 5 minutes without a token and sends it again; until then
the server read on, and then answered, a request nobody would read. Real server (`--parallel 2`, the
batched path, whose prompt reads go in steps), a real socket closed mid-read, on the tiny model with
a prompt of about 30,000 tokens (about 14 s to read and answer here, cold).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from server_process import ServerProcess, http_json, running_server

pytestmark = pytest.mark.model

N_CTX = 32768


def in_flight(server: ServerProcess) -> int:
    status, stats, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
    assert status == 200, stats
    return int(stats["parallel"]["running"]) + int(stats["parallel"]["waiting"])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": "m", "max_tokens": 256, "stream": True}),
        ("/v1/responses", {"model": "m", "max_output_tokens": 256, "stream": True}),
        ("/v1/messages", {"model": "m", "max_tokens": 256}),
        ("/v1/responses", {"model": "m", "max_output_tokens": 256}),
    ],
    ids=["messages", "responses", "messages-whole", "responses-whole"],
)
def test_a_client_gone_before_its_first_token_stops_its_prompt_read(
    tiny_model_path: Path, tmp_path: Path, path: str, body: dict[str, object]
) -> None:
    words = " ".join(f"w{i % 97}" for i in range(4500))  # a fresh cache: read, not restored
    message = [{"role": "user", "content": words}]
    document = {**body, ("messages" if path == "/v1/messages" else "input"): message}
    raw = json.dumps(document).encode()
    with running_server(
        tiny_model_path, tmp_path / "cache", tmp_path / "server.log", "--parallel", "2", n_ctx=N_CTX
    ) as server:
        client = socket.create_connection(("127.0.0.1", server.port))
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        client.sendall(f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        deadline = time.monotonic() + 30
        while not in_flight(server):  # submitted: its prompt is being read
            assert time.monotonic() < deadline, "the request never reached the scheduler"
            time.sleep(0.01)
        client.close()
        gone = time.monotonic()
        while in_flight(server) and time.monotonic() - gone < 30:
            time.sleep(0.05)
        # Before, the read (and the answer up to its first event) went on: 14 s here.
        assert time.monotonic() - gone < 5, "the server read on for a client that had gone"
        status, _, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
        assert status == 200  # and it still serves
