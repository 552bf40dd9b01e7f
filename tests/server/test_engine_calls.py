"""The server calls its model engine and leaves the rest alone: after text completions (whole and
streamed), chats, tokenizing and a warm, the served Llama has the methods it was loaded with,
llama-cpp-python's server module its own globals, and two apps serve two models side by side in
one process, each answering with its own. What decodes on the Llama's own context does so on
threads that end (`openmp_teams`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from fastapi.testclient import TestClient
from llama_cpp.server import app as llama_server
from llama_cpp.server.errors import RouteErrorHandler

from snapcache.server.app import ServeOptions, create_app
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

MakeLlama = Callable[..., llama_cpp.Llama]
SYSTEM = "You answer questions about files. " * 12


def _attributes(llm: llama_cpp.Llama) -> dict[str, int]:
    """The Llama's own callable attributes (a method set on the instance shadows its class's), by
    identity; the rest is the state its completions change (and the cache's notes of what its
    context holds)."""
    return {name: id(value) for name, value in vars(llm).items() if callable(value)}


def _server_module() -> dict[str, Any]:
    return {
        "proxy": llama_server._llama_proxy,
        "settings": llama_server._server_settings,
        "get_llama_proxy": llama_server.get_llama_proxy,
        "error_wrapper": RouteErrorHandler.error_message_wrapper,
    }


def _exercise(client: TestClient) -> None:
    prompt = {"prompt": SYSTEM + "Which file?", "max_tokens": 3, "temperature": 0.0}
    assert client.post("/v1/completions", json=prompt).status_code == 200
    with client.stream("POST", "/v1/completions", json={**prompt, "stream": True}) as streamed:
        assert streamed.status_code == 200
        events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chat = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        "max_tokens": 3,
    }
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert client.post("/v1/chat/completions", json={**chat, "stream": True}).status_code == 200
    tokens = client.post("/extras/tokenize", json={"input": "hello"}).json()["tokens"]
    assert client.post("/extras/detokenize", json={"tokens": tokens}).json()["text"].endswith("hello")
    assert client.post("/snapcache/warm", json={"system": SYSTEM}).status_code == 200


@pytest.mark.parametrize("parallel", [ServeOptions().parallel, 1], ids=["default", "parallel-1"])
def test_serving_leaves_the_llama_and_llama_cpp_pythons_server_as_they_were(
    make_llama: MakeLlama, tiny_model_path: Path, tmp_path: Path, parallel: int
) -> None:
    llm = make_llama(tiny_model_path, n_ctx=1024)
    attributes, module = _attributes(llm), _server_module()
    app = create_app(llm, SnapshotStore(directory=tmp_path / "cache"), ServeOptions(parallel=parallel))
    with TestClient(app) as client:
        _exercise(client)
        assert _attributes(llm) == attributes
        reused = client.post(
            "/v1/completions", json={"prompt": SYSTEM + "Which file?", "max_tokens": 2, "temperature": 0.0}
        )
        assert int(reused.headers["x-snapcache-restored-tokens"]) > 0  # and the cache is behind it
    assert _attributes(llm) == attributes
    assert _server_module() == module


def test_two_apps_in_one_process_serve_their_own_models(
    make_llama: MakeLlama, tiny_model_path: Path, tiny_model_path_other_seed: Path, tmp_path: Path
) -> None:
    apps = [
        create_app(
            make_llama(path, n_ctx=512),
            SnapshotStore(directory=tmp_path / name),
            ServeOptions(model_alias=name, parallel=parallel),
        )
        for path, name, parallel in ((tiny_model_path, "first", 4), (tiny_model_path_other_seed, "second", 1))
    ]
    prompt = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.0}
    with TestClient(apps[0]) as first, TestClient(apps[1]) as second:
        assert [model["id"] for model in first.get("/v1/models").json()["data"]] == ["first"]
        assert [model["id"] for model in second.get("/v1/models").json()["data"]] == ["second"]
        texts = [
            client.post("/v1/completions", json=prompt).json()["choices"][0]["text"]
            for client in (first, second)
        ]
    assert texts[0] != texts[1]  # two models with other weights


def test_the_llamas_own_context_decodes_only_on_threads_that_end(
    make_llama: MakeLlama,
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At the default --parallel (the one-at-a-time path streams in the request's worker threads).
    # The Llama's own decodes (llama-cpp-python's `_internals`; the scheduler calls llama.cpp itself):
    # a thread that decoded and stays keeps an OpenMP team, which slows every decode.
    decoding: list[threading.Thread] = []
    real_decode = llama_cpp.llama_cpp.llama_decode

    def watched(ctx: Any, batch: Any) -> int:
        decoding.append(threading.current_thread())
        return int(real_decode(ctx, batch))

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_decode", watched)
    llm = make_llama(tiny_model_path, n_ctx=1024)
    app = create_app(llm, SnapshotStore(directory=tmp_path / "cache"), ServeOptions())
    with TestClient(app) as client:
        _exercise(client)
        # mirostat: a call the batched path hands to the Llama's own context, whole and streamed
        prompt = {"prompt": SYSTEM + "Which one?", "max_tokens": 2, "mirostat_mode": 2}
        assert client.post("/v1/completions", json=prompt).status_code == 200
        assert client.post("/v1/completions", json={**prompt, "stream": True}).status_code == 200
        threads = set(decoding)
        assert threads  # the warm at least
        assert threading.main_thread() not in threads
        for thread in threads:
            thread.join(timeout=10)  # a stream's thread ends with its stream
        assert [thread.name for thread in threads if thread.is_alive()] == []
