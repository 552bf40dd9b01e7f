"""Fingerprints: which model content, context settings and numerics a llama.cpp state was made with.

A snapshot restores only into a Llama with the same fingerprint. It covers:

- the model file, every shard of a split model: the GGUF header, metadata and tensor table in
  full, plus, by default ("sampled"), every tensor's data whole up to 48 KiB and three 16 KiB pieces
  (its beginning, middle and end) of larger ones. Another fine-tune or quantization, or an edit of
  any small tensor (a norm, a bias), differs; an edit confined to the inside of a large tensor that
  leaves those pieces alone does not. `SNAPCACHE_FINGERPRINT=full` (or `content="full"`) hashes every
  byte instead (once per file: the result is kept by file identity);
- the context settings that change the layout or the values of the cached K and V rows (cache
  types, V transposition, streams, sliding window, RoPE), never those that only change how much fits
  (n_ctx) or how fast it runs (threads, batch sizes);
- `kv_overrides`, and the LoRA adapters and control vector in effect (see
  `snapcache.llama.exactness.adapters`);
- the state format (`LLAMA_STATE_SEQ_VERSION`) and what decides the numerics: the compute backend's
  features (`llama_print_system_info`), the layers offloaded to a GPU, and whether the weights were
  loaded without llama.cpp's extra buffer types (no repacked kernels; see `amx`). The llama-cpp-python
  version is not part of it: an upgrade keeps the cache unless the state format changes.

`model_fingerprint` is cheap after its first call on a file (a stat per shard, a few ctypes reads):
call it before every completion to notice adapters that changed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import llama_cpp

from snapcache.llama.exactness.adapters import adapter_settings
from snapcache.llama.exactness.model_files import (
    CONTENT_ENV,
    FINGERPRINT_HEX_DIGITS,
    Content,
    file_fingerprint,
    shard_paths,
)
from snapcache.llama.setup.build_info import llama_system_info

__all__ = [
    "CONTENT_ENV",
    "Content",
    "file_fingerprint",
    "fingerprint_of",
    "fingerprint_parts",
    "llama_system_info",
    "model_fingerprint",
    "shard_paths",
]


_CONTEXT_PERSON = b"snapcache.ctx2"


def model_fingerprint(llm: llama_cpp.Llama, content: Content | None = None, *, exact: bool = True) -> str:
    """Fingerprint of a loaded Llama: model content, state-relevant settings, adapters and numerics.

    `exact=False` gives the fingerprint of the states an inexact cache saves (see `CacheHook`): they
    are split where a cold read is not, so an exact cache must never restore them.
    """
    return fingerprint_of(fingerprint_parts(llm, content, exact=exact))


def fingerprint_parts(
    llm: llama_cpp.Llama, content: Content | None = None, *, exact: bool = True
) -> dict[str, Any]:
    """What `model_fingerprint` hashes, as JSON-ready values: what a miss explanation compares."""
    parts: dict[str, Any] = {
        "model": file_fingerprint(llm.model_path, content),
        "context": _context_settings(llm),
        "kv_overrides": _kv_overrides(llm),
        "adapters": adapter_settings(llm),
        "numerics": _numerics(llm),
        "state_seq_version": int(getattr(llama_cpp, "LLAMA_STATE_SEQ_VERSION", 0)),
    }
    if not exact:
        parts["restore"] = "inexact"
    return parts


def fingerprint_of(parts: dict[str, Any]) -> str:
    """The fingerprint of `fingerprint_parts`."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(
        text.encode(), digest_size=FINGERPRINT_HEX_DIGITS // 2, person=_CONTEXT_PERSON
    ).hexdigest()


def _context_settings(llm: llama_cpp.Llama) -> dict[str, Any]:
    params = llm.context_params
    model = llm.model
    n_swa = int(llama_cpp.llama_model_n_swa(model))
    settings: dict[str, Any] = {
        "type_k": int(params.type_k),
        "type_v": int(params.type_v),
        # llama.cpp lays out V transposed exactly when flash attention was DISABLED at creation;
        # its auto mode still creates the untransposed layout, so this is the setting in effect
        # for the state even when auto mode later turns the kernel off.
        "v_transposed": int(params.flash_attn_type) == int(llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED),
        "n_seq_max": int(llama_cpp.llama_n_seq_max(llm.ctx)),
        "kv_unified": bool(params.kv_unified),
        "embeddings": bool(params.embeddings),
        "n_swa": n_swa,
        # The cached K rows are rotated; another RoPE setting gives the same layout but wrong values.
        "rope": [
            int(params.rope_scaling_type),
            float(params.rope_freq_base),
            float(params.rope_freq_scale),
            float(params.yarn_ext_factor),
            float(params.yarn_attn_factor),
            float(params.yarn_beta_fast),
            float(params.yarn_beta_slow),
            int(params.yarn_orig_ctx),
        ],
    }
    if n_swa > 0:
        settings["swa_full"] = bool(params.swa_full)
    return settings


def _kv_overrides(llm: llama_cpp.Llama) -> list[list[Any]]:
    """The model metadata the Llama was told to override: any of it can change what llama.cpp computes."""
    overrides = getattr(llm, "kv_overrides", None) or {}
    return sorted([str(key), type(value).__name__, value] for key, value in overrides.items())


def _numerics(llm: llama_cpp.Llama) -> list[Any]:
    """What decides the bits of the results besides the model: the backend's kernels, and the GPU."""
    numerics: list[Any] = [llama_system_info(), int(llm.model_params.n_gpu_layers)]
    # Listed only when off, so the fingerprints of models loaded the usual way stay what they were.
    if not bool(getattr(llm.model_params, "use_extra_bufts", True)):
        numerics.append("no extra buffer types")
    return numerics
