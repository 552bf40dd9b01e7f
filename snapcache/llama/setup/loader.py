"""Open a GGUF model as a quiet `llama_cpp.Llama` with the right chat template, or fail in one line.

`load_llama` checks the file before llama.cpp parses it, uses every core the process may run on,
gives a Gemma 3 model without a chat template Gemma 3's own (see `chat_templates`), and keeps the
weights away from llama.cpp's AMX kernels where they would crash (see `amx`).

llama.cpp logs through a process-wide callback. llama-cpp-python installs one that prints to stderr,
and with `verbose=False` it still prints llama.cpp's warnings (it maps ggml's log levels one step
off). `load_llama` leaves that callback alone; an application that wants llama.cpp's lines in
Python's logging instead calls `route_llama_cpp_log()` once.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import llama_cpp

from snapcache.errors import InvalidArgument, ModelError
from snapcache.llama.setup.amx import amx_condition, loading_without_extra_buffers
from snapcache.llama.templates.chat_templates import fallback_chat_handler

__all__ = [
    "DEFAULT_N_CTX",
    "DEFAULT_SWA_CACHE",
    "FLASH_ATTN_MODES",
    "KV_CACHE_TYPES",
    "LLAMA_CPP_LOGGER",
    "SWA_CACHES",
    "check_gguf_file",
    "load_llama",
    "route_llama_cpp_log",
    "usable_cores",
]

DEFAULT_N_CTX = 4096
LLAMA_CPP_LOGGER = "snapcache.llama_cpp"
_GGUF_MAGIC = b"GGUF"
# `kv_cache` names: the K/V cache's type, and whether flash attention is on (llama.cpp needs it for a
# quantized V cache). Each keeps a restored state exact (`support`): flash attention over an F16
# cache does not, which is why F16 goes without it.
KV_CACHE_TYPES: dict[str, tuple[int, bool]] = {
    "f16": (llama_cpp.GGML_TYPE_F16, False),
    "q8_0": (llama_cpp.GGML_TYPE_Q8_0, True),
    "q4_0": (llama_cpp.GGML_TYPE_Q4_0, True),
}
_KV_CACHE_KEYWORDS = ("type_k", "type_v", "flash_attn")
# `swa_cache` names: the size of a sliding-window model's window cache (llama.cpp's `swa_full`).
# "window" (the default, as llama.cpp's tools and llama-server size it) keeps the window's cells only:
# long prompts read faster (1.5-1.7x at 8K tokens on Gemma 3), the cache takes a fraction of the
# memory, and a state restores where a read stopped and stored it (its window laid out as the ring a
# cold read leaves: `_state_layout.ring_window`). "full" (llama-cpp-python's own
# default) keeps a cell for every position, so a stored state restores any prefix its blocks cover
# (its window assembled padded).
SWA_CACHES: dict[str, bool] = {"full": True, "window": False}
# `flash_attn` names. "auto" follows llama.cpp's own default (on) where exactness does not forbid it:
# on over a quantized V cache (llama.cpp needs it there) and where layers run on a GPU (whose build
# restores inexactly anyway); off over an F16/F32 cache on the CPU, whose restores it would make
# inexact (`support`). "on" and "off" as said: "on" over an F16 cache on the CPU restores inexactly
# under `exact="auto"` and caches nothing under `exact=True`.
FLASH_ATTN_MODES = ("auto", "on", "off")
DEFAULT_SWA_CACHE = "window"
_log = logging.getLogger("snapcache")

# ggml's `enum ggml_log_level`; CONT continues the previous line at its level.
_GGML_LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_GGML_LOG_CONT = 5


def usable_cores() -> int:
    """The number of CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def check_gguf_file(model_path: str | os.PathLike[str]) -> Path:
    """The path of a readable file that starts with the GGUF magic; `ModelError` otherwise."""
    path = Path(model_path)
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ModelError(f"cannot read model file {path}: {exc.strerror or exc}") from None
    if not magic:
        raise ModelError(f"model file is empty: {path}")
    if magic != _GGUF_MAGIC:
        raise ModelError(f"not a GGUF model file: {path}")
    return path


def default_gpu_layers() -> int:
    """The layers a command puts on the GPU unless told: all (-1) on a build of llama.cpp with a GPU
    backend, as llama-server does, else none."""
    return -1 if llama_cpp.llama_supports_gpu_offload() else 0


