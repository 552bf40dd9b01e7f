"""What an image's bytes must be before mtmd decodes them: a format it reads, dimensions in bounds.

mtmd decodes images with stb_image, in C. So the bytes are checked here first: the size, the format
from the file's signature, and the width and height from its header, so that a picture that would
decode to gigabytes (a few hundred bytes can claim 65,535 x 65,535 pixels) is refused before any
pixel is decoded. The checks read headers only; what passes may still fail to decode (a damaged
stream), which `Projector.decode` reports as the same `ImageError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from snapcache.errors import ImageError

__all__ = ["MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "CheckedImage", "ImageError", "check_image"]

# The largest encoded image accepted: a 4K screenshot as PNG is 2 to 10 MiB.
MAX_IMAGE_BYTES = 20 << 20
# The most pixels an image may decode to (at 3 bytes a pixel, 100 MiB): an 8K screen is 33 million.
MAX_IMAGE_PIXELS = 35_000_000

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


@dataclass(frozen=True, slots=True)
class CheckedImage:
    """An image's format ("png", "jpeg", "gif" or "bmp") and dimensions, read from its header."""

    format: str
    width: int
    height: int


def check_image(data: bytes) -> CheckedImage:
    """The format and size of the image in `data`; ImageError where it is none that mtmd decodes,
    its header is damaged, or it is over `MAX_IMAGE_BYTES` or `MAX_IMAGE_PIXELS`."""
    if not data:
        raise ImageError("the image is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"the image is {len(data):,} bytes; the most accepted is {MAX_IMAGE_BYTES:,}")
    if data.startswith(_PNG):
        checked = _png(data)
    elif data.startswith(b"\xff\xd8\xff"):
        checked = _jpeg(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        checked = _gif(data)
    elif data.startswith(b"BM"):
        checked = _bmp(data)
    else:
        raise ImageError("the bytes are not a PNG, JPEG, GIF or BMP image")
    if checked.width <= 0 or checked.height <= 0:
        raise ImageError(
            f"the {checked.format.upper()} image says it is {checked.width} x {checked.height} pixels"
        )
    if checked.width * checked.height > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"the image is {checked.width} x {checked.height} pixels; the most accepted is"
            f" {MAX_IMAGE_PIXELS:,} pixels"
        )
    return checked


def _png(data: bytes) -> CheckedImage:
    # The signature, then the IHDR chunk: length, type, width, height.
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise ImageError("the PNG image has no header (IHDR) where it should")
    width, height = struct.unpack(">II", data[16:24])
    return CheckedImage("png", width, height)


def _gif(data: bytes) -> CheckedImage:
    if len(data) < 10:
        raise ImageError("the GIF image ends inside its header")
    width, height = struct.unpack("<HH", data[6:10])
    return CheckedImage("gif", width, height)


def _bmp(data: bytes) -> CheckedImage:
    # File header (14 bytes), then the DIB header: its size, then width and height.
    if len(data) < 26:
        raise ImageError("the BMP image ends inside its header")
    (dib_size,) = struct.unpack("<I", data[14:18])
    if dib_size == 12:
        width, height = struct.unpack("<HH", data[18:22])
    elif dib_size >= 40:
        width, height = struct.unpack("<ii", data[18:26])
    else:
        raise ImageError(f"the BMP image has a header of {dib_size} bytes, which is none that is read")
    return CheckedImage("bmp", width, abs(height))  # a negative height is a top-down picture


def _jpeg(data: bytes) -> CheckedImage:
    """Walk the markers to the first start of frame (SOFn), which holds the dimensions."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise ImageError("the JPEG image is damaged before its frame header")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if length < 2:
            raise ImageError("the JPEG image is damaged before its frame header")
        if marker in _JPEG_SOF:
            if at + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return CheckedImage("jpeg", width, height)
        if marker == 0xDA:  # start of scan before any frame header
            break
        at += 2 + length
    raise ImageError("the JPEG image has no frame header (SOF) before its data")
