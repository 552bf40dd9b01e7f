"""The modules a request passes on its way to the store, read off the call stack at the store's first
read (an Anthropic Messages request through the server, at the default `--parallel` and at 1) and
first write (`CachedLlama.warm`): each layer is entered once and in order (server, then the llama
adapter, then the store), no module is visited twice, and the paths share the adapter's stored-state
modules. `-s` prints the paths."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import llama_cpp
import pytest
from fastapi.testclient import TestClient

import snapcache
from snapcache.llama.batch import Scheduler
from snapcache.server.app import ServeOptions, create_app
from snapcache.store import SnapshotStore
from snapcache.store.snapshot_store import SnapshotStore as StoreClass

pytestmark = pytest.mark.model

READS = ("lookup", "lookup_with_tier", "get", "get_block", "get_blocks", "stored_tokens")
WRITES = ("put", "put_many", "defer")
LAYERS = ("snapcache.server", "snapcache.llama", "snapcache.store")
ENGINE = "snapcache.server.chat.engine.chat_engine"


class FirstCall:
    """The snapcache modules on the stack at the first call of one of `verbs` on the store, from
    outside it (consecutive frames of one module as one)."""

    def __init__(self, verbs: tuple[str, ...], owner: type = StoreClass) -> None:
        self.verbs = verbs
        self.owner = owner
        self.path: list[str] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def modules(frame: FrameType | None) -> list[str]:
        names: list[str] = []
        while frame is not None:
            name = str(frame.f_globals.get("__name__", ""))
            if name.startswith("snapcache") and (not names or names[-1] != name):
                names.append(name)
            frame = frame.f_back
        return names[::-1]

    def watching(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for verb in self.verbs:
            monkeypatch.setattr(self.owner, verb, self._wrapped(getattr(self.owner, verb)))

    def _wrapped(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                if self.path is None:
                    self.path = [*self.modules(sys._getframe(1)), self.owner.__module__]
            return method(*args, **kwargs)

        return watched


def layers_in_order(path: list[str]) -> list[str]:
    """The layers `path` enters, in order, each time it enters one."""
    entered: list[str] = []
    for module in path:
        layer = next((layer for layer in LAYERS if module.startswith(layer)), None)
        if layer is not None and (not entered or entered[-1] != layer):
            entered.append(layer)
    return entered


@pytest.fixture
def tiny_llama(tiny_model_path: Path) -> Iterator[llama_cpp.Llama]:
    llm = llama_cpp.Llama(model_path=str(tiny_model_path), n_ctx=2048, n_threads=2, verbose=False)
    yield llm
    llm.close()


@pytest.mark.parametrize("parallel", [ServeOptions().parallel, 1], ids=["default", "parallel-1"])
def test_a_messages_request_reaches_the_store_through_each_layer_once(
    tiny_llama: llama_cpp.Llama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: int
) -> None:
    """The request's worker thread starts in the chat engine and reaches the llama adapter through the
    model engine: at the default `--parallel` it hands its prompt to the scheduler, whose thread
    reads the store; at `--parallel 1` it reads the store itself, through the hook."""
    first_read = FirstCall(READS)
    submitted = FirstCall(("submit",), owner=Scheduler)
    app = create_app(tiny_llama, SnapshotStore(directory=tmp_path / "cache"), ServeOptions(parallel=parallel))
    with TestClient(app) as client:
        first_read.watching(monkeypatch)
        submitted.watching(monkeypatch)
        body = {
            "model": "m",
            "max_tokens": 2,
            "system": "You help. " * 40,
            "messages": [{"role": "user", "content": "hi"}],
        }
        assert client.post("/v1/messages", json=body).status_code == 200
    path = first_read.path
    assert path is not None
    assert len(path) == len(set(path)), path
    assert "snapcache.llama.stored.prefix_cache" in path  # the one prefix cache both paths use
    if parallel == 1:
        assert submitted.path is None  # no scheduler
        print("\nAnthropic Messages at --parallel 1, route to the store's first read:", " > ".join(path))
        assert (
            path[0] == "snapcache.server.chat.engine.chat_engine"
        )  # where the request's worker thread begins
        assert "snapcache.server.model_engine" in path
        assert "snapcache.llama.hook.completion_flow" in path  # the hook, installed for the call
        assert layers_in_order(path) == list(LAYERS)
        return
    request = submitted.path
    assert request is not None
    print(f"\nAnthropic Messages at --parallel {parallel}, route to the scheduler:", " > ".join(request))
    print("  then the scheduler's thread, to the store's first read:", " > ".join(path))
    assert (
        request[0] == "snapcache.server.chat.engine.chat_engine"
    )  # where the request's worker thread begins
    assert "snapcache.server.model_engine" in request
    assert layers_in_order(request) == ["snapcache.server", "snapcache.llama"]
    assert len(request) == len(set(request)), request
    assert path[0] == request[-1] == "snapcache.llama.batch._scheduler"
    assert layers_in_order(path) == ["snapcache.llama", "snapcache.store"]


def test_a_warmed_prompt_reaches_the_store_through_each_layer_once(
    tiny_llama: llama_cpp.Llama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_write = FirstCall(WRITES)
    cached = snapcache.CachedLlama(tiny_llama, SnapshotStore(directory=tmp_path / "cache"))
    first_write.watching(monkeypatch)
    cached.warm("You help with files. " * 40)
    path = first_write.path
    assert path is not None
    print("\nCachedLlama.warm, call to the store's first write:", " > ".join(path))
    assert layers_in_order(path) == ["snapcache.llama", "snapcache.store"]
    assert len(path) == len(set(path)), path
    assert "snapcache.llama.stored.stored_states" in path
