"""Shared fixtures: test models, a Llama factory, an isolated SNAPCACHE_DIR and a store in a tmp dir;
and SNAPCACHE_REQUIRE_ALL=1, under which a skipped test fails unless its reason is in ALLOWED_SKIPS."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tiny_model import write_geometry_model, write_tiny_llama

# llama.cpp's OpenMP threads spin while idle, one team per thread that decodes; the suite decodes on
# several threads (servers' request threads, the scheduler's), and spinning idle teams slowed such
# decodes many times on 2 cores. `snapcache serve` sets the same unless told otherwise. Read once,
# when llama.cpp is loaded, so it is set before anything imports llama_cpp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if TYPE_CHECKING:
    from llama_cpp import Llama

    from snapcache.store import SnapshotStore

LLAMA_THREADS = 2
DEFAULT_TEST_N_CTX = 512
STORE_RAM_BYTES = 64 << 20
STORE_DISK_BYTES = 512 << 20

MakeLlama = Callable[..., "Llama"]

# The skips that stay skips under SNAPCACHE_REQUIRE_ALL=1 (prefixes of their reasons): those a root
# user causes, those of another platform or kernel, and the long tests run by hand. Any other skip
# (a missing model, redis-server, client library or mount permission) means that CI did not run a
# test it should have, so it fails there. The README's test section lists these.
ALLOWED_SKIPS = (
    "root may write anywhere",
    "root writes anywhere",
    "POSIX mode bits",
    "POSIX permission bits",
    "no fork here",
    "maps ahead on Linux 5.14 and later",
    "a system without transparent huge pages",
    "set SNAPCACHE_LONG_TESTS=1 to run it",
    "Claude Code and Codex are not installed",
    # the device suite's pinned-memory tests on a GPU that shares its memory (Metal)
    "a GPU without a pinned host buffer type",
)


def require_all() -> bool:
    """Whether SNAPCACHE_REQUIRE_ALL=1: every skip outside ALLOWED_SKIPS fails the test."""
    return os.environ.get("SNAPCACHE_REQUIRE_ALL") == "1"


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_if_required(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not (require_all() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under SNAPCACHE_REQUIRE_ALL=1, which allows only ALLOWED_SKIPS: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    _fail_if_required(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """A module skipped as a whole (`pytest.importorskip` at its top) goes through the same rule."""
    report = yield
    _fail_if_required(report)
    return report


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
def wide_heads_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small llama with 32-wide attention heads, which a quantized V cache needs (the tiny
    model's are narrower): for `kv_cache="q8_0"` and flash attention."""
    path = tmp_path_factory.mktemp("models") / "wide-heads.gguf"
    return write_geometry_model(path, n_layers=2, n_head_kv=2, head_dim=32, n_embd=64, n_head=2, n_ff=128)


@pytest.fixture(scope="session")
def tiny_model_path_other_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny architecture with other weights (seed 1): another fingerprint."""
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama-1.gguf", seed=1)


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    """The Gemma-3-270M demo model; skips when its optional package is not installed (a failure under
    SNAPCACHE_REQUIRE_ALL=1)."""
    from snapcache.llama.setup.demo_model import DEMO_MODEL_NAME, default_model_path

    path = default_model_path()
    if path is None:
        pytest.skip(f"{DEMO_MODEL_NAME} is not installed or incomplete (pip install 'snapcache[demo]')")
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

    from snapcache.llama.hook.cached import CachedLlama

    def factory(scope: str = "default", **kwargs: Any) -> CachedLlama:
        return CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope, **kwargs)

    return factory
