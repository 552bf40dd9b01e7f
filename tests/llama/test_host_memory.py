"""Pinned host memory for copies to and from a GPU: found through ggml's backend API, bounded, freed
with its last view, and (on this CPU build) a no-op for every Llama.

The CPU build has no device with a host buffer type, so the end-to-end tests stand ggml's own CPU
buffer type in for it: the memory is allocated, lent and freed through the very calls a CUDA build
makes, and the real llama.cpp copies states out of and into it.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from test_scheduler import GREEDY, N_CTX, SYSTEM, prompts, solo

from snapcache.errors import InvalidArgument
from snapcache.formats import threads
from snapcache.llama.batch import Scheduler
from snapcache.llama.batch import _context as context_module
from snapcache.llama.hook.cached import CachedLlama, attach, detach
from snapcache.llama.state import capture_buffer as capture_buffer_module
from snapcache.llama.state import host_memory
from snapcache.llama.state.capture_buffer import CaptureBuffer, capture_buffer
from snapcache.llama.state.host_memory import (
    PinnedMemory,
    cpu_buffer_type,
    parse_byte_size,
    pinned_limit,
)
from snapcache.store import SnapshotStore


def plain_host_memory(limit: int = 1 << 30) -> PinnedMemory:
    buffer_type = cpu_buffer_type()
    assert buffer_type is not None, "ggml's backend API is found in the llama_cpp package"
    return PinnedMemory(buffer_type, limit)


def test_this_build_has_no_gpu_host_memory_and_a_cpu_llama_gets_none(tiny_llama: Any) -> None:
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("a GPU build: its device has a host buffer type")
    assert host_memory.device_host_buffer_type() is None
    assert host_memory.pinned_memory_for(tiny_llama) is None
    buffer = capture_buffer(tiny_llama)
    assert not buffer.for_device
    assert buffer.workers == threads.RESTORE_THREADS


def test_memory_is_bounded_and_freed_with_its_last_view() -> None:
    memory = plain_host_memory(limit=3 << 20)
    first = memory.allocate(2 << 20)
    assert first is not None
    assert first.nbytes == 2 << 20
    assert memory.held_bytes == 2 << 20
    assert memory.allocate(2 << 20) is None  # past the limit: the caller uses plain memory
    first[:] = 7
    view = first[100:200]
    del first
    gc.collect()
    assert memory.held_bytes == 2 << 20  # a view still reads it
    assert int(view.sum()) == 700
    del view
    gc.collect()
    assert memory.held_bytes == 0
    again = memory.allocate(3 << 20)
    assert again is not None
    assert memory.allocate(0) is None


@pytest.mark.parametrize(
    ("text", "size"), [("0", 0), ("4096", 4096), ("512M", 512 << 20), ("8GiB", 8 << 30), (" 2 k ", 2048)]
)
def test_sizes_read_with_or_without_a_unit(text: str, size: int) -> None:
    assert parse_byte_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "1.5G", "lots", "4X"])
def test_a_size_that_is_no_size_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="whole number of bytes"):
        parse_byte_size(text)


def test_the_limit_is_a_setting_or_a_quarter_of_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_memory.PINNED_MEMORY_ENV, "1G")
    assert pinned_limit() == 1 << 30
    monkeypatch.delenv(host_memory.PINNED_MEMORY_ENV)
    assert 0 < pinned_limit() < 1 << 50


def test_a_capture_buffer_on_host_memory_uses_it_until_the_limit() -> None:
    memory = plain_host_memory(limit=2_000)
    buffer = CaptureBuffer(memory)
    assert buffer.for_device
    assert buffer.workers == threads.HOST_COPY_THREADS
    lent = buffer.lease(1_000)
    assert buffer.pinned
    assert buffer.holds(lent)
    assert memory.held_bytes == 1_250  # grown a quarter beyond the capture
    buffer.release()
    del lent
    larger = buffer.lease(1_800)  # 2,250 would pass the limit: plain memory
    assert not buffer.pinned
    assert buffer.holds(larger)
    assert not buffer.holds(np.zeros(10, dtype=np.uint8))
    buffer.release()
    gc.collect()
    assert memory.held_bytes == 0  # the first buffer went when the larger one came
    assert int(larger.nbytes) == 1_800


@pytest.mark.model
def test_detach_keeps_a_plain_buffer_with_its_llama(tiny_llama: Any, store: SnapshotStore) -> None:
    """On a CPU build the buffer a restore is assembled in stays with the Llama across attach and
    detach: a new one would fault its pages in again on every restore."""
    attach(tiny_llama, store)
    tiny_llama.create_completion("You are a careful assistant. " * 8, max_tokens=2, temperature=0)
    buffer = capture_buffer(tiny_llama)
    assert buffer.nbytes > 0
    assert detach(tiny_llama)
    assert capture_buffer(tiny_llama) is buffer


def test_copies_run_on_the_threads_wider_allows() -> None:
    seen: set[str] = set()

    def record(_item: int) -> None:
        import threading
        import time

        seen.add(threading.current_thread().name)
        time.sleep(0.01)

    with threads.wider(threads.HOST_COPY_THREADS):
        threads.map_in_parallel(record, range(64))
    assert len(seen) == min(threads.HOST_COPY_THREADS, 64)
    source = np.arange(20 << 20, dtype=np.uint8)
    out = np.empty_like(source)
    with threads.wider(4):
        threads.copy_in_parallel(out, source)
    assert np.array_equal(out, source)
    with pytest.raises(ValueError, match="cannot copy"):
        threads.copy_in_parallel(out[:10], source)


@pytest.fixture
def host_memory_for_every_llama(monkeypatch: pytest.MonkeyPatch) -> PinnedMemory:
    """Every Llama's states pass through ggml-allocated host memory, as on a GPU."""
    memory = plain_host_memory()
    monkeypatch.setattr(capture_buffer_module, "pinned_memory_for", lambda _llm: memory)
    monkeypatch.setattr(context_module, "pinned_memory_for", lambda _llm: memory)
    return memory


