"""Fingerprints: which model content and which context settings a llama.cpp state was made with.

A snapshot restores only into a context with the same fingerprint. The file part covers the GGUF
header, metadata and tensor table in full plus samples of the tensor data spread across the file, so
another fine-tune or quantization differs while a copied or moved file does not. The context part
covers every setting that changes the layout or the meaning of the cached K and V rows, and never
the ones that only change how much fits (n_ctx) or how fast it runs (threads, batch sizes).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Any

import llama_cpp

from snapcache.errors import ModelError

FINGERPRINT_HEX_DIGITS = 32
SAMPLE_COUNT = 64
SAMPLE_BYTES = 64 << 10

_FILE_PERSON = b"snapcache.file1"
_CONTEXT_PERSON = b"snapcache.ctx1"
_GGUF_MAGIC = b"GGUF"
# Byte sizes of the fixed-size GGUF value types (by type id); 8 is a string, 9 an array.
_GGUF_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_FileKey = tuple[int, int, int, int]
_file_cache: dict[_FileKey, str] = {}
_file_cache_lock = threading.Lock()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """Hex digest of a GGUF file's content; cached by (device, inode, size, mtime), so repeats are free."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ModelError(f"cannot read the model file {os.fspath(path)!r}: {exc}") from exc
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _file_cache_lock:
        cached = _file_cache.get(key)
    if cached is not None:
        return cached
    digest = _hash_file(Path(path), st.st_size)
    with _file_cache_lock:
        _file_cache[key] = digest
    return digest


def model_fingerprint(llm: llama_cpp.Llama) -> str:
    """Fingerprint of a loaded Llama: its model file's content plus the state-relevant context settings."""
    parts = {
        "model": file_fingerprint(llm.model_path),
        "context": _context_settings(llm),
        "lora": _lora_settings(llm),
        "state_seq_version": int(getattr(llama_cpp, "LLAMA_STATE_SEQ_VERSION", 0)),
        "llama_cpp": str(getattr(llama_cpp, "__version__", "")),
    }
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


def _lora_settings(llm: llama_cpp.Llama) -> list[Any]:
    lora_path = getattr(llm, "lora_path", None)
    if not lora_path:
        return []
    return [file_fingerprint(lora_path), float(getattr(llm, "lora_scale", 1.0))]


def _hash_file(path: Path, size: int) -> str:
    if size == 0:
        raise ModelError(f"the model file {str(path)!r} is empty")
    digest = hashlib.blake2b(digest_size=FINGERPRINT_HEX_DIGITS // 2, person=_FILE_PERSON)
    digest.update(_U64.pack(size))
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                header_end = _gguf_header_end(data, size)
                for start, end in [(0, header_end), *_tensor_data_ranges(header_end, size)]:
                    digest.update(view[start:end])
            finally:
                view.release()
    except OSError as exc:
        raise ModelError(f"cannot read the model file {str(path)!r}: {exc}") from exc
    return digest.hexdigest()


def _tensor_data_ranges(start: int, size: int) -> list[tuple[int, int]]:
    """All of [start, size) when small, else SAMPLE_COUNT blocks at fixed offsets spread evenly over it."""
    span = size - start
    if span <= SAMPLE_COUNT * SAMPLE_BYTES:
        return [(start, size)]
    step = (span - SAMPLE_BYTES) / (SAMPLE_COUNT - 1)
    offsets = (start + int(i * step) for i in range(SAMPLE_COUNT))
    return [(offset, offset + SAMPLE_BYTES) for offset in offsets]


def _gguf_header_end(data: mmap.mmap, size: int) -> int:
    """Offset just past the GGUF header, key/value metadata and tensor table (GGUF v2 and v3)."""
    if size < 24 or data[:4] != _GGUF_MAGIC:
        raise ModelError("not a GGUF model file (bad magic)")
    version = _U32.unpack_from(data, 4)[0]
    if version not in (2, 3):
        raise ModelError(f"unsupported GGUF version {version}")
    n_tensors = _U64.unpack_from(data, 8)[0]
    n_kv = _U64.unpack_from(data, 16)[0]
    u32, u64 = _U32.unpack_from, _U64.unpack_from
    off = 24
    try:
        for _ in range(n_kv):
            off += 8 + u64(data, off)[0]  # key
            value_type = u32(data, off)[0]
            off += 4
            if value_type == _GGUF_STRING:
                off += 8 + u64(data, off)[0]
            elif value_type == _GGUF_ARRAY:
                item_type = u32(data, off)[0]
                count = u64(data, off + 4)[0]
                off += 12
                if item_type == _GGUF_STRING:
                    if count * 8 > size - off:
                        raise ModelError("malformed GGUF header: a string array runs past the end")
                    for _ in range(count):
                        off += 8 + u64(data, off)[0]
                else:
                    off += _GGUF_FIXED_SIZES[item_type] * count
            else:
                off += _GGUF_FIXED_SIZES[value_type]
        for _ in range(n_tensors):
            off += 8 + u64(data, off)[0]  # name
            n_dims = u32(data, off)[0]
            off += 4 + 8 * n_dims + 4 + 8  # dims, type, data offset
    except (struct.error, KeyError, OverflowError) as exc:
        raise ModelError(f"malformed GGUF header: {exc}") from None
    if off > size:
        raise ModelError("malformed GGUF header: it runs past the end of the file")
    return off
