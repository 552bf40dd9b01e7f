"""The codec: blosc2 chunks (and format 1's zstd frames); never trusts a chunk or frame it is given."""

from __future__ import annotations

import contextlib

import blosc2
import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from snapcache.errors import CorruptSnapshot, InvalidArgument, SnapcacheError
from snapcache.formats import codec


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
    out = codec.decompress(payload, expected_size=len(data))
    assert bytes(out) == data
    assert out.readonly


@pytest.mark.parametrize("level", [codec.MIN_LEVEL, 1, 3, codec.MAX_LEVEL])
def test_round_trip_at_levels(level: int) -> None:
    data = f16_kv_like(64 * 500, seed=level + 10)
    out = codec.decompress(codec.compress(data, level=level), expected_size=len(data))
    assert bytes(out) == data


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_round_trip_with_threads(threads: int) -> None:
    data = f16_kv_like(64 * 40_000)  # 5 MB: many blosc2 blocks
    payload = codec.compress(data, threads=threads)
    assert bytes(codec.decompress(payload, expected_size=len(data), threads=threads)) == data


def test_round_trip_of_memoryview_and_bytearray() -> None:
    data = bytearray(f16_kv_like(64 * 100))
    payload = codec.compress(memoryview(data)[1:], shuffle=True)
    assert bytes(codec.decompress(payload, expected_size=len(data) - 1)) == data[1:]


def test_several_chunks_decode_into_one_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "CHUNK_BYTES", 10_000)
    data = f16_kv_like(64 * 400)[:-3]  # 51,197 bytes: five full chunks and a short one
    payload = codec.compress(data)
    assert _chunk_sizes(payload) == [10_000] * 5 + [1_197]
    out = bytearray(len(data))
    codec.decompress_into(payload, out)
    assert out == data


def test_shuffle_makes_f16_data_smaller() -> None:
    data = f16_kv_like(64 * 4000)
    plain = codec.compress(data, shuffle=False)
    shuffled = codec.compress(data, shuffle=True)
    assert len(shuffled) < len(plain) < len(data)


def test_decompress_into_needs_a_writable_buffer() -> None:
    payload = codec.compress(b"abcd")
    with pytest.raises(InvalidArgument):
        codec.decompress_into(payload, b"\0" * 4)


# -- chunks that lie: blosc2 writes what a chunk header declares, whatever the buffer's size --------


def _chunk_sizes(payload: bytes) -> list[int]:
    sizes, position = [], 0
    while position < len(payload):
        nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(payload[position:])
        sizes.append(nbytes)
        position += cbytes
    return sizes


def _with_int32(payload: bytes, offset: int, value: int) -> bytes:
    forged = bytearray(payload)
    forged[offset : offset + 4] = value.to_bytes(4, "little", signed=True)
    return bytes(forged)


@pytest.mark.parametrize("declared", [10_000 + 1, 20_000, 1 << 30, 9_999, 0, -1])
def test_refuses_a_chunk_that_declares_another_state_size(declared: int) -> None:
    data = f16_kv_like(64 * 100)[:10_000]
    forged = _with_int32(codec.compress(data), 4, declared)  # the chunk's uncompressed size
    guard = np.full(len(data) + 64, 0xAA, dtype=np.uint8)
    with pytest.raises(CorruptSnapshot, match="declares"):
        codec.decompress_into(forged, guard[: len(data)].data)
    assert (guard[len(data) :] == 0xAA).all()  # nothing written past the buffer


@pytest.mark.parametrize("declared", ["longer than the payload", "shorter than its header", "negative"])
def test_refuses_a_chunk_that_declares_another_length(declared: str) -> None:
    data = f16_kv_like(64 * 1000)
    payload = codec.compress(data)
    value = {"longer than the payload": len(payload) + 1, "shorter than its header": 16, "negative": -5}
    forged = _with_int32(payload, 12, value[declared])  # the chunk's compressed length
    with pytest.raises(CorruptSnapshot):
        codec.decompress(forged, expected_size=len(data))


def test_refuses_a_chunk_that_leaves_the_buffer_uninitialized() -> None:
    forged = bytearray(codec.compress(bytes(1000)))  # all zeros: a 32-byte special chunk
    forged[31] = (forged[31] & 0x8F) | 0x40  # the special value "uninitialized"
    with pytest.raises(CorruptSnapshot, match="uninitialized"):
        codec.decompress(bytes(forged), expected_size=1000)


def test_refuses_a_blosc1_buffer() -> None:
    forged = bytearray(codec.compress(f16_kv_like(64 * 100)))
    forged[0] = 2
    with pytest.raises(CorruptSnapshot, match="not a blosc2 chunk"):
        codec.decompress(bytes(forged), expected_size=64 * 100 * 2)


