"""`parse_body`: what every checked route reads as its JSON body, and the bodies it refuses."""

from __future__ import annotations

import pytest

from snapcache.server.checks import parse_body
from snapcache.server.error_answers import BadRequest


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"temperature": NaN}', "NaN is not a JSON number"),
        (b'{"temperature": 1e400}', "1e400, a number too large for a float"),
        (b'{"options": {"presence_penalty": -1e400}}', "-1e400, a number too large"),
        (b"[1, 2]", "must be a JSON object"),
        (b"", "empty"),
    ],
    ids=["NaN", "an overflowing number", "a nested one, negative", "an array", "nothing"],
)
def test_bodies_no_route_can_use_are_bad_requests(body: bytes, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        parse_body(body)


def test_numbers_a_float_holds_and_integers_of_any_size_are_read() -> None:
    document = parse_body(b'{"t": 1.5e300, "p": -0.0, "seed": 123456789012345678901234567890}')
    assert document == {"t": 1.5e300, "p": -0.0, "seed": 123456789012345678901234567890}
