"""State bytes to compressed payloads and back, at memory speed: blosc2 chunks (byte shuffle + zstd).

A llama.cpp state is mostly f16 (or quantized) K/V rows. The high byte of an f16 value (sign,
exponent, top of the mantissa) repeats a lot; the low byte is noise. A 2-byte shuffle puts the high
bytes together so that zstd finds something to work with (ratio 1.16 on a Gemma state, against 1.08
without it); lz4 and blosclz find nothing in this data (ratio 1.00).

`blosc2` does the shuffle and zstd in C, block by block (64 KiB) inside each chunk, the shuffle with
SIMD on a block still in cache, the blocks on several threads outside the GIL. It decodes a 35 MiB
Gemma state in about half the time one zstd frame and a numpy unshuffle take (bench_codec.py), and
a new process's first hit in about a quarter (bench_disk_hit.py). A payload is a run of chunks of
CHUNK_BYTES of state each (the last one shorter; blosc2 chunks hold at most 2 GiB), each decoded
straight into its slice of one preallocated buffer.

blosc2's decoder writes as many bytes as a chunk's header declares, whatever the size of the buffer
it is given, and chunks carry no checksum. So decompress_into checks every chunk's header against the
sizes it expects before decoding it, and the file format verifies the payload before it gets here.

Compression buys little on f16 K/V (a sixth of the bytes) and costs every read a decode slower than
the read itself: 128 MiB of an 8B model's state read from the page cache in 43 ms and decoded in 66 ms
more on two threads, 110 ms on one (AMD EPYC, 2 cores). So a payload may also be the state itself
(`RAW`), which a read hands on without a copy; which one a tier writes is its `Compression`
(formats.compression).

Format 1 (snapcache 0.1.0) stored one zstd frame of the numpy-shuffled state; decompress_zstd_frame
still reads it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from snapcache.errors import CorruptSnapshot, InvalidArgument
from snapcache.snapshot import Buffer

NAME = "blosc2-zstd"
RAW = "raw"  # the state as it is
DEFAULT_LEVEL = 1  # blosc2's clevel; 1 is zstd level 1, higher levels buy nothing on KV data
DEFAULT_SHUFFLE = True
MIN_LEVEL = 0  # stored as is
MAX_LEVEL = 9
CHUNK_BYTES = 1 << 26
# blosc2's chunk header: version, codec version, flags, type size, then state bytes, block size and
# chunk bytes (int32 each); blosc2 always writes the 32-byte extended form.
_CHUNK_HEADER = struct.Struct("<BBBBiii")
_CHUNK_HEADER_BYTES = 32
# Byte 31 names a special chunk in its bits 4-6; "uninitialized" (4) would leave the buffer as it was.
_SPECIAL_FLAGS_AT = 31
_SPECIAL_UNINIT = 4
_SHUFFLE_TYPESIZE = 2
# Below this many bytes a state is decoded on one thread (a 64-token block of a small model).
_THREADED_BYTES = 4 << 20

# Format 1: no frame we wrote needs a larger window (level 19 uses 8 MiB); refuse bigger ones.
_MAX_WINDOW_BYTES = 1 << 27

Bytes = npt.NDArray[np.uint8]


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# blosc2 decodes the blocks of a chunk on this many threads. A restore is what the process waits for
# at that moment, and a second free core shortens it; more would take cores from llama.cpp when a
# server restores one sequence while it decodes another.
DEFAULT_THREADS = min(2, usable_cores())


def _import_blosc2() -> None:
    # Any failure (ImportError, or a deadlock the import system breaks) recurs where blosc2 is used.
    with contextlib.suppress(Exception):
        importlib.import_module("blosc2")


# blosc2 is a whole array library and takes 0.2-0.4 s to import (bench_disk_hit.py); a new process
# should not wait for that at its first disk hit. Importing it on a thread from here overlaps it with
# what the process does next (load a model, open the index); _blosc2() waits for it when needed.
# The thread is not a daemon: Python ends daemon threads at exit wherever they are, and one ended
# inside the C++ of an extension's import aborts the whole process ("FATAL: exception not
# rethrown"). A process that is done before the import is waits for it instead.
threading.Thread(target=_import_blosc2, name="snapcache-import-blosc2", daemon=False).start()


def _blosc2() -> Any:
    import blosc2  # returns at once, or waits for the import under way

    global _gil_released
    if not _gil_released:
        # Let other threads run while blosc2 works: a completion's Python side while the background
        # writer compresses.
        blosc2.set_releasegil(True)
        _gil_released = True
    return blosc2


_gil_released = False


def validate_level(level: object) -> int:
    """The compression level, or InvalidArgument when it is not an int in [MIN_LEVEL, MAX_LEVEL]."""
    if isinstance(level, bool) or not isinstance(level, int) or not MIN_LEVEL <= level <= MAX_LEVEL:
        raise InvalidArgument(f"compression level must be an int from {MIN_LEVEL} to {MAX_LEVEL}")
    return level


@dataclass(frozen=True, slots=True)
class StateCodec:
    """How one payload holds its state: blosc2 zstd chunks at `level` and `shuffle`, or raw."""

    name: str = NAME
    level: int = DEFAULT_LEVEL
    shuffle: bool = DEFAULT_SHUFFLE

    @property
    def raw(self) -> bool:
        return self.name == RAW

    def encode(self, state: Buffer) -> Buffer:
        """The payload of `state`: compressed, or a view of `state` itself when raw."""
        if self.raw:
            return memoryview(state).cast("B")
        return compress(state, level=self.level, shuffle=self.shuffle)

    def header(self) -> dict[str, Any]:
        """How a file's header names this codec."""
        return {"name": self.name, "level": self.level, "shuffle": 2 if self.shuffle else 0}

    @classmethod
    def of_header(cls, fields: dict[str, Any]) -> StateCodec:
        """The codec a (version 2 or 3) header names; CorruptSnapshot for one unknown here."""
        name, level, shuffle = fields.get("name"), fields.get("level"), fields.get("shuffle")
        if name not in (NAME, RAW) or shuffle not in (0, 2) or type(level) is not int:
            raise CorruptSnapshot("unknown codec")
        return cls(name, level, shuffle == 2)


