"""Host memory a GPU copies states to and from at the bus's speed: pinned (page-locked) memory from
the backend's own host buffer type, found through ggml's backend API in the `llama_cpp` package's
libraries at run time. On a build with no such device (the CPU backend) there is none, and buffers
stay what numpy gives.

llama.cpp copies a restore's rows to the device with `ggml_backend_tensor_set` straight from the
buffer it is handed, and a capture's rows back with `ggml_backend_tensor_get` straight into it. From
pageable memory the CUDA driver stages every copy through a bounce buffer of its own: an 8B model's
state came back at 5.8-8.4 GB/s on an H100 (2026-11-26), where PCIe Gen5 moves about 50 GB/s one way
from pinned memory. So the one buffer a Llama captures into and assembles restores in
(`capture_buffer`) is pinned where the Llama's K/V cache lives on such a device.

`ggml_backend_cuda_register_host_buffer` (pinning memory numpy already has) is not the way: it does
nothing unless `GGML_CUDA_REGISTER_HOST` is set, and registers memory read-only, which a capture
written by the device cannot use. CUDA's host buffer type allocates with `cudaMallocHost`; a user
who sets `GGML_CUDA_NO_PINNED` gets plain memory from it, as llama.cpp's own buffers do then.

Pinned memory is taken from the system's pageable memory, so it is bounded: at most `pinned_limit()`
bytes in the process (`$SNAPCACHE_PINNED_MEMORY`, in bytes, or with a K/M/G/T suffix; 0 turns
it off), by default a quarter of the machine's memory and never more than half of it. A buffer
asked for beyond that is plain memory, as is one the backend refuses. Each buffer is freed once
nothing refers to it any more (`release_capture_buffer` drops a Llama's, on `detach` and on the
Llama's `close`), never under a view that is still read.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument
from snapcache.llama.state.ggml_devices import GgmlApi, ggml_api, gpu_devices

__all__ = [
    "PINNED_MEMORY_ENV",
    "HostBufferType",
    "PinnedMemory",
    "checked_pinned_limit",
    "device_host_buffer_type",
    "offloads_kv",
    "parse_byte_size",
    "physical_memory",
    "pinned_limit",
    "pinned_memory_for",
    "pinned_report",
]

_log = logging.getLogger("snapcache")

PINNED_MEMORY_ENV = "SNAPCACHE_PINNED_MEMORY"
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_byte_size(text: str) -> int:
    """`text` ("0", "4096", "512M", "8GiB") as bytes; InvalidArgument otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise InvalidArgument(f"a size must be a whole number of bytes, or one with K, M, G or T: {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def pinned_limit() -> int:
    """How many bytes of pinned memory the process may hold: `$SNAPCACHE_PINNED_MEMORY`, or a
    quarter of the machine's memory. InvalidArgument for a setting that is no size."""
    setting = os.environ.get(PINNED_MEMORY_ENV)
    if setting is not None and setting.strip():
        return parse_byte_size(setting)
    return _default_limit()


def _default_limit() -> int:
    """A quarter of the machine's memory."""
    return physical_memory() // 4


def physical_memory() -> int:
    """The machine's memory in bytes (16 GiB where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not on this system: a modest bound
        return 16 << 30


def checked_pinned_limit() -> tuple[int, str | None]:
    """The pinned-memory limit in force and what was wrong with the setting, if anything: a setting
    that is no size keeps the default; one above half the machine's memory is cut to that half
    (pinned pages cannot be swapped out, and a process that pins most of the memory starves the
    rest of the system)."""
    try:
        limit = pinned_limit()
    except InvalidArgument as exc:
        return _default_limit(), f"{PINNED_MEMORY_ENV} ignored: {exc}"
    ceiling = physical_memory() // 2
    if limit > ceiling:
        return ceiling, (
            f"{PINNED_MEMORY_ENV} asks for {limit >> 20:,} MiB, more than half of this machine's "
            f"{physical_memory() >> 20:,} MiB: at most {ceiling >> 20:,} MiB is pinned"
        )
    return limit, None


@dataclass(frozen=True, slots=True)
class HostBufferType:
    """A backend's host buffer type: its handle and the name ggml gives it ("CUDA_Host")."""

    handle: int
    name: str


def device_host_buffer_type() -> HostBufferType | None:
    """The host buffer type of the first GPU ggml knows (pinned memory it copies to and from at the
    bus's speed), or None: no GPU in this build, or one without such a type (the CPU backend)."""
    for device in gpu_devices():
        if device.host_buffer_handle:
            return HostBufferType(device.host_buffer_handle, device.host_buffer_type)
    return None


def cpu_buffer_type() -> HostBufferType | None:
    """ggml's plain CPU buffer type: allocated through the same calls as a pinned one, which the
    tests use on a build with no GPU."""
    ggml = ggml_api()
    if ggml is None:
        return None
    return HostBufferType(int(ggml.cpu_buffer_type()), "CPU")


def offloads_kv(llm: llama_cpp.Llama) -> bool:
    """Whether `llm` keeps some of its K/V cache on a device: layers offloaded and K/V with them."""
    return (
        bool(llama_cpp.llama_supports_gpu_offload())
        and int(llm.model_params.n_gpu_layers) != 0
        and bool(llm.context_params.offload_kqv)
    )


class PinnedMemory:
    """Buffers of one host buffer type, at most `limit` bytes of them alive at once. Thread-safe."""

    def __init__(self, buffer_type: HostBufferType, limit: int) -> None:
        self.buffer_type = buffer_type
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """The bytes of the buffers alive now."""
        with self._lock:
            return self._held

    def allocate(self, size: int) -> npt.NDArray[np.uint8] | None:
        """`size` bytes of this type's memory, freed once the array (and every view of it) is gone;
        None when that would pass the limit or the backend refuses (out of pinned memory)."""
        ggml = ggml_api()
        if ggml is None or size <= 0:
            return None
        with self._lock:
            if self._held + size > self.limit:
                return None
            self._held += size
        handle = ggml.buft_alloc_buffer(self.buffer_type.handle, size)
        base = ggml.buffer_get_base(handle) if handle else None
        if not base:
            if handle:
                ggml.buffer_free(handle)
            self._give_back(size)
            _log.info("%s refused %d MiB: this buffer is plain memory", self.buffer_type.name, size >> 20)
            return None
        # A class of its own per buffer: ctypes arrays take a weak reference only as a subclass.
        memory_type: Any = type("PinnedBytes", (ctypes.c_uint8 * size,), {})
        memory = memory_type.from_address(base)
        finalizer = weakref.finalize(memory, self._free, ggml, handle, size)
        finalizer.atexit = False  # at exit the process's memory goes anyway, the backend perhaps before it
        return np.frombuffer(memory, dtype=np.uint8)  # keeps `memory` alive

    def _free(self, ggml: GgmlApi, handle: int, size: int) -> None:
        ggml.buffer_free(handle)
        self._give_back(size)

    def _give_back(self, size: int) -> None:
        with self._lock:
            self._held -= size


_pinned_lock = threading.Lock()
_pinned: PinnedMemory | None = None
_pinned_looked = False


def pinned_memory_for(llm: llama_cpp.Llama) -> PinnedMemory | None:
    """The process's pinned memory for copies to and from `llm`'s K/V cache, or None: its cache
    is in host memory, the build has no device with a host buffer type, or the limit is 0."""
    if not offloads_kv(llm):
        return None
    global _pinned, _pinned_looked
    with _pinned_lock:
        if not _pinned_looked:
            _pinned_looked = True
            buffer_type = device_host_buffer_type()
            limit, problem = checked_pinned_limit()
            if problem is not None:
                _log.warning("%s", problem)
            if buffer_type is not None and limit > 0:
                _pinned = PinnedMemory(buffer_type, limit)
                _log.info(
                    "states are copied to and from the GPU through %s memory (at most %d MiB)",
                    buffer_type.name,
                    limit >> 20,
                )
        return _pinned


def pinned_report() -> dict[str, object] | None:
    """What the process's pinned memory is (its type, limit and the bytes held now), or None while
    no Llama has used any (a CPU build, or a cache in host memory)."""
    with _pinned_lock:
        pinned = _pinned
    if pinned is None:
        return None
    return {
        "buffer_type": pinned.buffer_type.name,
        "limit_bytes": pinned.limit,
        "held_bytes": pinned.held_bytes,
    }
