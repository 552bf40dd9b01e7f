"""The images of a chat's messages, as OpenAI's Chat Completions API sends them, and the messages
with a marker where each was, for the model's own chat template to render.

An image is a content part `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`
(or `"image_url": "data:..."`). Only data URLs are taken: snapcache fetches nothing, so an http(s) URL
is a clear error that says to send the bytes. A message whose content holds an image becomes text:
its text parts in order, the marker in place of each image. The marker is new for every chat, so no
text a client sends can stand for an image.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapcache.errors import ImageError, InvalidArgument
from snapcache.llama.media.image_check import MAX_IMAGE_BYTES

__all__ = ["ChatImages", "base64_bytes", "data_url_bytes", "has_images", "split_images"]

_DATA_URL = "data:"


@dataclass(frozen=True, slots=True)
class ChatImages:
    """`messages` with `marker` where each image was, and the images' bytes in order."""

    messages: list[dict[str, Any]]
    images: list[bytes]
    marker: str


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message's content holds an image part."""
    return any(_image_parts(message) for message in messages)


def split_images(messages: Sequence[Mapping[str, Any]]) -> ChatImages:
    """The images of `messages` and the messages with a fresh marker in their place (see the module
    docstring); InvalidArgument naming the message and part of an image that is not a data URL."""
    marker = f"<snapcache-image-{secrets.token_hex(8)}>"
    images: list[bytes] = []
    rendered: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidArgument(f"messages[{i}] is not a message (an object with a role and content)")
        content = message.get("content")
        if not _image_parts(message):
            rendered.append(dict(message))
            continue
        assert isinstance(content, list)
        text: list[str] = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":
                text.append(str(part.get("text", "")))
            elif kind == "image_url":
                images.append(data_url_bytes(part.get("image_url"), f"{where}.image_url"))
                text.append(marker)
            else:
                raise InvalidArgument(f"{where}: a content part is text or image_url, not {kind!r}")
        rendered.append({**message, "content": "".join(text)})
    return ChatImages(rendered, images, marker)


def _image_parts(message: object) -> bool:
    if not isinstance(message, Mapping):
        return False  # not a message: the chat handler says so, as without images
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and part.get("type") == "image_url" for part in content
    )


def data_url_bytes(image_url: object, where: str) -> bytes:
    """The bytes of the image `image_url` holds (a data URL, or an object with one under `url`);
    InvalidArgument or ImageError, naming `where`, for anything else."""
    url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
    if not isinstance(url, str):
        raise InvalidArgument(f"{where}: an image is a data URL, not {type(url).__name__}")
    if url.startswith(("http://", "https://")):
        raise InvalidArgument(
            f"{where}: snapcache fetches nothing; send the image's bytes as a data URL"
            " (data:image/png;base64,...)"
        )
    if not url.startswith(_DATA_URL) or ";base64," not in url[:100]:
        raise InvalidArgument(f"{where}: an image is a base64 data URL (data:image/png;base64,...)")
    return base64_bytes(url[url.index(";base64,") + len(";base64,") :], where)


def base64_bytes(encoded: str, where: str) -> bytes:
    """The bytes of an image sent as base64 text; ImageError, naming `where`, for text that is not
    base64 or an image over `MAX_IMAGE_BYTES`."""
    if len(encoded) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise ImageError(f"{where}: the image is over {MAX_IMAGE_BYTES:,} bytes")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: the image's base64 is damaged") from None
