"""llama.cpp's AMX kernels crash: find a build that has them on a CPU that runs them, and load around it.

A llama.cpp compiled with `-march=native` on an Intel CPU with AMX (Sapphire Rapids and later)
holds its AMX kernels, and `ggml_backend_amx_mul_mat` segfaults on the first decode of a Q4_K model
(llama.cpp issue #20824). Its weights reach those kernels only through the AMX buffer type, one of
llama.cpp's "extra" buffer types, so a model loaded with `use_extra_bufts = false` runs: it also
loses the repacked CPU kernels, a cost `benchmarks/bench_extra_buffers.py` measures. snapcache's
own loader (`load_llama`, and through it every CLI command and `snapcache serve`) does that where
the condition holds; a `Llama` someone else loaded gets a logged warning once. The lasting fix is a
build without AMX: `rebuild_command()`, which the Makefile does by itself (`build_flags.py`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_bindings

from snapcache.llama.setup.build_flags import AMX_FLAGS, instruction_set_options, read_cpu_flags
from snapcache.llama.setup.build_info import llama_system_info

__all__ = [
    "AmxCondition",
    "amx_condition",
    "loading_without_extra_buffers",
    "pip_rebuild_command",
    "rebuild_command",
    "warn_once",
]

_log = logging.getLogger("snapcache")
# llama.cpp's system info lists the CPU backend's compiled features: `CPU : SSE3 = 1 | ... | AMX_INT8 = 1 |`.
_AMX_COMPILED = re.compile(r"\bAMX_INT8\s*=\s*1\b")


@dataclass(frozen=True, slots=True)
class AmxCondition:
    """Whether llama.cpp's AMX kernels are compiled in, and whether this CPU would run them."""

    compiled: bool
    cpu_has_amx: bool

    @property
    def crashes(self) -> bool:
        """Models loaded with llama.cpp's extra buffer types would reach the crashing AMX kernels."""
        return self.compiled and self.cpu_has_amx


def amx_condition(system_info: str | None = None, cpu_flags: frozenset[str] | None = None) -> AmxCondition:
    """The condition from llama.cpp's system info and the CPU's flags (this process's, by default).

    Where the CPU's flags cannot be read (not Linux), a build with AMX compiled in is taken to run it.
    """
    info = llama_system_info() if system_info is None else system_info
    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    cpu_has_amx = bool(flags & AMX_FLAGS) if flags else True
    return AmxCondition(compiled=bool(_AMX_COMPILED.search(info)), cpu_has_amx=cpu_has_amx)


def rebuild_command(cpu_flags: frozenset[str] | None = None) -> str:
    """The pip command that rebuilds this llama-cpp-python without AMX, keeping the CPU's other kernels."""
    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    # The AMX options are left unnamed: with GGML_NATIVE off they default to off.
    return pip_rebuild_command(instruction_set_options(flags))


def pip_rebuild_command(cmake_options: list[str]) -> str:
    """The pip command that rebuilds the installed llama-cpp-python with `cmake_options` (pip's wheel
    cache ignores CMAKE_ARGS, hence --no-cache-dir)."""
    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        version = llama_cpp.__version__
    return (
        f'CMAKE_ARGS="{" ".join(cmake_options)}" pip install --force-reinstall --no-deps --no-cache-dir '
        f"llama-cpp-python=={version}"
    )


_defaults_lock = threading.Lock()


@contextmanager
def loading_without_extra_buffers() -> Iterator[None]:
    """While inside, a `llama_cpp.Llama` being built loads its weights without extra buffer types.

    `Llama.__init__` takes llama.cpp's default model parameters and sets only the fields it has
    arguments for; `use_extra_bufts` is not one of them, so the defaults it asks for are changed
    here. Process-wide while held (a lock keeps two loads from interleaving their changes).
    """
    with _defaults_lock:
        original: Callable[[], Any] = llama_cpp_bindings.llama_model_default_params

        def defaults_without_extra_buffers() -> Any:
            params = original()
            params.use_extra_bufts = False
            return params

        llama_cpp_bindings.llama_model_default_params = defaults_without_extra_buffers
        try:
            yield
        finally:
            llama_cpp_bindings.llama_model_default_params = original


_warned = threading.Event()


def warn_once(llm: llama_cpp.Llama) -> bool:
    """Log once per process that `llm` may crash in llama.cpp's AMX kernels; True if this call logged."""
    if _warned.is_set() or not bool(getattr(llm.model_params, "use_extra_bufts", False)):
        return False
    if not amx_condition().crashes:
        return False
    _warned.set()
    _log.warning(
        "this llama.cpp has AMX kernels and this CPU runs them: decoding a Q4_K model may crash "
        "(llama.cpp #20824). Load the model with snapcache.load_llama (which leaves them out), or %s",
        rebuild_command(),
    )
    return True
