"""`snapcache doctor`'s lines on llama.cpp's backend: the backends built in and the devices they found,
where a model's K/V cache lives, and the pinned memory states reach a GPU through."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .report_check import Check

if TYPE_CHECKING:
    from snapcache.admin import GgmlBackend, GgmlDevice

GPU_BUILDS = (
    'CMAKE_ARGS="-DGGML_CUDA=on" (NVIDIA), "-DGGML_VULKAN=on" (AMD, Intel) or "-DGGML_METAL=on" (Apple)'
)
# A CPU-type Vulkan device (Mesa's lavapipe) is skipped unless this names it.
VULKAN_DEVICES_ENV = "GGML_VK_VISIBLE_DEVICES"


def backend_checks(llama: dict[str, Any], gpu_layers: int | None) -> list[Check]:
    """The backend, K/V cache and pinned-memory lines for this llama.cpp build (`llama`:
    `llama_cpp_build()`), with the `--gpu-layers` a command was given (None: the default)."""
    from snapcache.admin import default_gpu_layers, ggml_backends

    found = ggml_backends()
    layers = default_gpu_layers() if gpu_layers is None else gpu_layers
    checks = [backend_check(found), kv_cache_check(found, layers)]
    if _gpus(found):
        checks.append(pinned_memory_check())
    return checks


def _gpus(found: list[GgmlBackend]) -> list[GgmlDevice]:
    """The GPUs the backends found."""
    return [device for backend in found for device in backend.devices if device.is_gpu]


def backend_check(found: list[GgmlBackend]) -> Check:
    """What llama.cpp was built for and the GPUs it found; a warning for a GPU backend built in that
    found none (every layer then runs on the CPU)."""
    accelerated = [backend for backend in found if backend.name != "CPU"]
    if not accelerated:
        if not found:
            return Check("backend", "warn", "ggml's backend API was not found in llama_cpp's libraries")
        return Check("backend", "ok", f"CPU only; for a GPU, rebuild llama-cpp-python with {GPU_BUILDS}")
    gpus = _gpus(accelerated)
    names = ", ".join(backend.name for backend in accelerated)
    if not gpus:
        hint = (
            f"; a CPU-type Vulkan device (Mesa's lavapipe) is used only when {VULKAN_DEVICES_ENV} names it"
            if any(backend.name == "Vulkan" for backend in accelerated)
            else ""
        )
        return Check(
            "backend",
            "warn",
            f"built for {names}, but found no GPU: every layer runs on the CPU (check the driver){hint}",
        )
    return Check("backend", "ok", f"{names}: {'; '.join(device.describe() for device in gpus)}")


def kv_cache_check(found: list[GgmlBackend], gpu_layers: int) -> Check:
    """Where a model loaded by the commands keeps its K/V cache (and so its states come from)."""
    from snapcache.admin import kv_cache_place

    return Check("K/V cache", "ok", f"{kv_cache_place(gpu_layers, _gpus(found))}; --gpu-layers {gpu_layers}")


def pinned_memory_check() -> Check:
    """How states go to and from a GPU: through its pinned host memory, up to the limit."""
    from snapcache.admin import PINNED_MEMORY_ENV, checked_pinned_limit, device_host_buffer_type

    buffer_type = device_host_buffer_type()
    if buffer_type is None:
        return Check("pinned memory", "ok", "none: states are copied from plain host memory")
    limit, problem = checked_pinned_limit()
    if problem is not None:
        return Check("pinned memory", "warn", problem)
    if limit == 0:
        return Check(
            "pinned memory", "ok", f"turned off ({PINNED_MEMORY_ENV}=0): states are copied from plain memory"
        )
    return Check(
        "pinned memory",
        "ok",
        f"states go to and from the GPU through {buffer_type.name} memory, at most {limit >> 20:,} MiB "
        f"({PINNED_MEMORY_ENV})",
    )