@pytest.mark.model
def test_restores_through_host_memory_answer_as_cold_runs(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore, host_memory_for_every_llama: PinnedMemory
) -> None:
    prompt = "You are a careful assistant. Answer in one short line.\n" * 12 + "Question: why?\nAnswer:"
    cold = make_llama(tiny_model_path, n_ctx=N_CTX).create_completion(prompt, max_tokens=16, temperature=0)
    first = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store)
    assert first.create_completion(prompt, max_tokens=16, temperature=0)["choices"] == cold["choices"]
    assert capture_buffer(first.llm).pinned  # the capture went through it
    second = make_llama(tiny_model_path, n_ctx=N_CTX)
    hook = attach(second, store)
    restored = second.create_completion(prompt, max_tokens=16, temperature=0)
    assert hook.last_restore is not None
    assert hook.last_restore.restored_tokens >= 64
    assert restored["choices"] == cold["choices"]
    assert capture_buffer(second).pinned  # the restore was assembled in it
    held = host_memory_for_every_llama.held_bytes
    assert held > capture_buffer(first.llm).nbytes
    assert detach(second)
    gc.collect()
    assert host_memory_for_every_llama.held_bytes == capture_buffer(first.llm).nbytes  # let go with the cache


@pytest.mark.model
@pytest.mark.parametrize("n_seq", [1, 2])
def test_batched_restores_through_host_memory_answer_as_cold_runs(
    make_llama: Any,
    tiny_model_path: Path,
    store: SnapshotStore,
    host_memory_for_every_llama: PinnedMemory,
    n_seq: int,
) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    first, second = prompts(llm, 2, SYSTEM)
    for prompt in (first, second):
        scheduler = Scheduler(llm, store, n_seq=n_seq, mode="exact")  # nothing live: from the store
        try:
            request = scheduler.submit(prompt, GREEDY)
            assert request.result(60) == solo(llm, prompt)
            if prompt is second:  # a restore, and (several streams) every capture, goes through it
                assert host_memory_for_every_llama.held_bytes > 0
        finally:
            scheduler.close()
    assert request.restore is not None
    assert request.restore.restored_tokens >= 64
    gc.collect()
    assert host_memory_for_every_llama.held_bytes == 0  # let go with the scheduler


def test_a_bad_limit_setting_is_named_and_the_default_kept(
    tiny_llama: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(host_memory.PINNED_MEMORY_ENV, "lots")
    monkeypatch.setattr(host_memory, "offloads_kv", lambda _llm: True)
    monkeypatch.setattr(host_memory, "device_host_buffer_type", cpu_buffer_type)
    monkeypatch.setattr(host_memory, "_pinned_looked", False)
    monkeypatch.setattr(host_memory, "_pinned", None)
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        memory = host_memory.pinned_memory_for(tiny_llama)
    assert memory is not None
    assert memory.limit == host_memory._default_limit()
    assert "SNAPCACHE_PINNED_MEMORY ignored" in caplog.text
