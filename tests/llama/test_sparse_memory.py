"""The buffers assembled blobs are built in: zero-filled ones for a padded sliding window, and ones
mapped ahead, a piece at a time, for a blob written whole."""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from snapcache.llama.state._sparse_memory import empty_in_pieces, populate_for_reading, sparse_zeros


def _smaps_field(address: int, name: str) -> list[str]:
    """The values of field `name` in /proc/self/smaps for the mapping that holds `address` (Linux)."""
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        inside = False
        for line in smaps:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and line.startswith(f"{name}:"):
                return line.split()[1:]
    raise AssertionError("no mapping holds the buffer")


def _vm_flags(address: int) -> list[str]:
    return _smaps_field(address, "VmFlags")


def _resident_bytes(address: int) -> int:
    return int(_smaps_field(address, "Rss")[0]) << 10


def _kernel_maps_ahead() -> bool:
    """Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14 and later)."""
    version = re.match(r"(\d+)\.(\d+)", platform.release())
    return version is not None and (int(version[1]), int(version[2])) >= (5, 14)


@pytest.mark.skipif(
    sys.platform != "linux" or not _kernel_maps_ahead(), reason="maps ahead on Linux 5.14 and later"
)
def test_a_buffer_in_pieces_is_mapped_by_its_calls_a_piece_at_a_time():
    size = (10 << 20) + 123
    buffer, mapping = empty_in_pieces(size)
    assert buffer.shape == (size,)
    assert buffer.flags.writeable
    assert len(mapping) == 3  # 4 MiB each, the last one shorter
    address = buffer.ctypes.data
    assert _resident_bytes(address) == 0
    mapping[1]()  # bytes 4 MiB to 8 MiB: at most the two huge pages on either side come with them
    assert 4 << 20 <= _resident_bytes(address) <= 8 << 20
    for call in mapping:
        call()
    assert _resident_bytes(address) >= size - 4096
    buffer[:] = 9  # writable all through, and as written
    assert int(buffer.min()) == int(buffer.max()) == 9


def test_a_small_buffer_in_pieces_needs_no_calls():
    buffer, mapping = empty_in_pieces(1000)
    assert buffer.shape == (1000,)
    assert mapping == []


def test_a_sparse_buffer_is_zero_writable_and_stays_as_written_when_populated():
    size = (8 << 20) + 123
    buffer = sparse_zeros(size)
    assert buffer.shape == (size,)
    assert buffer.dtype == np.uint8
    assert not buffer.any()
    written = [0, 4095, 4096, 5 << 20, size - 1]
    buffer[written] = 7
    populate_for_reading(buffer)
    assert np.flatnonzero(buffer).tolist() == written
    assert set(buffer[written].tolist()) == {7}


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage").is_dir(), reason="a system without transparent huge pages"
)
def test_a_sparse_buffer_declines_huge_pages():
    buffer = sparse_zeros(16 << 20)
    assert "nh" in _vm_flags(buffer.ctypes.data)
    dense = np.zeros(16 << 20, dtype=np.uint8)  # what numpy gives: no such advice
    assert "nh" not in _vm_flags(dense.ctypes.data)


def test_populating_an_ordinary_array_does_nothing():
    array = np.arange(10, dtype=np.uint8)
    populate_for_reading(array)
    assert array.tolist() == list(range(10))
