"""The device suite: the code a GPU user runs, on a GPU build of llama.cpp with a device, on the
suite's tiny models. Every test here is marked `device`; `make test-device` runs them in
`.venv-vulkan` (llama.cpp built for Vulkan), on a real GPU where there is one and on Mesa's lavapipe
(a Vulkan device that computes on the CPU) where there is none. The main suite (`make test-main`)
leaves them out.

ggml skips CPU-type Vulkan devices unless `GGML_VK_VISIBLE_DEVICES` names one, and reads that once,
when llama.cpp is loaded. So before anything here imports llama_cpp, a fresh process asks the build
which devices it finds: with no GPU but a Vulkan backend, the first Vulkan device (lavapipe) is
named. A setting the caller made is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tiny_model import write_tiny_model

VULKAN_DEVICES_ENV = "GGML_VK_VISIBLE_DEVICES"
# Prints {"backends": [...], "gpus": n} for the llama_cpp this Python has.
_PROBE = """
import json
from snapcache.llama.state.ggml_devices import backends
found = backends()
print(json.dumps({"backends": [b.name for b in found],
                  "gpus": sum(d.is_gpu for b in found for d in b.devices)}))
"""


def _probe(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if done.returncode != 0:
        return {"backends": [], "gpus": 0, "error": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _choose_device() -> dict[str, Any]:
    """What the build finds, after naming lavapipe where a Vulkan build finds no GPU."""
    found = _probe(dict(os.environ))
    if found["gpus"] == 0 and "Vulkan" in found["backends"] and VULKAN_DEVICES_ENV not in os.environ:
        named = _probe({**os.environ, VULKAN_DEVICES_ENV: "0"})
        if named["gpus"]:
            os.environ[VULKAN_DEVICES_ENV] = "0"
            return named
    return found


FOUND = _choose_device()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.device)


def pytest_report_header(config: pytest.Config) -> str:
    named = os.environ.get(VULKAN_DEVICES_ENV)
    setting = f"; {VULKAN_DEVICES_ENV}={named}" if named is not None else ""
    return f"device suite: llama.cpp backends {FOUND['backends']}, {FOUND['gpus']} GPU(s){setting}"


@pytest.fixture(scope="session")
def gpu() -> Any:
    """The GPU llama.cpp offloads to; the suite fails (under SNAPCACHE_REQUIRE_ALL=1) where there is none."""
    from snapcache.llama.state.ggml_devices import gpu_devices

    found = gpu_devices()
    if not found:
        detail = FOUND.get("error") or f"backends {FOUND['backends']}"
        pytest.skip(
            f"no GPU device in this llama.cpp build ({detail}): run it in .venv-vulkan (make test-device)"
        )
    return found[0]


NO_HOST_BUFFER = "a GPU without a pinned host buffer type"


@pytest.fixture(scope="session")
def pinned_gpu(gpu: Any) -> Any:
    """The GPU, where it copies states through pinned host memory (CUDA, Vulkan; Metal shares its
    memory with the CPU and has no such type: those tests skip there)."""
    if not gpu.host_buffer_type:
        pytest.skip(f"{NO_HOST_BUFFER} ({gpu.describe()}): states are copied from plain memory")
    return gpu


@pytest.fixture(scope="session")
def gemma2_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny gemma2: a sliding window on every other layer."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-gemma2.gguf", "gemma2")


@pytest.fixture
def on_gpu(gpu: Any, make_llama: Any) -> Any:
    """Factory `on_gpu(model_path, gpu_layers=-1, **kwargs)`: a Llama with that many layers on the GPU."""

    def factory(model_path: Path, gpu_layers: int = -1, **kwargs: Any) -> Any:
        return make_llama(model_path, n_gpu_layers=gpu_layers, **kwargs)

    return factory


def snapcache_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    """`python -m snapcache ARGS` (a command with `--json`) in a fresh process, as a user runs it:
    its exit status and the JSON it printed; never a traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "snapcache", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def snapcache_command() -> Any:
    """`snapcache_json`, for the tests (they cannot import a conftest)."""
    return snapcache_json
