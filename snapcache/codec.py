"""Bytes to compressed payloads and back: zstd, with an optional 2-byte shuffle for f16 KV data.

The shuffle stores the low byte of every 2-byte word first, then every high byte. The high bytes of
f16 values (sign, exponent, top of the mantissa) repeat a lot, so zstd finds far more to work with.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import zstandard

from snapcache.errors import CorruptSnapshot, InvalidArgument
from snapcache.snapshot import Buffer

DEFAULT_LEVEL = 1
DEFAULT_SHUFFLE = True
MIN_LEVEL = -7
MAX_LEVEL = 19
# No frame we write needs a larger window (level 19 uses 8 MiB); refuse bigger ones before decoding.
_MAX_WINDOW_BYTES = 1 << 27

Bytes = npt.NDArray[np.uint8]


def validate_level(level: object) -> int:
    """The zstd level, or InvalidArgument when it is not an int in [MIN_LEVEL, MAX_LEVEL]."""
    if isinstance(level, bool) or not isinstance(level, int) or not MIN_LEVEL <= level <= MAX_LEVEL:
        raise InvalidArgument(f"compression level must be an int from {MIN_LEVEL} to {MAX_LEVEL}")
    return level


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


def compress(
    data: Buffer, *, level: int = DEFAULT_LEVEL, shuffle: bool = DEFAULT_SHUFFLE, threads: int = 0
) -> bytes:
    """One zstd frame with content size and checksum; `shuffle` applies shuffle2 first.

    `threads` > 0 lets zstd compress with that many worker threads: measured no faster at level 1
    on a 12 MB state with 2 cores (see benchmarks/bench_codec.py), so the disk tier uses none.
    """
    validate_level(level)
    view = memoryview(data).cast("B")
    source = shuffle2(view).data if shuffle else view
    compressor = zstandard.ZstdCompressor(
        level=level, write_checksum=True, write_content_size=True, threads=threads
    )
    return compressor.compress(source)


def decompress(payload: Buffer, *, expected_size: int, shuffle: bool) -> memoryview:
    """Decode one frame made by `compress` into a new read-only buffer of exactly `expected_size` bytes.

    Raises CorruptSnapshot for anything else. The frame header is checked before anything is
    allocated, so a hostile frame cannot make this allocate more than `expected_size` bytes (twice
    that with `shuffle`) or decode past them.
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
    return position + 4  # the content checksum, which decompress() requires
