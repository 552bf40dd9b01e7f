"""The checks an image's bytes pass before mtmd decodes them (`snapcache.llama.media.image_check`)."""

from __future__ import annotations

import struct
import zlib

import pytest
from image_files import bmp, picture, png

from snapcache.errors import InvalidArgument
from snapcache.llama.media.image_check import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageError, check_image


def test_png_and_bmp_give_their_format_and_size() -> None:
    pixels = picture(0, width=48, height=40)
    assert (check_image(png(pixels)).format, check_image(png(pixels)).width) == ("png", 48)
    checked = check_image(bmp(pixels))
    assert (checked.format, checked.width, checked.height) == ("bmp", 48, 40)


def test_gif_and_jpeg_headers_are_read() -> None:
    gif = b"GIF89a" + struct.pack("<HH", 320, 200) + b"\x00" * 20
    assert (check_image(gif).width, check_image(gif).height) == (320, 200)
    # SOI, an APP0 segment, then a baseline frame header: 1080 rows of 1920.
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, 1080, 1920, 3) + b"\x00" * 9
    checked = check_image(b"\xff\xd8" + app0 + sof)
    assert (checked.format, checked.width, checked.height) == ("jpeg", 1920, 1080)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "empty"),
        (b"%PDF-1.7 not a picture", "not a PNG, JPEG, GIF or BMP"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "no header"),
        (b"GIF89a\x01", "ends inside its header"),
        (b"\xff\xd8\xff\xda\x00\x08" + b"\x00" * 8, "no frame header"),
        (b"BM" + b"\x00" * 12 + struct.pack("<I", 7) + b"\x00" * 8, "header of 7 bytes"),
    ],
)
def test_what_is_not_an_image_is_refused_with_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(ImageError, match=says):
        check_image(data)


def test_a_picture_that_would_decode_too_large_is_refused_from_its_header() -> None:
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    bomb = (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + b"IHDR"
        + header
        + struct.pack(">I", zlib.crc32(header))
    )
    with pytest.raises(ImageError, match=f"{side} x {side} pixels"):
        check_image(bomb)
    with pytest.raises(ImageError, match="0 x"):
        check_image(b"GIF89a" + struct.pack("<HH", 0, 10))


def test_bytes_over_the_limit_are_refused_before_they_are_read() -> None:
    with pytest.raises(ImageError, match=f"{MAX_IMAGE_BYTES:,}"):
        check_image(b"\x89PNG" + b"\x00" * MAX_IMAGE_BYTES)


def test_an_image_error_is_an_invalid_argument() -> None:
    assert issubclass(ImageError, InvalidArgument)
    assert issubclass(ImageError, ValueError)


def test_messages_that_are_not_messages_hold_no_images() -> None:
    from snapcache.llama.media.chat_images import has_images, split_images

    assert not has_images(["not a message", None, {"content": "text"}])  # type: ignore[list-item]
    image = {"content": [{"type": "image_url", "image_url": "data:image/png;base64,AA=="}]}
    assert has_images([image])
    with pytest.raises(InvalidArgument, match=r"messages\[1\] is not a message"):
        split_images([image, "not a message"])  # type: ignore[list-item]