@pytest.mark.parametrize(
    "damage",
    ["flip header", "truncate", "truncate header", "append chunk", "append garbage", "garbage", "empty"],
)
def test_corrupt_input_raises(damage: str) -> None:
    # A flip inside the compressed data may decode to other bytes: the file's digest catches those.
    data = f16_kv_like(64 * 2000)
    payload = bytearray(codec.compress(data, shuffle=True))
    if damage == "flip header":
        payload[8] ^= 0x40
    elif damage == "truncate":
        del payload[-100:]
    elif damage == "truncate header":
        del payload[20:]
    elif damage == "append chunk":
        payload += codec.compress(b"more", shuffle=False)
    elif damage == "append garbage":
        payload += b"\x00\x01"
    elif damage == "garbage":
        payload = bytearray(np.random.default_rng(2).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    else:
        payload = bytearray()
    with pytest.raises(CorruptSnapshot) as info:
        codec.decompress(bytes(payload), expected_size=len(data))
    assert isinstance(info.value, SnapcacheError)
    assert isinstance(info.value, ValueError)


@given(st.binary(max_size=300))
def test_hostile_bytes_never_escape_as_another_error(data: bytes) -> None:
    guard = np.full(4096 + 64, 0xAA, dtype=np.uint8)
    # Raw bytes, and bytes behind a chunk header's first 8 bytes that declare the right state size.
    for payload in (data, codec.compress(bytes(4096))[:8] + data):
        with contextlib.suppress(CorruptSnapshot):
            codec.decompress_into(payload, guard[:4096].data)
    assert (guard[4096:] == 0xAA).all()


@pytest.mark.parametrize("level", [0.5, True, codec.MAX_LEVEL + 1, codec.MIN_LEVEL - 1, "3"])
def test_invalid_level(level: object) -> None:
    with pytest.raises(InvalidArgument):
        codec.compress(b"abc", level=level)  # type: ignore[arg-type]


# -- format 1: one zstd frame of the numpy-shuffled state ---------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_zstd_frame_round_trip(name: str, shuffle: bool) -> None:
    data = CASES[name]
    payload = codec.compress_zstd_frame(data, shuffle=shuffle)
    out = codec.decompress_zstd_frame(payload, expected_size=len(data), shuffle=shuffle)
    assert bytes(out) == data


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


def test_refuses_a_frame_that_expands_beyond_the_expected_size() -> None:
    payload = codec.compress_zstd_frame(bytes(1_000_000), shuffle=False)
    with pytest.raises(CorruptSnapshot, match="declares 1000000 bytes"):
        codec.decompress_zstd_frame(payload, expected_size=1_000, shuffle=False)


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
        codec.decompress_zstd_frame(payload, expected_size=4096, shuffle=False)


def test_refuses_a_frame_whose_declared_size_lies() -> None:
    good = codec.compress_zstd_frame(b"a" * 5000 + b"b" * 5000, shuffle=False)
    # Lower the declared content size in the frame header (1-byte descriptor, then the size field).
    params = zstandard.get_frame_parameters(good)
    assert params.content_size == 10_000
    header_size = zstandard.frame_header_size(good)
    forged = bytearray(good)
    size_field = forged[header_size - 2 : header_size]
    assert int.from_bytes(size_field, "little") + 256 == 10_000  # 2-byte field stores size - 256
    forged[header_size - 2 : header_size] = (4000 - 256).to_bytes(2, "little")
    with pytest.raises(CorruptSnapshot):
        codec.decompress_zstd_frame(bytes(forged), expected_size=4000, shuffle=False)


def test_refuses_a_frame_without_checksum() -> None:
    payload = zstandard.ZstdCompressor(write_checksum=False).compress(b"x" * 1000)
    with pytest.raises(CorruptSnapshot, match="checksum"):
        codec.decompress_zstd_frame(payload, expected_size=1000, shuffle=False)


@pytest.mark.parametrize(
    "damage",
    ["flip middle", "flip checksum", "truncate", "append frame", "append garbage", "garbage", "empty"],
)
def test_corrupt_frame_raises(damage: str) -> None:
    data = f16_kv_like(64 * 2000)
    payload = bytearray(codec.compress_zstd_frame(data, shuffle=True))
    if damage == "flip middle":
        payload[len(payload) // 2] ^= 0x10
    elif damage == "flip checksum":
        payload[-1] ^= 0x01
    elif damage == "truncate":
        del payload[-100:]
    elif damage == "append frame":
        payload += codec.compress_zstd_frame(b"more", shuffle=False)
    elif damage == "append garbage":
        payload += b"\x00\x01"
    elif damage == "garbage":
        payload = bytearray(np.random.default_rng(2).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    else:
        payload = bytearray()
    with pytest.raises(CorruptSnapshot):
        codec.decompress_zstd_frame(bytes(payload), expected_size=len(data), shuffle=True)


class _Sink:
    """A write-only file for zstandard's stream writer that keeps what it gets."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def data(self) -> bytes:
        return b"".join(self._chunks)


_EXIT_AT_ONCE = """
import atexit
import sys
import threading
sys.path[:0] = [sys.argv[1]]
atexit.register(lambda: print([t.name for t in threading.enumerate() if t.name.startswith("snapcache")]))
import snapcache.formats.codec
"""


def test_a_process_that_ends_at_once_does_not_leave_the_background_import_running() -> None:
    # Python ends daemon threads at exit wherever they are, and one ended inside the C++ of an
    # extension's import aborts the process. The import thread must be done before exit handlers run.
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_AT_ONCE, repo], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]", done.stderr
