"""The codec: zstd frames with an optional 2-byte shuffle; never trusts a frame it is given."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from snapcache import codec
from snapcache.errors import CorruptSnapshot, InvalidArgument, SnapcacheError


def f16_kv_like(n_values: int, seed: int = 0) -> bytes:
    """Smooth f16 values, shaped like KV rows: what the shuffle is for."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n_values // 64, 64)) * np.linspace(0.1, 2.0, 64)
    return rows.astype(np.float16).tobytes()


CASES = {
    "empty": b"",
    "one byte": b"\x07",
    "odd length": bytes(range(255)) * 3 + b"\x01",
    "random": np.random.default_rng(1).integers(0, 256, 100_001, dtype=np.uint8).tobytes(),
    "zeros": bytes(70_000),
    "f16 kv": f16_kv_like(64 * 1000),
}


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_round_trip(name: str, shuffle: bool) -> None:
    data = CASES[name]
    payload = codec.compress(data, shuffle=shuffle)
    out = codec.decompress(payload, expected_size=len(data), shuffle=shuffle)
    assert bytes(out) == data


@pytest.mark.parametrize("level", [codec.MIN_LEVEL, 1, 3, 9])
def test_round_trip_at_levels(level: int) -> None:
    data = f16_kv_like(64 * 500, seed=level + 10)
    out = codec.decompress(codec.compress(data, level=level), expected_size=len(data), shuffle=True)
    assert bytes(out) == data


def test_round_trip_of_memoryview_and_bytearray() -> None:
    data = bytearray(f16_kv_like(64 * 100))
    payload = codec.compress(memoryview(data)[1:], shuffle=True)
    assert bytes(codec.decompress(payload, expected_size=len(data) - 1, shuffle=True)) == data[1:]


def test_shuffle_layout_puts_low_bytes_first_and_keeps_trailing_byte() -> None:
    data = bytes([1, 2, 3, 4, 5, 6, 7])
    assert bytes(codec.shuffle2(data)) == bytes([1, 3, 5, 2, 4, 6, 7])
    out = bytearray(len(data))
    codec.unshuffle2_into(codec.shuffle2(data), out)
    assert bytes(out) == data


@given(st.binary(max_size=2_000))
def test_shuffle_is_invertible(data: bytes) -> None:
    out = bytearray(len(data))
    codec.unshuffle2_into(codec.shuffle2(data), out)
    assert bytes(out) == data


def test_shuffle_makes_f16_data_smaller() -> None:
    data = f16_kv_like(64 * 4000)
    plain = codec.compress(data, shuffle=False)
    shuffled = codec.compress(data, shuffle=True)
    assert len(shuffled) < len(plain) < len(data)


def test_threaded_compression_round_trips() -> None:
    data = f16_kv_like(64 * 40_000)  # 5 MB: several zstd jobs
    payload = codec.compress(data, shuffle=True, threads=2)
    assert zstandard.get_frame_parameters(payload).content_size == len(data)
    assert bytes(codec.decompress(payload, expected_size=len(data), shuffle=True)) == data


def test_refuses_a_frame_that_expands_beyond_the_expected_size() -> None:
    payload = codec.compress(bytes(1_000_000), shuffle=False)
    with pytest.raises(CorruptSnapshot, match="declares 1000000 bytes"):
        codec.decompress(payload, expected_size=1_000, shuffle=False)


def test_refuses_a_frame_without_declared_size_before_decoding() -> None:
    # A 100 MB bomb that does not declare its size: refused from the header alone.
    bomb = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True)
    sink = _Sink()
    with bomb.stream_writer(sink, closefd=False) as writer:
        for _ in range(100):
            writer.write(bytes(1 << 20))
    payload = sink.data()
    assert len(payload) < 100_000
    with pytest.raises(CorruptSnapshot):
        codec.decompress(payload, expected_size=4096, shuffle=False)


def test_refuses_a_frame_whose_declared_size_lies() -> None:
    good = codec.compress(b"a" * 5000 + b"b" * 5000, shuffle=False)
    # Lower the declared content size in the frame header (1-byte descriptor, then the size field).
    params = zstandard.get_frame_parameters(good)
    assert params.content_size == 10_000
    header_size = zstandard.frame_header_size(good)
    forged = bytearray(good)
    size_field = forged[header_size - 2 : header_size]
    assert int.from_bytes(size_field, "little") + 256 == 10_000  # 2-byte field stores size - 256
    forged[header_size - 2 : header_size] = (4000 - 256).to_bytes(2, "little")
    with pytest.raises(CorruptSnapshot):
        codec.decompress(bytes(forged), expected_size=4000, shuffle=False)


def test_refuses_a_frame_without_checksum() -> None:
    payload = zstandard.ZstdCompressor(write_checksum=False).compress(b"x" * 1000)
    with pytest.raises(CorruptSnapshot, match="checksum"):
        codec.decompress(payload, expected_size=1000, shuffle=False)


@pytest.mark.parametrize(
    "damage",
    ["flip middle", "flip checksum", "truncate", "append frame", "append garbage", "garbage", "empty"],
)
def test_corrupt_input_raises(damage: str) -> None:
    data = f16_kv_like(64 * 2000)
    payload = bytearray(codec.compress(data, shuffle=True))
    if damage == "flip middle":
        payload[len(payload) // 2] ^= 0x10
    elif damage == "flip checksum":
        payload[-1] ^= 0x01
    elif damage == "truncate":
        del payload[-100:]
    elif damage == "append frame":
        payload += codec.compress(b"more", shuffle=False)
    elif damage == "append garbage":
        payload += b"\x00\x01"
    elif damage == "garbage":
        payload = bytearray(np.random.default_rng(2).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    else:
        payload = bytearray()
    with pytest.raises(CorruptSnapshot) as info:
        codec.decompress(bytes(payload), expected_size=len(data), shuffle=True)
    assert isinstance(info.value, SnapcacheError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("level", [0.5, True, codec.MAX_LEVEL + 1, codec.MIN_LEVEL - 1, "3"])
def test_invalid_level(level: object) -> None:
    with pytest.raises(InvalidArgument):
        codec.compress(b"abc", level=level)  # type: ignore[arg-type]


class _Sink:
    """A write-only file for zstandard's stream writer that keeps what it gets."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def data(self) -> bytes:
        return b"".join(self._chunks)