ZSTD = StateCodec()
RAW_CODEC = StateCodec(RAW, 0, False)


def decoded(
    state_codec: StateCodec, payload: memoryview, state_bytes: int, state_into: memoryview | None
) -> memoryview:
    """A verified payload's state, read-only. Compressed: decoded into `state_into` when it is large
    enough, else into new memory. Raw: a view of `payload` itself when `state_into` is given (so valid
    as long as the buffer `payload` views), else a copy."""
    if state_codec.raw:
        if payload.nbytes != state_bytes:
            raise CorruptSnapshot(f"raw payload is {payload.nbytes} bytes, expected {state_bytes}")
        if state_into is not None:
            return payload.toreadonly()
        copied = np.frombuffer(payload, dtype=np.uint8).copy()
        copied.flags.writeable = False
        return copied.data
    if state_into is not None and state_into.nbytes >= state_bytes:
        state = state_into[:state_bytes]
        decompress_into(payload, state)
        return state.toreadonly()
    return decompress(payload, expected_size=state_bytes)


def compress(
    data: Buffer,
    *,
    level: int = DEFAULT_LEVEL,
    shuffle: bool = DEFAULT_SHUFFLE,
    threads: int = 1,
) -> bytes:
    """blosc2 chunks of zstd at `level` over CHUNK_BYTES of `data` each; `shuffle` is the 2-byte shuffle.

    One thread by default: the store compresses on its writer thread while llama.cpp generates.
    """
    validate_level(level)
    blosc2 = _blosc2()
    view = memoryview(data).cast("B")
    params = {
        "codec": blosc2.Codec.ZSTD,
        "clevel": level,
        "filters": [blosc2.Filter.SHUFFLE if shuffle else blosc2.Filter.NOFILTER],
        "typesize": _SHUFFLE_TYPESIZE if shuffle else 1,
        "nthreads": max(1, threads),
    }
    chunks = [
        blosc2.compress2(view[start : start + CHUNK_BYTES], **params)
        for start in range(0, view.nbytes, CHUNK_BYTES)
    ]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decompress_into(payload: Buffer, out: Buffer, *, threads: int = DEFAULT_THREADS) -> None:
    """Decode a payload made by `compress` into `out`, a writable buffer of exactly the state's size.

    Raises CorruptSnapshot unless the payload is one chunk per CHUNK_BYTES of `out`, each declaring
    exactly its share of `out` and spanning exactly its bytes, all of them decoding.
    """
    source = memoryview(payload).cast("B")
    target = memoryview(out).cast("B")
    if target.readonly:
        raise InvalidArgument("decompress_into needs a writable output buffer")
    blosc2 = _blosc2()
    if target.nbytes < _THREADED_BYTES:
        threads = 1  # blosc2 restarts its thread pool whenever the count changes: costly for small chunks
    position = 0
    for start in range(0, target.nbytes, CHUNK_BYTES):
        expected = min(CHUNK_BYTES, target.nbytes - start)
        chunk_bytes = _checked_chunk_bytes(source[position:], expected)
        try:
            blosc2.decompress2(
                source[position : position + chunk_bytes],
                dst=target[start : start + expected],
                nthreads=max(1, threads),
            )
        except (ValueError, RuntimeError) as exc:
            raise CorruptSnapshot(f"blosc2 chunk does not decode: {exc}") from None
        position += chunk_bytes
    if position != source.nbytes:
        raise CorruptSnapshot("data follows the last blosc2 chunk")


