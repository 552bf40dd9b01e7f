"""Pinned host memory on a real device: captures and restores go through the device's own host
buffer type, its total stays under `$SNAPCACHE_PINNED_MEMORY` (capped at half the machine), and it is
let go of on `detach`, on the Llama's `close`, at the Llama's end and with a scheduler. And the
set-ups that go wrong: a GPU build that finds no device runs on the CPU, and `snapcache doctor` names
each case.
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from snapcache import load_llama
from snapcache.llama.batch import SamplingParams, Scheduler
from snapcache.llama.hook.cached import CachedLlama, attach, detach
from snapcache.llama.state import host_memory
from snapcache.llama.state.capture_buffer import capture_buffer
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

N_CTX = 1024
PROMPT = "You are a careful desktop assistant. Answer in one short line.\n" * 10 + "Question: why?\nAnswer:"
GREEDY: dict[str, Any] = {"max_tokens": 12, "temperature": 0.0}


def held() -> int:
    gc.collect()
    report = host_memory.pinned_report()
    return 0 if report is None else int(report["held_bytes"])  # type: ignore[call-overload]


def answer(llm: Any) -> str:
    return str(llm.create_completion(PROMPT, **GREEDY)["choices"][0]["text"])


@pytest.fixture
def fresh_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's pinned memory made anew on first use, so that a limit set in the test applies."""
    monkeypatch.setattr(host_memory, "_pinned_looked", False)
    monkeypatch.setattr(host_memory, "_pinned", None)


