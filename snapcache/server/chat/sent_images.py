"""The images a chat request sends, held beside its text until the model's chat handler reads them.

Each dialect takes images as its clients send them (a data URL, or base64 with a media type) and
checks them where they stand, so that a 400 names the field: an http(s) URL (the server fetches
nothing), text that is not base64, bytes that are no image mtmd decodes, an image over
`MAX_IMAGE_BYTES` or `MAX_IMAGE_PIXELS`. An image taken leaves a marker in its message's text, new
for every request, so no text a client sends can stand for an image; the text goes through the
prompt rules and the tool formats as text. `as_image_parts` turns the rendered messages back into
OpenAI content parts (text, and each image as a data URL), which the cache hook's chat with images
reads (see `snapcache.llama.hook.media_chat`).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapcache.errors import InvalidArgument
from snapcache.llama.media.chat_images import base64_bytes, data_url_bytes
from snapcache.llama.media.image_check import check_image
from snapcache.server.error_answers import BadRequest

__all__ = ["ImagePlaces", "SentImage", "as_image_parts", "without_projector"]


@dataclass(frozen=True, slots=True)
class SentImage:
    """One image's bytes (checked: a format mtmd reads, in bounds) and the field it came in."""

    data: bytes
    format: str
    where: str


@dataclass(slots=True)
class ImagePlaces:
    """A request's images as a dialect reads them: `place` keeps one and gives the marker that
    stands where it was in its message's text."""

    marker: str = field(default_factory=lambda: f"<snapcache-image-{secrets.token_hex(8)}>")
    images: list[SentImage] = field(default_factory=list)

    def place(self, data: bytes, where: str) -> str:
        """Keep the image in `data` (BadRequest naming `where` where it is none) and give its marker."""
        try:
            checked = check_image(data)
        except InvalidArgument as exc:
            raise BadRequest(f"{where}: {exc}", param=where) from None
        self.images.append(SentImage(data, checked.format, where))
        return self.marker

    def place_data_url(self, url: object, where: str) -> str:
        """`place` of the image a data URL holds (an http(s) URL is a BadRequest: send the bytes)."""
        return self.place(_bytes_of(data_url_bytes, url, where), where)

    def place_base64(self, encoded: str, where: str) -> str:
        """`place` of an image sent as base64 text."""
        return self.place(_bytes_of(base64_bytes, encoded, where), where)


def _bytes_of(decode: Callable[[Any, str], bytes], sent: Any, where: str) -> bytes:
    """`decode(sent, where)`, its InvalidArgument a BadRequest naming `where`."""
    try:
        return decode(sent, where)
    except InvalidArgument as exc:
        raise BadRequest(str(exc), param=where) from None


def without_projector(image: SentImage) -> BadRequest:
    """The 400 for an image sent to a model served without its projector, naming its field."""
    return BadRequest(
        f"{image.where}: the model is served without its projector, so it reads no images; start "
        "snapcache serve with --mmproj FILE (the model's mmproj GGUF)",
        param=image.where,
    )


def as_image_parts(
    messages: Sequence[Mapping[str, Any]], marker: str, images: Sequence[SentImage]
) -> list[dict[str, Any]]:
    """`messages` (rendered for the model's template) with each text that holds `marker` made into
    OpenAI content parts: its text, and the next of `images` as a data URL where each marker
    stands. BadRequest where the markers are not one for each image (a `--normalize` rule deleted
    one)."""
    pending = list(images)
    parted: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or marker not in content:
            parted.append(dict(message))
            continue
        texts = content.split(marker)
        parts: list[dict[str, Any]] = [{"type": "text", "text": texts[0]}] if texts[0] else []
        for text in texts[1:]:
            if not pending:
                break
            parts.append({"type": "image_url", "image_url": {"url": _data_url(pending.pop(0))}})
            if text:
                parts.append({"type": "text", "text": text})
        parted.append({**message, "content": parts})
    if pending or sum(_count(m, marker) for m in messages) != len(images):
        raise BadRequest(
            "the request's images and their places in its text do not match (a --normalize rule may "
            "have deleted a place)",
            param="messages",
        )
    return parted


def _data_url(image: SentImage) -> str:
    return f"data:image/{image.format};base64,{base64.b64encode(image.data).decode('ascii')}"


def _count(message: Mapping[str, Any], marker: str) -> int:
    content = message.get("content")
    return content.count(marker) if isinstance(content, str) else 0
