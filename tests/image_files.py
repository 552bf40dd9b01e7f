"""Encode pixels as image files (PNG, BMP) for the tests, with no imaging library: pictures the suite
draws itself, in the formats clients send."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import numpy.typing as npt

Pixels = npt.NDArray[np.uint8]


def picture(seed: int, width: int = 48, height: int = 40) -> Pixels:
    """Random RGB pixels, `height` x `width` x 3."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def png(pixels: Pixels) -> bytes:
    """`pixels` (height x width x 3) as an 8-bit RGB PNG."""
    height, width, _ = pixels.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def bmp(pixels: Pixels) -> bytes:
    """`pixels` as a 24-bit BMP (bottom-up rows of BGR, each padded to 4 bytes)."""
    height, width, _ = pixels.shape
    stride = (3 * width + 3) // 4 * 4
    rows = b"".join(pixels[y, :, ::-1].tobytes().ljust(stride, b"\x00") for y in range(height - 1, -1, -1))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(rows), 0, 0, 14 + len(info)) + info + rows
