"""LoRA adapters and control vectors set on a live Llama, recorded so that its fingerprint follows them.

llama.cpp can change a context's adapters at any time but cannot say which ones it holds. These
functions set them through llama.cpp and remember what they set, and `model_fingerprint` reads that
record: a state computed under one adapter is never restored under another. Adapters set by calling
llama.cpp's functions directly are invisible to snapcache; set them here, or build a new Llama.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument, ModelError
from snapcache.llama.exactness.model_files import file_fingerprint

__all__ = ["adapter_settings", "set_control_vector", "set_lora_adapters"]


@dataclass(slots=True)
class _Adapters:
    lora: list[tuple[str, float]] | None = None  # None: as the Llama was built (its lora_path)
    control_vector: tuple[str, int, int] | None = None  # (content digest, first layer, last layer)
    handles: dict[str, Any] = field(default_factory=dict)  # loaded LoRA files, kept alive with the model


_records: weakref.WeakKeyDictionary[llama_cpp.Llama, _Adapters] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def set_lora_adapters(llm: llama_cpp.Llama, adapters: Sequence[tuple[str | os.PathLike[str], float]]) -> None:
    """Make `adapters` ((path, scale) pairs) the Llama's LoRA adapters, replacing any it had.

    An empty sequence removes them all. Raises ModelError when llama.cpp cannot load or set one.
    """
    with _lock:
        record = _records.setdefault(llm, _Adapters())
        entries: list[tuple[str, float]] = []
        pointers = []
        for path, scale in adapters:
            key = os.fspath(path)
            handle = record.handles.get(key)
            if handle is None:
                handle = llama_cpp.llama_adapter_lora_init(llm.model, key.encode("utf-8"))
                if not handle:
                    raise ModelError(f"llama.cpp cannot load the LoRA adapter {key!r}")
                record.handles[key] = handle
            pointers.append(handle)
            entries.append((file_fingerprint(key), float(scale)))
        count = len(pointers)
        array = (llama_cpp.llama_adapter_lora_p_ctypes * max(count, 1))(*pointers)
        scales = (ctypes.c_float * max(count, 1))(*[scale for _, scale in entries])
        if llama_cpp.llama_set_adapters_lora(llm.ctx, array, count, scales) != 0:
            raise ModelError("llama.cpp refused the LoRA adapters")
        record.lora = entries
        # llama-cpp-python reads these when it copies or pickles the Llama; they no longer apply.
        llm.lora_path = None


def set_control_vector(
    llm: llama_cpp.Llama,
    data: npt.ArrayLike | None,
    first_layer: int = 1,
    last_layer: int | None = None,
) -> None:
    """Apply a control vector (one row of n_embd values per layer, from layer 1), or clear it (None).

    Rows apply to layers `first_layer` through `last_layer` (inclusive; default: the last layer).
    """
    n_embd = int(llama_cpp.llama_model_n_embd(llm.model))
    n_layer = int(llama_cpp.llama_model_n_layer(llm.model))
    last = n_layer if last_layer is None else last_layer
    with _lock:
        record = _records.setdefault(llm, _Adapters())
        if data is None:
            if llama_cpp.llama_set_adapter_cvec(llm.ctx, None, 0, n_embd, 0, 0) != 0:
                raise ModelError("llama.cpp could not clear the control vector")
            record.control_vector = None
            return
        values = np.ascontiguousarray(data, dtype=np.float32).reshape(-1)
        if values.size == 0 or values.size % n_embd:
            raise InvalidArgument(f"a control vector holds rows of n_embd={n_embd} values, got {values.size}")
        pointer = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if llama_cpp.llama_set_adapter_cvec(llm.ctx, pointer, values.size, n_embd, first_layer, last) != 0:
            raise ModelError("llama.cpp refused the control vector")
        digest = hashlib.blake2b(values.tobytes(), digest_size=16).hexdigest()
        record.control_vector = (digest, int(first_layer), int(last))


def adapter_settings(llm: llama_cpp.Llama) -> dict[str, Any]:
    """What the fingerprint covers of the Llama's adapters: LoRA files and scales, the control vector."""
    with _lock:
        record = _records.get(llm)
        lora = None if record is None else record.lora
        control_vector = None if record is None else record.control_vector
    if lora is None:
        lora_path = getattr(llm, "lora_path", None)
        lora = [(file_fingerprint(lora_path), float(getattr(llm, "lora_scale", 1.0)))] if lora_path else []
    settings: dict[str, Any] = {}
    if lora:
        settings["lora"] = [list(entry) for entry in lora]
    if control_vector is not None:
        settings["control_vector"] = list(control_vector)
    return settings