def test_states_go_through_the_device_s_own_pinned_memory(
    pinned_gpu: Any, on_gpu: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    buffer_type = host_memory.device_host_buffer_type()
    assert buffer_type is not None
    assert buffer_type.name.endswith("_Host")  # Vulkan_Host, CUDA_Host, ...
    cached = CachedLlama(on_gpu(tiny_model_path, n_ctx=N_CTX), store)
    answer(cached)
    buffer = capture_buffer(cached.llm)
    assert buffer.for_device
    assert buffer.pinned  # the capture went through it
    report = host_memory.pinned_report()
    assert report is not None
    assert report["buffer_type"] == buffer_type.name
    assert held() >= buffer.nbytes > 0


@pytest.mark.parametrize("end", ["detach", "close", "drop"])
def test_pinned_memory_is_let_go_of_on_detach_close_and_the_llama_s_end(
    end: str, pinned_gpu: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    before = held()
    llm = load_llama(tiny_model_path, n_ctx=N_CTX, n_threads=2, n_gpu_layers=-1)
    if end == "detach":
        hook = attach(llm, store)
        answer(llm)  # read and saved: the capture went through pinned memory
        answer(llm)  # the same prompt again: restored, its blob assembled there
        restore = hook.last_restore
    else:
        cached = CachedLlama(llm, store)
        answer(cached)
        answer(cached)
        restore = cached.last_restore
        del cached
    assert restore is not None
    assert restore.restored_tokens >= 64
    assert capture_buffer(llm).pinned
    assert held() > before
    if end == "detach":
        assert detach(llm)
        assert held() == before
        llm.close()
    elif end == "close":
        llm.close()
        assert held() == before
    else:
        del llm  # a Llama nobody holds any more: its memory goes with it
        assert held() == before


def test_a_scheduler_lets_its_staging_memory_go_when_closed(
    pinned_gpu: Any, on_gpu: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    llm = on_gpu(tiny_model_path, n_ctx=2048)
    prompt = llm.tokenize(PROMPT.encode())
    before = held()
    for _ in range(2):  # read, then restore from the store into a new context
        with Scheduler(llm, store, n_seq=1, mode="exact") as scheduler:
            request = scheduler.submit(prompt, SamplingParams(temperature=0.0, max_tokens=8))
            request.result(300)
            during = held()
    assert request.restore is not None
    assert request.restore.restored_tokens >= 64
    assert during > before
    assert held() == before


def test_the_pinned_total_stays_under_the_setting_and_a_larger_state_uses_plain_memory(
    pinned_gpu: Any,
    fresh_pinned_memory: None,
    monkeypatch: pytest.MonkeyPatch,
    on_gpu: Any,
    tiny_model_path: Path,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(host_memory.PINNED_MEMORY_ENV, "64K")  # less than one state
    cold = answer(on_gpu(tiny_model_path, n_ctx=N_CTX))
    with SnapshotStore(tmp_path / "cache", ram_bytes=64 << 20, disk_bytes=0) as store:
        first = CachedLlama(on_gpu(tiny_model_path, n_ctx=N_CTX), store)
        second = CachedLlama(on_gpu(tiny_model_path, n_ctx=N_CTX), store)
        assert answer(first) == cold
        restored = answer(second)
    assert second.last_restore is not None
    assert second.last_restore.restored_tokens >= 64
    if second.exact:
        assert restored == cold
    report = host_memory.pinned_report()
    assert report is not None
    assert report["limit_bytes"] == 64 << 10
    assert not capture_buffer(first.llm).pinned
    assert not capture_buffer(second.llm).pinned
    assert held() <= 64 << 10


def test_more_pinned_memory_than_the_machine_has_is_capped_with_a_warning(
    pinned_gpu: Any,
    fresh_pinned_memory: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    on_gpu: Any,
    tiny_model_path: Path,
    store: SnapshotStore,
) -> None:
    monkeypatch.setenv(host_memory.PINNED_MEMORY_ENV, "4096T")
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        cached = CachedLlama(on_gpu(tiny_model_path, n_ctx=N_CTX), store)
        answer(cached)
    assert "more than half of this machine's" in caplog.text
    report = host_memory.pinned_report()
    assert report is not None
    assert report["limit_bytes"] == host_memory.physical_memory() // 2
    assert capture_buffer(cached.llm).pinned


def checks_of(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    """`snapcache doctor --json`'s checks by name."""
    return {check["name"]: check for check in report["checks"]}


def test_doctor_names_the_backend_the_device_and_where_the_k_v_cache_lives(
    gpu: Any, snapcache_command: Any
) -> None:
    checks = checks_of(snapcache_command("doctor", "--json")[1])
    assert checks["backend"]["status"] == "ok"
    assert gpu.describe() in checks["backend"]["detail"]
    assert gpu.describe() in checks["K/V cache"]["detail"]
    assert "every layer offloaded" in checks["K/V cache"]["detail"]
    pinned = checks["pinned memory"]["detail"]
    assert (f"{gpu.host_buffer_type} memory" in pinned) if gpu.host_buffer_type else pinned.startswith("none")


def hidden_devices() -> dict[str, str]:
    """This environment with every device hidden from llama.cpp: an empty device list for Vulkan and
    CUDA (ggml then finds none)."""
    return {**os.environ, "GGML_VK_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""}


def test_a_gpu_build_that_finds_no_device_says_so_and_runs_on_the_cpu(
    gpu: Any, snapcache_command: Any, tiny_model_path: Path, tmp_path: Path
) -> None:
    env = hidden_devices()
    checks = checks_of(snapcache_command("doctor", "--json", env=env)[1])
    assert checks["backend"]["status"] == "warn"
    assert "found no GPU: every layer runs on the CPU" in checks["backend"]["detail"]
    assert checks["K/V cache"]["detail"].startswith("host memory (no GPU found")
    assert "pinned memory" not in checks
    prompt = tmp_path / "system.txt"
    prompt.write_text(PROMPT, encoding="utf-8")
    status, warmed = snapcache_command(
        *("--cache-dir", str(tmp_path / "cache"), "warm", str(prompt)),
        *("--model", str(tiny_model_path), "--threads", "2", "--json"),
        env=env,
    )
    assert status == 0
    assert warmed["token_count"] > 64