def decompress(payload: Buffer, *, expected_size: int, threads: int = DEFAULT_THREADS) -> memoryview:
    """Decode a payload made by `compress` into a new read-only buffer of exactly `expected_size` bytes."""
    if expected_size < 0:
        raise InvalidArgument("expected_size must not be negative")
    decoded = np.empty(expected_size, dtype=np.uint8)
    decompress_into(payload, decoded.data, threads=threads)
    decoded.flags.writeable = False
    return decoded.data


def _checked_chunk_bytes(rest: memoryview, expected_state_bytes: int) -> int:
    """The length of the chunk at the start of `rest`, once its header matches what we expect."""
    if rest.nbytes < _CHUNK_HEADER_BYTES:
        raise CorruptSnapshot("payload is truncated inside a blosc2 chunk header")
    version, _, _, typesize, state_bytes, block_bytes, chunk_bytes = _CHUNK_HEADER.unpack_from(rest)
    if version < 3:  # blosc1 chunks lack the extended header blosc2 writes
        raise CorruptSnapshot(f"not a blosc2 chunk (version {version})")
    if state_bytes != expected_state_bytes:
        raise CorruptSnapshot(f"blosc2 chunk declares {state_bytes} bytes, expected {expected_state_bytes}")
    if not _CHUNK_HEADER_BYTES <= chunk_bytes <= rest.nbytes:
        raise CorruptSnapshot(f"blosc2 chunk declares {chunk_bytes} bytes, {rest.nbytes} remain")
    if typesize < 1 or block_bytes < 0:
        raise CorruptSnapshot("blosc2 chunk header is malformed")
    if (rest[_SPECIAL_FLAGS_AT] >> 4) & 7 == _SPECIAL_UNINIT:
        raise CorruptSnapshot("blosc2 chunk leaves its bytes uninitialized")
    return int(chunk_bytes)


# -- format 1: one zstd frame of the numpy-shuffled state ---------------------------------------------


def shuffle2(data: Buffer) -> Bytes:
    """All even bytes, then all odd bytes (a trailing odd byte stays last)."""
    src = np.frombuffer(data, dtype=np.uint8)
    n = len(src)
    half = n // 2
    out = np.empty(n, dtype=np.uint8)
    words = src[: 2 * half].view("<u2")
    np.bitwise_and(words, 0xFF, out=out[:half], casting="unsafe")
    np.right_shift(words, 8, out=out[half : 2 * half], casting="unsafe")
    out[2 * half :] = src[2 * half :]
    return out


