"""The face for tools that run snapcache rather than cache with it: the `snapcache` command, and
scripts that check a machine or a cache directory.

Beside the library's API (`snapcache`), it names what those tools need from inside: the store's
reports on a directory and a remote tier, block keys, the settings a model is loaded with, the demo
model, how exactness is chosen, bundle reports, llama.cpp's build and the checks of it, ggml's
backends and devices, and the pinned memory of a GPU. Each name is imported on first use, so that a
command that never loads a model never imports llama_cpp. The import contracts in pyproject.toml
keep the command line on this face and `snapcache`'s.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snapcache.key import BLOCK_TOKENS, block_keys
    from snapcache.llama.exactness.choice import choose_exactness
    from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
    from snapcache.llama.setup.amx import amx_condition
    from snapcache.llama.setup.amx import rebuild_command as amx_rebuild_command
    from snapcache.llama.setup.build_flags import read_cpu_flags
    from snapcache.llama.setup.build_info import llama_cpp_build
    from snapcache.llama.setup.cxx_runtime import LibraryLinkage, installed_libraries
    from snapcache.llama.setup.cxx_runtime import rebuild_command as cxx_runtime_rebuild_command
    from snapcache.llama.setup.demo_model import DEMO_MODEL_NAME, DEMO_PACKAGE, default_model_path
    from snapcache.llama.setup.loader import (
        DEFAULT_SWA_CACHE,
        FLASH_ATTN_MODES,
        KV_CACHE_TYPES,
        SWA_CACHES,
        check_gguf_file,
        default_gpu_layers,
        route_llama_cpp_log,
    )
    from snapcache.llama.state.ggml_devices import Backend as GgmlBackend
    from snapcache.llama.state.ggml_devices import Device as GgmlDevice
    from snapcache.llama.state.ggml_devices import backends as ggml_backends
    from snapcache.llama.state.ggml_devices import kv_cache_place
    from snapcache.llama.state.host_memory import (
        PINNED_MEMORY_ENV,
        checked_pinned_limit,
        device_host_buffer_type,
        pinned_limit,
    )
    from snapcache.llama.stored.bundle import ExportReport, ImportReport
    from snapcache.store import DirectoryReport, RemoteStats

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_SWA_CACHE",
    "DEMO_MODEL_NAME",
    "DEMO_PACKAGE",
    "FLASH_ATTN_MODES",
    "KV_CACHE_TYPES",
    "PINNED_MEMORY_ENV",
    "SWA_CACHES",
    "DirectoryReport",
    "ExportReport",
    "FingerprintNotes",
    "GgmlBackend",
    "GgmlDevice",
    "ImportReport",
    "LibraryLinkage",
    "RemoteStats",
    "amx_condition",
    "amx_rebuild_command",
    "block_keys",
    "check_gguf_file",
    "checked_pinned_limit",
    "choose_exactness",
    "cxx_runtime_rebuild_command",
    "default_gpu_layers",
    "default_model_path",
    "device_host_buffer_type",
    "ggml_backends",
    "installed_libraries",
    "kv_cache_place",
    "llama_cpp_build",
    "pinned_limit",
    "read_cpu_flags",
    "route_llama_cpp_log",
]

# name -> (module, attribute there)
_LAZY: dict[str, tuple[str, str]] = {
    "DirectoryReport": ("snapcache.store", "DirectoryReport"),
    "RemoteStats": ("snapcache.store", "RemoteStats"),
    "BLOCK_TOKENS": ("snapcache.key", "BLOCK_TOKENS"),
    "block_keys": ("snapcache.key", "block_keys"),
    "check_gguf_file": ("snapcache.llama.setup.loader", "check_gguf_file"),
    "route_llama_cpp_log": ("snapcache.llama.setup.loader", "route_llama_cpp_log"),
    "default_gpu_layers": ("snapcache.llama.setup.loader", "default_gpu_layers"),
    "DEFAULT_SWA_CACHE": ("snapcache.llama.setup.loader", "DEFAULT_SWA_CACHE"),
    "SWA_CACHES": ("snapcache.llama.setup.loader", "SWA_CACHES"),
    "KV_CACHE_TYPES": ("snapcache.llama.setup.loader", "KV_CACHE_TYPES"),
    "FLASH_ATTN_MODES": ("snapcache.llama.setup.loader", "FLASH_ATTN_MODES"),
    "default_model_path": ("snapcache.llama.setup.demo_model", "default_model_path"),
    "DEMO_MODEL_NAME": ("snapcache.llama.setup.demo_model", "DEMO_MODEL_NAME"),
    "DEMO_PACKAGE": ("snapcache.llama.setup.demo_model", "DEMO_PACKAGE"),
    "choose_exactness": ("snapcache.llama.exactness.choice", "choose_exactness"),
    "FingerprintNotes": ("snapcache.llama.exactness.fingerprint_notes", "FingerprintNotes"),
    "ExportReport": ("snapcache.llama.stored.bundle", "ExportReport"),
    "ImportReport": ("snapcache.llama.stored.bundle", "ImportReport"),
    "llama_cpp_build": ("snapcache.llama.setup.build_info", "llama_cpp_build"),
    "read_cpu_flags": ("snapcache.llama.setup.build_flags", "read_cpu_flags"),
    "amx_condition": ("snapcache.llama.setup.amx", "amx_condition"),
    "amx_rebuild_command": ("snapcache.llama.setup.amx", "rebuild_command"),
    "LibraryLinkage": ("snapcache.llama.setup.cxx_runtime", "LibraryLinkage"),
    "installed_libraries": ("snapcache.llama.setup.cxx_runtime", "installed_libraries"),
    "cxx_runtime_rebuild_command": ("snapcache.llama.setup.cxx_runtime", "rebuild_command"),
    "PINNED_MEMORY_ENV": ("snapcache.llama.state.host_memory", "PINNED_MEMORY_ENV"),
    "device_host_buffer_type": ("snapcache.llama.state.host_memory", "device_host_buffer_type"),
    "pinned_limit": ("snapcache.llama.state.host_memory", "pinned_limit"),
    "checked_pinned_limit": ("snapcache.llama.state.host_memory", "checked_pinned_limit"),
    "GgmlBackend": ("snapcache.llama.state.ggml_devices", "Backend"),
    "GgmlDevice": ("snapcache.llama.state.ggml_devices", "Device"),
    "ggml_backends": ("snapcache.llama.state.ggml_devices", "backends"),
    "kv_cache_place": ("snapcache.llama.state.ggml_devices", "kv_cache_place"),
}


def __getattr__(name: str) -> Any:
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module 'snapcache.admin' has no attribute {name!r}")
    module, attribute = found
    return getattr(import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted(__all__)
