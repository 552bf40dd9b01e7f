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
- `kv_overrides`, and the LoRA adapters and control vector in effect (see `snapcache.llama.adapters`);
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
import mmap
import os
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import llama_cpp

from snapcache.errors import InvalidArgument, ModelError
from snapcache.llama.adapters import adapter_settings

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

Content = Literal["sampled", "full"]
CONTENT_ENV = "SNAPCACHE_FINGERPRINT"

FINGERPRINT_HEX_DIGITS = 32
TENSOR_SAMPLE_BYTES = 16 << 10
_FULL_CHUNK = 8 << 20

_FILE_PERSON = b"snapcache.file2"
_CONTEXT_PERSON = b"snapcache.ctx2"
_GGUF_MAGIC = b"GGUF"
# Byte sizes of the fixed-size GGUF value types (by type id); 8 is a string, 9 an array.
_GGUF_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_INT_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_DEFAULT_ALIGNMENT = 32
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# llama.cpp finds the other shards of a split model by this name pattern (llama_split_path).
_SHARD_NAME = re.compile(r"^(?P<prefix>.*)-00001-of-(?P<count>\d{5})\.gguf$")

_StatKey = tuple[int, int, int, int]
_file_cache: dict[tuple[tuple[_StatKey, ...], str], str] = {}
_split_counts: dict[_StatKey, int] = {}
_file_cache_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Layout:
    """What the fingerprint reads of a GGUF file: where its header ends and where tensor data lies."""

    header_end: int
    data_start: int
    tensor_offsets: tuple[int, ...]  # relative to data_start, ascending
    split_count: int


def file_fingerprint(path: str | os.PathLike[str], content: Content | None = None) -> str:
    """Hex digest of a GGUF model's content (all shards of a split model, from its first shard's path).

    `content` is "sampled" (the default, see the module docstring) or "full"; None reads the
    SNAPCACHE_FINGERPRINT environment variable. Kept by the identity (device, inode, size, mtime)
    of every shard, so repeats cost a stat per shard.
    """
    mode = _content_mode(content)
    shards = shard_paths(path)
    stats = tuple(_stat_key(shard) for shard in shards)
    key = (stats, mode)
    with _file_cache_lock:
        cached = _file_cache.get(key)
    if cached is not None:
        return cached
    digest = hashlib.blake2b(digest_size=FINGERPRINT_HEX_DIGITS // 2, person=_FILE_PERSON)
    digest.update(mode.encode())
    for shard, stat in zip(shards, stats, strict=True):
        digest.update(_hash_file(shard, stat[2], mode))
    value = digest.hexdigest()
    with _file_cache_lock:
        _file_cache[key] = value
    return value


def shard_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The files llama.cpp reads for the model at `path`: the file itself, or every shard of a split."""
    first = Path(path)
    stat = _stat_key(first)
    with _file_cache_lock:
        count = _split_counts.get(stat)
    if count is None:
        count = _read_layout(first, stat[2]).split_count
        with _file_cache_lock:
            _split_counts[stat] = count
    if count <= 1:
        return [first]
    match = _SHARD_NAME.match(first.name)
    if match is None or int(match["count"]) != count:
        raise ModelError(
            f"{first.name} is one of {count} shards of a split model; "
            "load it by the first shard's name (NAME-00001-of-NNNNN.gguf)"
        )
    return [first.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


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


def _content_mode(content: Content | None) -> Content:
    if content is None:
        value = os.environ.get(CONTENT_ENV, "").strip().lower() or "sampled"
        if value not in ("sampled", "full"):
            raise InvalidArgument(f"{CONTENT_ENV} must be 'sampled' or 'full', got {value!r}")
        return "full" if value == "full" else "sampled"
    if content not in ("sampled", "full"):
        raise InvalidArgument(f"content must be 'sampled' or 'full', got {content!r}")
    return content


def _stat_key(path: Path) -> _StatKey:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ModelError(f"cannot read the model file {os.fspath(path)!r}: {exc}") from exc
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


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


@cache
def llama_system_info() -> str:
    """llama.cpp's system info line: its backends and the compiled CPU features."""
    info = llama_cpp.llama_print_system_info()
    return info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)


