"""The images a chat request sends, held beside its text until the model's chat handler reads them.

Each dialect takes images as its clients send them (a data URL, or base64 with a media type) and
checks them where they stand, so that a 400 names the field: an http(s) URL (the server fetches
nothing), text that is not base64, bytes that are no image mtmd decodes, an image over
`MAX_IMAGE_BYTES` or `MAX_IMAGE_PIXELS`. An image taken leaves a marker in its message's text: a
prefix new for every request, so no text a client sends can stand for an image, and the image's
number, so that it stays itself wherever a dialect or a tool format moves its message. The text goes
through the prompt rules and the tool formats as text. `as_image_parts` turns the rendered messages
back into OpenAI content parts (text, and each image as a data URL), which the cache hook's chat with
images reads (see `snapcache.llama.hook.media_chat`), and says which image it placed where.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapcache.errors import ImageError, InvalidArgument
from snapcache.llama.media.chat_images import base64_bytes, data_url_bytes
from snapcache.llama.media.image_check import check_image
from snapcache.server.error_answers import BadRequest

__all__ = [
    "ImageParts",
    "ImagePlaces",
    "SentImage",
    "as_image_parts",
    "named_image_problem",
    "without_projector",
]


@dataclass(frozen=True, slots=True)
class SentImage:
    """One image's bytes (checked: a format mtmd reads, in bounds) and the field it came in."""

    data: bytes
    format: str
    where: str


@dataclass(slots=True)
class ImagePlaces:
    """A request's images as a dialect reads them: `place` keeps one and gives the marker that
    stands where it was in its message's text (`marker` and the image's number, then `>`)."""

    marker: str = field(default_factory=lambda: f"<snapcache-image-{secrets.token_hex(8)}-")
    images: list[SentImage] = field(default_factory=list)

    def place(self, data: bytes, where: str) -> str:
        """Keep the image in `data` (BadRequest naming `where` where it is none) and give its marker."""
        try:
            checked = check_image(data)
        except InvalidArgument as exc:
            raise BadRequest(f"{where}: {exc}", param=where) from None
        self.images.append(SentImage(data, checked.format, where))
        return f"{self.marker}{len(self.images) - 1}>"

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


@dataclass(frozen=True, slots=True)
class ImageParts:
    """Messages with images as OpenAI content parts, and the images in the order the parts hold them."""

    messages: list[dict[str, Any]]
    order: tuple[SentImage, ...]


def as_image_parts(
    messages: Sequence[Mapping[str, Any]], marker: str, images: Sequence[SentImage]
) -> ImageParts:
    """`messages` (rendered for the model's template) with each text that holds a marker made into
    OpenAI content parts: its text, and each marker's image as a data URL. BadRequest where the
    markers are not one for each image (a `--normalize` rule deleted one)."""
    place = re.compile(re.escape(marker) + r"(\d+)>")
    order: list[int] = []
    parted: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or marker not in content:
            parted.append(dict(message))
            continue
        pieces = place.split(content)  # text, number, text, number, ..., text
        parts: list[dict[str, Any]] = [{"type": "text", "text": pieces[0]}] if pieces[0] else []
        for number, text in zip(map(int, pieces[1::2]), pieces[2::2], strict=True):
            if number >= len(images) or number in order:
                raise _lost_places()
            order.append(number)
            parts.append({"type": "image_url", "image_url": {"url": _data_url(images[number])}})
            if text:
                parts.append({"type": "text", "text": text})
        parted.append({**message, "content": parts})
    if len(order) != len(images):
        raise _lost_places()
    return ImageParts(parted, tuple(images[number] for number in order))


def named_image_problem(exc: ImageError, order: tuple[SentImage, ...]) -> Exception:
    """The BadRequest naming the field of the image the hook could not decode (`order`: the images
    as the hook's chat held them, `exc.image` its number there); `exc` itself where it names none."""
    if exc.image is None or exc.image >= len(order):
        return exc
    where = order[exc.image].where
    return BadRequest(f"{where}: {exc}", param=where)


def _lost_places() -> BadRequest:
    return BadRequest(
        "the request's images and their places in its text do not match (a --normalize rule may have "
        "deleted or repeated a place)",
        param="messages",
    )


def _data_url(image: SentImage) -> str:
    return f"data:image/{image.format};base64,{base64.b64encode(image.data).decode('ascii')}"
