"""A request's images and their places in its text (`sent_images`): each image keeps its own place
wherever a dialect or a tool format moves its message, and a place lost or repeated is a 400."""

from __future__ import annotations

import base64

import pytest
from image_files import picture, png

from snapcache.server.chat.sent_images import ImagePlaces, as_image_parts
from snapcache.server.error_answers import BadRequest


def placed(count: int) -> tuple[ImagePlaces, list[str]]:
    places = ImagePlaces()
    markers = [places.place(png(picture(k, 8, 8)), f"messages.{k}") for k in range(count)]
    return places, markers


def image_bytes(part: dict[str, object]) -> bytes:
    url = part["image_url"]["url"]  # type: ignore[index]
    return base64.b64decode(url.split(",", 1)[1])


def test_each_image_stays_at_its_own_place_when_messages_are_reordered() -> None:
    places, (first, second) = placed(2)
    # As Anthropic's translation does: a tool result (holding the second image) goes first.
    rendered = [
        {"role": "tool", "content": f"result\n{second}"},
        {"role": "user", "content": f"{first}\nClick OK."},
    ]
    parts = as_image_parts(rendered, places.marker, places.images)
    tool, user = parts.messages
    assert tool["content"][0] == {"type": "text", "text": "result\n"}
    assert image_bytes(tool["content"][1]) == places.images[1].data
    assert image_bytes(user["content"][0]) == places.images[0].data
    assert user["content"][1] == {"type": "text", "text": "\nClick OK."}
    assert [image.where for image in parts.order] == ["messages.1", "messages.0"]


def test_text_without_images_stays_text() -> None:
    places, [marker] = placed(1)
    rendered = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": marker}]
    parts = as_image_parts(rendered, places.marker, places.images)
    assert parts.messages[0] == {"role": "system", "content": "Be brief."}
    assert len(parts.messages[1]["content"]) == 1


@pytest.mark.parametrize("change", ["deleted", "repeated", "forged"])
def test_a_place_lost_repeated_or_made_up_is_a_bad_request(change: str) -> None:
    places, (first, second) = placed(2)
    text = {
        "deleted": f"{first} and nothing",
        "repeated": f"{first}{first}{second}",
        "forged": f"{first}{second}{places.marker}7>",
    }[change]
    with pytest.raises(BadRequest, match="places in its text do not match"):
        as_image_parts([{"role": "user", "content": text}], places.marker, places.images)


def test_markers_are_new_for_every_request() -> None:
    assert ImagePlaces().marker != ImagePlaces().marker