def load_llama(
    model_path: str | os.PathLike[str],
    *,
    n_ctx: int = DEFAULT_N_CTX,
    n_threads: int | None = None,
    verbose: bool = False,
    use_extra_bufts: bool | None = None,
    kv_cache: str | None = None,
    swa_cache: str | None = None,
    flash_attention: str | None = None,
    **kwargs: Any,
) -> llama_cpp.Llama:
    """A `llama_cpp.Llama` of `model_path`, ready for chat; `ModelError` if it cannot be opened.

    `n_threads` (and `n_threads_batch`, unless given) default to the usable cores. Other keyword
    arguments go to `Llama` as they are. A model whose GGUF has no chat template gets the template of
    its family where snapcache knows one (Gemma 3), unless `chat_format` or `chat_handler` is given;
    a model with a template keeps llama-cpp-python's handling of it. `use_extra_bufts` is llama.cpp's
    model parameter (repacked and AMX weight buffers); by default it is on unless this llama.cpp has
    AMX kernels that this CPU would run, which crash (`snapcache.llama.setup.amx`). `kv_cache` (one of
    `KV_CACHE_TYPES`; None: llama-cpp-python's F16 cache without flash attention) sets the K/V cache
    type and flash attention together, to a pair whose restored states stay exact: "q8_0" and
    "q4_0" halve and quarter the cache's memory and use flash attention, which reads prompts slower
    on the CPU; "q8_0" generates faster there (docs: choosing settings). `swa_cache` (one of
    `SWA_CACHES`; None: `DEFAULT_SWA_CACHE`, "window", unless `swa_full` is given) sizes a
    sliding-window model's window cache; it is part of the fingerprint, as `kv_cache` is: states are
    found only under the one they were saved with. `flash_attention` (one of `FLASH_ATTN_MODES`;
    None: as `kv_cache` or the Llama's own `flash_attn` keyword leave it) turns flash attention on or
    off; "auto" leaves it off only over an F16/F32 cache on the CPU.
    """
    if not _is_int(n_ctx) or n_ctx < 0:
        raise InvalidArgument(f"n_ctx must be a non-negative int (0: the model's own), got {n_ctx!r}")
    if n_threads is not None and (not _is_int(n_threads) or n_threads < 1):
        raise InvalidArgument(f"n_threads must be a positive int, got {n_threads!r}")
    kwargs.update(_kv_cache_settings(kv_cache, kwargs))
    kwargs.update(_flash_attn_settings(flash_attention, kv_cache, kwargs))
    kwargs.update(_swa_cache_settings(swa_cache, kwargs))
    path = check_gguf_file(model_path)
    threads = n_threads or usable_cores()
    kwargs.setdefault("n_threads_batch", threads)
    chosen_format = kwargs.get("chat_format") is not None or kwargs.get("chat_handler") is not None
    if use_extra_bufts is None:
        use_extra_bufts = not amx_condition().crashes
        if not use_extra_bufts:
            _log.warning(
                "loading %s without llama.cpp's extra buffer types: its AMX kernels crash on this CPU "
                "(slower prompt reads; `snapcache doctor` shows the rebuild that fixes it)",
                path,
            )
    try:
        with nullcontext() if use_extra_bufts else loading_without_extra_buffers():
            llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=n_ctx, n_threads=threads, verbose=verbose, **kwargs
            )
    except (ValueError, RuntimeError) as exc:
        raise ModelError(_load_failure(path, exc)) from None
    if not chosen_format:
        handler = fallback_chat_handler(llm)
        if handler is not None:
            llm.chat_handler = handler
    return llm


