"""The checked envelope: a head written and read back, and each kind of damage or foreign
configuration refused the one way it should be."""

from __future__ import annotations

import io

import pytest

from snapcache.errors import CorruptSnapshot, SnapcacheError
from snapcache.formats.envelope import FLAG_MAC, PRELUDE, Envelope, MacMismatch, mac_key


class Damaged(SnapcacheError, ValueError):
    """What the test format raises for damage."""


TEST = Envelope(b"\x89TESTX\r\n", (4, 5), 1 << 10, "test", damaged=Damaged)
HEADER = {"name": "value", "size": 12}
SECRET = mac_key(b"a secret")


def head(mac_secret: bytes | None = None, version: int = 5) -> bytes:
    return TEST.head(version, HEADER, mac_secret)


@pytest.mark.parametrize("mac_secret", [None, SECRET])
def test_a_head_reads_back_with_its_header_and_where_its_body_starts(mac_secret: bytes | None) -> None:
    data = head(mac_secret) + b"body"
    checked = TEST.check(data, mac_secret)
    assert checked.header == HEADER
    assert checked.version == 5
    assert checked.has_mac == (mac_secret is not None)
    assert checked.mac_problem is None
    assert data[checked.body_start :] == b"body"
    file = io.BytesIO(data)
    assert TEST.read(file, mac_secret) == checked
    assert file.read() == b"body"  # read stops at the end of the head


def test_the_flag_and_the_mac_are_there_only_with_a_secret() -> None:
    plain, signed = head(), head(SECRET)
    assert PRELUDE.unpack_from(plain)[2] == 0
    assert PRELUDE.unpack_from(signed)[2] == FLAG_MAC
    assert len(signed) == len(plain) + 32


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d[:10], "shorter than its prelude"),
        (lambda d: b"\x89OTHER\r\n" + d[8:], "bad magic"),
        (lambda d: d[:8] + (3).to_bytes(2, "little") + d[10:], "unsupported test format version 3"),
        (lambda d: d[:10] + (6).to_bytes(2, "little") + d[12:], "unknown test file flags 0x6"),
        (lambda d: d[:12] + (2048).to_bytes(4, "little") + d[16:], "header length 2048 exceeds 1024"),
        (lambda d: d[:-5], "truncated inside its header"),
        (lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "header checksum mismatch"),
    ],
)
def test_damage_raises_the_formats_error(edit: object, message: str) -> None:
    data = edit(head())  # type: ignore[operator]
    with pytest.raises(Damaged, match=message):
        TEST.check(data, None)


@pytest.mark.parametrize(
    ("written", "reader", "problem"),
    [
        (SECRET, None, "authenticated with a secret, and none is configured"),
        (None, SECRET, "carries no MAC, and a secret is configured"),
        (mac_key(b"another"), SECRET, "MAC mismatch"),
    ],
)
def test_a_mac_that_does_not_verify_is_reported_or_refused(
    written: bytes | None, reader: bytes | None, problem: str
) -> None:
    data = head(written)
    checked = TEST.check(data, reader)
    assert checked.mac_problem is not None
    assert problem in checked.mac_problem
    assert checked.header == HEADER  # intact: another configuration, not damage
    with pytest.raises(MacMismatch, match=problem):
        TEST.check(data, reader, refuse=MacMismatch)
    assert issubclass(MacMismatch, CorruptSnapshot)


def test_fields_are_checked_with_the_formats_error() -> None:
    assert TEST.field({"a": 1}, "a", int) == 1
    with pytest.raises(Damaged, match="'a' is missing or malformed"):
        TEST.field({"a": True}, "a", int)  # JSON's true is no integer
    with pytest.raises(Damaged, match=r"outside 0\.\.10"):
        TEST.bounded({"a": 11}, "a", 10)
    assert TEST.digest_field({"d": "ab" * 16}, "d", 16) == b"\xab" * 16
    with pytest.raises(Damaged, match="16-byte digest"):
        TEST.digest_field({"d": "zz" * 16}, "d", 16)


def test_a_header_over_the_limit_is_not_written() -> None:
    with pytest.raises(Damaged, match="would exceed 1024 bytes"):
        TEST.head(5, {"big": "x" * 2000}, None, too_large=Damaged)
