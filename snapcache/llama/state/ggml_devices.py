"""ggml's backends and devices as the `llama_cpp` package's own libraries see them, through ggml's
backend API (`ggml-backend.h`) at run time: which backends this build carries (CPU, CUDA, Vulkan,
Metal...), the devices each found, and a device's pinned host buffer type.

llama-cpp-python binds none of these calls, so they are declared here with ctypes on the very
libraries libllama loaded (`ctypes.CDLL` of a loaded library gives the same copy). A build whose
libraries lie elsewhere, or an older ggml without the device API, has none of this: `ggml_api()` is
None and a caller treats the build as having no device.

A backend can be built in and find no device: a Vulkan build on a machine without a Vulkan driver,
or one whose only device is a CPU-type one (Mesa's lavapipe), which ggml skips unless
`GGML_VK_VISIBLE_DEVICES` names it. llama.cpp then runs every layer on the CPU.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import llama_cpp

__all__ = [
    "Backend",
    "Device",
    "DeviceKind",
    "GgmlApi",
    "backends",
    "devices",
    "ggml_api",
    "gpu_devices",
    "kv_cache_place",
]

_log = logging.getLogger("snapcache")

DeviceKind = Literal["cpu", "gpu", "igpu", "accel"]
# ggml_backend_dev_type's values, in order.
_KINDS: tuple[DeviceKind, ...] = ("cpu", "gpu", "igpu", "accel")


class GgmlApi:
    """The few functions of ggml's backend API snapcache calls, from the libraries llama_cpp loaded."""

    def __init__(self, base: ctypes.CDLL, ggml: ctypes.CDLL) -> None:
        pointer, size, text = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        self.reg_count = _function(ggml, "ggml_backend_reg_count", size, [])
        self.reg_get = _function(ggml, "ggml_backend_reg_get", pointer, [size])
        self.reg_name = _function(base, "ggml_backend_reg_name", text, [pointer])
        self.reg_dev_count = _function(base, "ggml_backend_reg_dev_count", size, [pointer])
        self.reg_dev_get = _function(base, "ggml_backend_reg_dev_get", pointer, [pointer, size])
        self.dev_count = _function(ggml, "ggml_backend_dev_count", size, [])
        self.dev_get = _function(ggml, "ggml_backend_dev_get", pointer, [size])
        self.dev_name = _function(base, "ggml_backend_dev_name", text, [pointer])
        self.dev_description = _function(base, "ggml_backend_dev_description", text, [pointer])
        self.dev_type = _function(base, "ggml_backend_dev_type", ctypes.c_int, [pointer])
        self.dev_memory = _function(
            base, "ggml_backend_dev_memory", None, [pointer, ctypes.POINTER(size), ctypes.POINTER(size)]
        )
        self.dev_host_buffer_type = _function(base, "ggml_backend_dev_host_buffer_type", pointer, [pointer])
        self.buft_name = _function(base, "ggml_backend_buft_name", text, [pointer])
        self.buft_alloc_buffer = _function(base, "ggml_backend_buft_alloc_buffer", pointer, [pointer, size])
        self.buffer_get_base = _function(base, "ggml_backend_buffer_get_base", pointer, [pointer])
        self.buffer_free = _function(base, "ggml_backend_buffer_free", None, [pointer])
        self.cpu_buffer_type = _function(base, "ggml_backend_cpu_buffer_type", pointer, [])


def _function(library: ctypes.CDLL, name: str, restype: Any, argtypes: list[Any]) -> Any:
    function = getattr(library, name)
    function.restype = restype
    function.argtypes = argtypes
    return function


@functools.cache
def ggml_api() -> GgmlApi | None:
    """ggml's backend API from the `llama_cpp` package's own libraries, or None where they cannot be
    found (a build laid out otherwise) or lack the device API (an older ggml)."""
    folder = Path(llama_cpp.__file__).parent / "lib"
    found: dict[str, ctypes.CDLL] = {}
    for name in ("ggml-base", "ggml"):
        try:
            found[name] = ctypes.CDLL(str(folder / _library_file(name)))
        except OSError:
            continue
    if len(found) < 2:
        _log.debug("ggml's libraries were not found in %s: no device is known", folder)
        return None
    try:
        return GgmlApi(found["ggml-base"], found["ggml"])
    except AttributeError as exc:
        _log.debug("ggml lacks its device API (%s): no device is known", exc)
        return None