def _kv_cache_settings(kv_cache: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The `Llama` keywords `kv_cache` stands for; InvalidArgument for an unknown name, or one given
    beside the keywords it sets."""
    if kv_cache is None:
        return {}
    if kv_cache not in KV_CACHE_TYPES:
        raise InvalidArgument(f"kv_cache must be one of {', '.join(KV_CACHE_TYPES)}, got {kv_cache!r}")
    given = [name for name in _KV_CACHE_KEYWORDS if name in kwargs]
    if given:
        raise InvalidArgument(f"kv_cache sets {', '.join(given)}: pass one or the other")
    cache_type, flash_attn = KV_CACHE_TYPES[kv_cache]
    return {"type_k": cache_type, "type_v": cache_type, "flash_attn": flash_attn}


def _flash_attn_settings(mode: str | None, kv_cache: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Llama's `flash_attn` keyword for a `flash_attention` `mode` (see `FLASH_ATTN_MODES`);
    InvalidArgument for an unknown mode, one given beside `flash_attn=`, or "off" over a quantized V
    cache."""
    if mode is None:
        return {}
    if mode not in FLASH_ATTN_MODES:
        raise InvalidArgument(f"flash_attention must be one of {', '.join(FLASH_ATTN_MODES)}, got {mode!r}")
    if kv_cache is None and "flash_attn" in kwargs:
        raise InvalidArgument("flash_attention sets flash_attn: pass one or the other")
    type_v = int(kwargs.get("type_v", llama_cpp.GGML_TYPE_F16))
    quantized = type_v not in (llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F32)
    if mode == "off" and quantized:
        raise InvalidArgument("a quantized V cache needs flash attention: turn it off with an f16 cache only")
    if mode != "auto":
        return {"flash_attn": mode == "on"}
    on_gpu = bool(llama_cpp.llama_supports_gpu_offload()) and int(kwargs.get("n_gpu_layers", 0)) != 0
    return {"flash_attn": quantized or on_gpu}


def _swa_cache_settings(swa_cache: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The `Llama` keyword `swa_cache` stands for; InvalidArgument for an unknown name, or one given
    beside `swa_full`. None: `DEFAULT_SWA_CACHE`, unless `swa_full` is given (then as given)."""
    if swa_cache is None:
        return {} if "swa_full" in kwargs else {"swa_full": SWA_CACHES[DEFAULT_SWA_CACHE]}
    if swa_cache not in SWA_CACHES:
        raise InvalidArgument(f"swa_cache must be one of {', '.join(SWA_CACHES)}, got {swa_cache!r}")
    if "swa_full" in kwargs:
        raise InvalidArgument("swa_cache sets swa_full: pass one or the other")
    return {"swa_full": SWA_CACHES[swa_cache]}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _load_failure(path: Path, exc: Exception) -> str:
    """One line for a failed `Llama(...)`: the model itself, or the context built on it."""
    if str(exc).startswith("Failed to load model"):
        return f"llama.cpp could not load {path}: truncated, corrupt or an unsupported architecture"
    return f"llama.cpp could not open {path}: {exc}"


class _LogRoute:
    """Where llama.cpp's log lines go once `route_llama_cpp_log` has been called."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logger = logging.getLogger(LLAMA_CPP_LOGGER)
        self.level: int | None = None
        self.last_level = logging.DEBUG
        self.callback: Any = None  # keeps the ctypes callback alive while llama.cpp holds its address

    def emit(self, ggml_level: int, text: bytes) -> None:
        if ggml_level == _GGML_LOG_CONT:
            level = self.last_level
        else:
            level = _GGML_LEVELS.get(ggml_level, logging.INFO)
            self.last_level = level
        line = text.decode("utf-8", "replace").rstrip("\n")
        if line:
            self.logger.log(self.level if self.level is not None else level, "%s", line)


_route = _LogRoute()


def route_llama_cpp_log(logger: logging.Logger | None = None, *, level: int | None = None) -> None:
    """Send llama.cpp's log lines to `logger` (default: `snapcache.llama_cpp`) instead of stderr.

    Process-wide and opt-in: snapcache never calls it by itself. Each line keeps llama.cpp's level
    unless `level` is given. Calling it again changes the target.
    """
    with _route.lock:
        _route.logger = logger if logger is not None else logging.getLogger(LLAMA_CPP_LOGGER)
        _route.level = level
        if _route.callback is not None:
            return

        @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
        def forward(ggml_level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
            _route.emit(ggml_level, text)

        llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))
        _route.callback = forward
        _route_mtmd_log(forward)


def _route_mtmd_log(forward: Any) -> None:
    """mtmd (images, `snapcache.llama.media`) logs through a callback of its own: the same one."""
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError):  # a build without libmtmd
        return
    mtmd_cpp.mtmd_log_set(forward, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(forward, ctypes.c_void_p(0))
