"""Shared fixtures: test models, a Llama factory, an isolated SNAPCACHE_DIR and a store in a tmp dir."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tiny_model import write_tiny_llama

if TYPE_CHECKING:
    from llama_cpp import Llama

    from snapcache.store import SnapshotStore

LLAMA_THREADS = 2
DEFAULT_TEST_N_CTX = 512
STORE_RAM_BYTES = 64 << 20
STORE_DISK_BYTES = 512 << 20

MakeLlama = Callable[..., "Llama"]


def new_llama(model_path: str | Path, n_ctx: int = DEFAULT_TEST_N_CTX, **kwargs: Any) -> Llama:
    """`snapcache.load_llama` on 2 threads (Gemma gets its chat template); other arguments go to Llama."""
    from snapcache import load_llama

    kwargs.setdefault("n_threads", LLAMA_THREADS)
    return load_llama(model_path, n_ctx=n_ctx, **kwargs)


@pytest.fixture(autouse=True)
def snapcache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own default store directory."""
    path = tmp_path / "snapcache-home"
    monkeypatch.setenv("SNAPCACHE_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama model (seed 0) written once per test session."""
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama-0.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_model_path_other_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny architecture with other weights (seed 1): another fingerprint."""
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama-1.gguf", seed=1)


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    """The Gemma-3-270M demo model; skips when its optional package is not installed."""
    from snapcache.demo_model import DEMO_MODEL_NAME, default_model_path

    path = default_model_path()
    if path is None:
        pytest.skip(f"{DEMO_MODEL_NAME} is not installed (pip install 'snapcache[demo]')")
    return path


@pytest.fixture(scope="session")
def llama_factory() -> MakeLlama:
    """`new_llama` for fixtures wider than one test (they close what they make themselves)."""
    return new_llama


@pytest.fixture
def make_llama() -> Iterator[MakeLlama]:
    """Factory `make_llama(model_path, n_ctx=512, **kwargs)`; every Llama it made is closed afterwards."""
    made: list[Llama] = []

    def factory(model_path: str | Path, n_ctx: int = DEFAULT_TEST_N_CTX, **kwargs: Any) -> Llama:
        llm = new_llama(model_path, n_ctx=n_ctx, **kwargs)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close()


@pytest.fixture
def tiny_llama(make_llama: MakeLlama, tiny_model_path: Path) -> Llama:
    """A fresh Llama of the tiny model (n_ctx 512)."""
    return make_llama(tiny_model_path)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SnapshotStore]:
    """A SnapshotStore with a RAM tier and a disk tier under tmp_path / "cache"."""
    from snapcache.store import SnapshotStore

    with SnapshotStore(tmp_path / "cache", ram_bytes=STORE_RAM_BYTES, disk_bytes=STORE_DISK_BYTES) as s:
        yield s


@pytest.fixture
def cached(make_llama: Any, tiny_model_path: Path, store: SnapshotStore) -> Any:
    """Factory: a CachedLlama over a fresh tiny Llama (n_ctx 2048) and the test's store."""
    from chat_support import N_CTX

    from snapcache.llama.cached import CachedLlama

    def factory(scope: str = "default", **kwargs: Any) -> CachedLlama:
        return CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope, **kwargs)

    return factory