def _library_file(name: str) -> str:
    if sys.platform == "win32":
        return f"{name}.dll"
    if sys.platform == "darwin":
        return f"lib{name}.dylib"
    return f"lib{name}.so"


def text(raw: bytes | None) -> str:
    """A C string from ggml as text ("" for NULL)."""
    return "" if raw is None else raw.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Device:
    """One device ggml found: its name ("Vulkan0", "CUDA0", "CPU"), what it is ("NVIDIA H200",
    "llvmpipe (LLVM 15.0.6, 256 bits)"), its kind, its memory, and its pinned host buffer type
    ("CUDA_Host", "Vulkan_Host"; "" where it has none) with that type's handle (0: none), which
    `host_memory` allocates from."""

    name: str
    description: str
    kind: DeviceKind
    memory_free: int
    memory_total: int
    host_buffer_type: str
    host_buffer_handle: int = field(default=0, compare=False, repr=False)

    @property
    def is_gpu(self) -> bool:
        """A discrete or integrated GPU: where llama.cpp offloads layers and their K/V cache."""
        return self.kind in ("gpu", "igpu")

    def describe(self) -> str:
        """One line: "Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits), 23.5 GiB"."""
        memory = f", {self.memory_total / (1 << 30):.1f} GiB" if self.memory_total else ""
        return f"{self.name}: {self.description or self.kind}{memory}"


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend built into this llama.cpp ("CPU", "Vulkan", "CUDA") and the devices it found."""

    name: str
    devices: tuple[Device, ...]


def _device(api: GgmlApi, handle: int) -> Device:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    api.dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    kind_value = int(api.dev_type(handle))
    buffer_type = api.dev_host_buffer_type(handle)
    return Device(
        name=text(api.dev_name(handle)),
        description=text(api.dev_description(handle)),
        kind=_KINDS[kind_value] if 0 <= kind_value < len(_KINDS) else "accel",
        memory_free=int(free.value),
        memory_total=int(total.value),
        host_buffer_type=text(api.buft_name(buffer_type)) if buffer_type else "",
        host_buffer_handle=int(buffer_type or 0),
    )


def backends() -> list[Backend]:
    """Every backend this llama.cpp carries, with the devices it found (empty where ggml's API is
    not to be had)."""
    api = ggml_api()
    if api is None:
        return []
    found = []
    for index in range(int(api.reg_count())):
        reg = api.reg_get(index)
        if not reg:
            continue
        count = int(api.reg_dev_count(reg))
        found.append(
            Backend(
                text(api.reg_name(reg)), tuple(_device(api, api.reg_dev_get(reg, i)) for i in range(count))
            )
        )
    return found


def devices() -> list[Device]:
    """Every device ggml found, in its order (llama.cpp offloads to the GPUs among them)."""
    api = ggml_api()
    if api is None:
        return []
    return [_device(api, api.dev_get(index)) for index in range(int(api.dev_count()))]


def gpu_devices() -> list[Device]:
    """The GPUs among `devices()`: where a model's layers and K/V cache go with `n_gpu_layers`."""
    return [device for device in devices() if device.is_gpu]


def kv_cache_place(
    gpu_layers: int, gpus: list[Device], n_layers: int | None = None, offload_kqv: bool = True
) -> str:
    """Where llama.cpp keeps a model's K/V cache with `gpu_layers` (llama.cpp's `n_gpu_layers`: -1
    for all) on these GPUs: each offloaded layer's K/V on its GPU (with `offload_kqv`, the default),
    the others' in host memory. `n_layers`, where known, says how many that is."""
    if not gpus:
        return "host memory (no GPU found: every layer runs on the CPU)"
    if gpu_layers == 0:
        return "host memory (no layer offloaded: --gpu-layers 0)"
    if not offload_kqv:
        return "host memory (offload_kqv off: layers on the GPU read their K/V from the host)"
    where = " and ".join(device.describe() for device in gpus)
    if gpu_layers < 0 or (n_layers is not None and gpu_layers >= n_layers):
        return f"{where} (every layer offloaded)"
    of = f" of {n_layers}" if n_layers is not None else ""
    return f"{where} for the {gpu_layers}{of} layers offloaded, host memory for the rest"