def _hash_file(path: Path, size: int, mode: Content) -> bytes:
    if size == 0:
        raise ModelError(f"the model file {str(path)!r} is empty")
    digest = hashlib.blake2b(digest_size=FINGERPRINT_HEX_DIGITS // 2, person=_FILE_PERSON)
    digest.update(_U64.pack(size))
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                layout = _parse_layout(data, size)
                ranges = _full_ranges(layout, size) if mode == "full" else _sampled_ranges(layout, size)
                for start, end in ranges:
                    digest.update(view[start:end])
            finally:
                view.release()
    except OSError as exc:
        raise ModelError(f"cannot read the model file {str(path)!r}: {exc}") from exc
    return digest.digest()


def _full_ranges(layout: _Layout, size: int) -> Iterator[tuple[int, int]]:
    yield 0, layout.header_end
    for start in range(layout.data_start, size, _FULL_CHUNK):
        yield start, min(start + _FULL_CHUNK, size)


def _sampled_ranges(layout: _Layout, size: int) -> list[tuple[int, int]]:
    """The header, then per tensor: all of it up to 3 samples long, else its first, middle and last sample."""
    ranges = [(0, layout.header_end)]
    starts = [layout.data_start + offset for offset in layout.tensor_offsets]
    ends = [*starts[1:], size]
    piece = TENSOR_SAMPLE_BYTES
    for start, end in zip(starts, ends, strict=True):
        end = min(end, size)
        if end - start <= 3 * piece:
            ranges.append((start, end))
            continue
        middle = start + (end - start - piece) // 2
        ranges += [(start, start + piece), (middle, middle + piece), (end - piece, end)]
    return ranges


def _read_layout(path: Path, size: int) -> _Layout:
    if size == 0:
        raise ModelError(f"the model file {str(path)!r} is empty")
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse_layout(data, size)
    except OSError as exc:
        raise ModelError(f"cannot read the model file {str(path)!r}: {exc}") from exc


def _parse_layout(data: mmap.mmap, size: int) -> _Layout:
    """Parse the GGUF header (v2 and v3): its end, the tensor data offsets, split count and alignment."""
    if size < 24 or data[:4] != _GGUF_MAGIC:
        raise ModelError("not a GGUF model file (bad magic)")
    version = _U32.unpack_from(data, 4)[0]
    if version not in (2, 3):
        raise ModelError(f"unsupported GGUF version {version}")
    n_tensors = _U64.unpack_from(data, 8)[0]
    n_kv = _U64.unpack_from(data, 16)[0]
    u32, u64 = _U32.unpack_from, _U64.unpack_from
    wanted = {b"split.count": 1, b"general.alignment": _GGUF_DEFAULT_ALIGNMENT}
    off = 24
    offsets: list[int] = []
    try:
        for _ in range(n_kv):
            key_len = u64(data, off)[0]
            key = bytes(data[off + 8 : off + 8 + key_len])
            off += 8 + key_len
            value_type = u32(data, off)[0]
            off += 4
            if key in wanted and value_type in _GGUF_INT_FORMATS:
                wanted[key] = struct.unpack_from(_GGUF_INT_FORMATS[value_type], data, off)[0]
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
        if n_tensors * 24 > size - off:
            raise ModelError("malformed GGUF header: the tensor table runs past the end")
        for _ in range(n_tensors):
            off += 8 + u64(data, off)[0]  # name
            n_dims = u32(data, off)[0]
            off += 4 + 8 * n_dims + 4  # dims, type
            offsets.append(u64(data, off)[0])
            off += 8
    except (struct.error, KeyError, OverflowError) as exc:
        raise ModelError(f"malformed GGUF header: {exc}") from None
    if off > size:
        raise ModelError("malformed GGUF header: it runs past the end of the file")
    alignment = int(wanted[b"general.alignment"]) or _GGUF_DEFAULT_ALIGNMENT
    data_start = min(-(-off // alignment) * alignment, size)
    return _Layout(
        header_end=off,
        data_start=data_start,
        tensor_offsets=tuple(sorted(offset for offset in offsets if data_start + offset < size)),
        split_count=max(int(wanted[b"split.count"]), 1),
    )
