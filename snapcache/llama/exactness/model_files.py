"""What a GGUF model file holds, as a fingerprint: its header, metadata and tensor table in full,
and by default ("sampled") every tensor's data whole up to 48 KiB and three 16 KiB pieces (its
beginning, middle and end) of larger ones; `SNAPCACHE_FINGERPRINT=full` (or `content="full"`)
hashes every byte. Every shard of a split model counts. The result is kept by file identity, so a
repeat costs a stat per shard. A Llama's fingerprint (`fingerprint`) and its adapters' (`adapters`)
are built on it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from snapcache.errors import InvalidArgument, ModelError

__all__ = ["CONTENT_ENV", "FINGERPRINT_HEX_DIGITS", "Content", "file_fingerprint", "shard_paths"]

Content = Literal["sampled", "full"]
CONTENT_ENV = "SNAPCACHE_FINGERPRINT"

FINGERPRINT_HEX_DIGITS = 32
TENSOR_SAMPLE_BYTES = 16 << 10
_FULL_CHUNK = 8 << 20

_FILE_PERSON = b"snapcache.file2"
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
