"""What this llama-cpp-python and the llama.cpp it carries are: versions, system info, backends."""

from __future__ import annotations

from functools import cache
from typing import Any

import llama_cpp

from snapcache.llama.state import ggml_devices

__all__ = ["backends", "llama_cpp_build", "llama_system_info"]


@cache
def llama_system_info() -> str:
    """llama.cpp's system info line: its backends and the compiled CPU features."""
    info = llama_cpp.llama_print_system_info()
    return info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)


def llama_cpp_build() -> dict[str, Any]:
    """llama-cpp-python's version, llama.cpp's system info and backends (as ggml registered them,
    each whether or not it found a device), whether it offloads to a GPU, maps files, how many
    devices it takes, and the versions of its state formats."""
    system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    return {
        "version": llama_cpp.__version__,
        "system_info": system_info,
        "backends": [backend.name for backend in ggml_devices.backends()] or backends(system_info),
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
        "mmap": bool(llama_cpp.llama_supports_mmap()),
        "max_devices": int(llama_cpp.llama_max_devices()),
        "state_seq_version": int(llama_cpp.LLAMA_STATE_SEQ_VERSION),
        "session_version": int(llama_cpp.LLAMA_SESSION_VERSION),
    }


def backends(system_info: str) -> list[str]:
    """Backend names from llama.cpp's system info: `CPU : SSE3 = 1 | ... | CUDA : ARCHS = 890 | ...`."""
    names = []
    for part in system_info.split("|"):
        name, colon, _ = part.partition(" : ")
        if colon and name.strip():
            names.append(name.strip())
    return names