def unshuffle2_into(shuffled: Buffer | Bytes, out: bytearray | Bytes) -> None:
    """Inverse of shuffle2, written into `out` (same length)."""
    src = np.frombuffer(shuffled, dtype=np.uint8)
    n = len(src)
    if len(out) != n:
        raise InvalidArgument(f"output is {len(out)} bytes, expected {n}")
    half = n // 2
    dst = np.frombuffer(out, dtype=np.uint8)
    words = dst[: 2 * half].view("<u2")
    np.left_shift(src[half : 2 * half], 8, out=words, dtype="<u2")
    words |= src[:half]
    dst[2 * half :] = src[2 * half :]


def compress_zstd_frame(data: Buffer, *, level: int = 1, shuffle: bool = True) -> bytes:
    """One zstd frame with content size and checksum, after shuffle2 with `shuffle` (format 1)."""
    if isinstance(level, bool) or not isinstance(level, int) or not -7 <= level <= 19:
        raise InvalidArgument("zstd level must be an int from -7 to 19")
    view = memoryview(data).cast("B")
    source = shuffle2(view).data if shuffle else view
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    return compressor.compress(source)


def decompress_zstd_frame(payload: Buffer, *, expected_size: int, shuffle: bool) -> memoryview:
    """Decode one frame made by compress_zstd_frame into a new read-only buffer of `expected_size` bytes.

    Raises CorruptSnapshot for anything else. The frame header is checked before anything is
    allocated, so a hostile frame cannot make this allocate more than `expected_size` bytes (twice
    that with `shuffle`) or decode past them. zstd verifies the frame's checksum while decoding.
    """
    if expected_size < 0:
        raise InvalidArgument("expected_size must not be negative")
    view = memoryview(payload).cast("B")
    try:
        params = zstandard.get_frame_parameters(view)
    except zstandard.ZstdError as exc:
        raise CorruptSnapshot(f"not a zstd frame: {exc}") from None
    if params.content_size != expected_size:
        raise CorruptSnapshot(f"frame declares {params.content_size} bytes, expected {expected_size}")
    if not params.has_checksum:
        raise CorruptSnapshot("frame carries no checksum")
    if params.window_size > _MAX_WINDOW_BYTES:
        raise CorruptSnapshot(f"frame window of {params.window_size} bytes is too large")
    if _frame_size(view) != view.nbytes:
        raise CorruptSnapshot("data follows the zstd frame")
    # Decoding into a buffer we own avoids a bytes object and its page faults: about twice as fast.
    decoded = np.empty(expected_size, dtype=np.uint8)
    decompressor = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW_BYTES)
    try:
        with decompressor.stream_reader(view) as reader:
            filled = 0
            while filled < expected_size:
                count = reader.readinto(decoded[filled:])
                if not count:
                    break
                filled += count
            # Reading on to the end of the frame makes zstd verify the content checksum.
            if filled != expected_size or reader.read(1):
                raise CorruptSnapshot(f"frame does not decode to {expected_size} bytes")
    except zstandard.ZstdError as exc:
        raise CorruptSnapshot(f"zstd frame does not decode: {exc}") from None
    if shuffle:
        out = np.empty(expected_size, dtype=np.uint8)
        unshuffle2_into(decoded, out)
        decoded = out
    decoded.flags.writeable = False
    return decoded.data


def _frame_size(frame: memoryview) -> int:
    """Bytes the zstd frame at the start of `frame` spans, from its block headers."""
    try:
        position = zstandard.frame_header_size(frame)
    except zstandard.ZstdError as exc:
        raise CorruptSnapshot(f"bad zstd frame header: {exc}") from None
    end = frame.nbytes
    while True:
        if position + 3 > end:
            raise CorruptSnapshot("zstd frame is truncated")
        header = int.from_bytes(frame[position : position + 3], "little")
        block_type = (header >> 1) & 3
        if block_type == 3:
            raise CorruptSnapshot("zstd frame has a reserved block type")
        position += 3 + (1 if block_type == 1 else header >> 3)
        if header & 1:
            break
    return position + 4  # the content checksum, which decompress_zstd_frame() requires
