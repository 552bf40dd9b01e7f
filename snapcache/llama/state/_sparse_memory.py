"""Large buffers for assembled blobs: zero-filled ones partly left zero (a whole state's sliding
window padded), and ones written whole from several threads (a blob assembled from blocks).

A padded window blob (see `llama._state_layout.pad_window`) holds up to 255 masked cells in front
of the window, whose rows stay zero: in every transposed V row the window's cells follow a run of
zeros. (Padding once reached back to position 0: 164 MiB for 9,344 Gemma-3 tokens, of which the
window's own rows were 7.5 MiB.)

numpy asks for transparent huge pages on allocations of 4 MiB and more. For a buffer written here
and there that is the slow choice: each first write into a 2 MiB range makes the kernel find (and,
on a fragmented machine, compact memory for) a huge page and zero all of it, which made padding
from position 0 in a new process several times slower than with 4 KiB pages, and uneven
(bench_restart.py measures the whole restore). So `sparse_zeros` maps its own memory and declines
huge pages, and `populate_for_reading` maps the zero pages llama.cpp is about to read in one call
(Linux 5.14+), rather than one page fault at a time. Elsewhere both fall back to what numpy does.

A blob assembled from blocks is the opposite case: every byte is written, by the codec's threads
at once. `empty_in_pieces` gives it on huge pages, with the calls that map it a few MiB at a time,
which those threads make between their writes (until 2026-11-23 the first thread mapped all of it
in one call while the other waited for the blob's layout). A padded window goes in whole, its zero
rows written like the rest: at most 255 cells' worth, where `sparse_zeros` (until 2026-11-23) had
those threads fault the whole blob in 4 KiB at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import sys
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["empty_in_pieces", "populate_for_reading", "sparse_zeros"]

# madvise(2) advice that Python's mmap module does not name on every version.
_MADV_POPULATE_READ = 22
_MADV_POPULATE_WRITE = 23
# numpy asks for huge pages from this size on.
_HUGE_PAGE_ALLOCATION = 4 << 20
# `empty_in_pieces` maps its buffer in calls of this many bytes (two huge pages).
_MAPPING_PIECE_BYTES = 4 << 20
_LINUX = sys.platform == "linux"


def sparse_zeros(size: int) -> npt.NDArray[np.uint8]:
    """`size` zero bytes whose pages the system provides (4 KiB at a time) when first touched."""
    memory = _anonymous_map(size)
    if memory is None:
        return np.zeros(size, dtype=np.uint8)  # Windows, or nothing to map
    no_huge_pages = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if no_huge_pages is not None:
        with contextlib.suppress(OSError):
            memory.madvise(no_huge_pages)
    return np.frombuffer(memory, dtype=np.uint8)


def populate_for_reading(array: npt.NDArray[np.uint8]) -> None:
    """Map every page of a `sparse_zeros` buffer now (the untouched ones to the zero page), so that
    reading it all does not fault page by page. Does nothing where the system cannot."""
    base = array.base
    memory = base.obj if isinstance(base, memoryview) else base
    if not _LINUX or not isinstance(memory, mmap.mmap):
        return
    with contextlib.suppress(OSError, ValueError):  # kernels before 5.14: EINVAL
        memory.madvise(_MADV_POPULATE_READ)


def empty_in_pieces(size: int) -> tuple[npt.NDArray[np.uint8], list[Callable[[], None]]]:
    """`size` bytes, every one of which the caller writes, and the calls that map them ahead of those
    writes, a few MiB each, on huge pages where the system gives them.

    Threads that fill the buffer at once should make the calls between their writes: mapped ahead,
    they do not fault on the same pages (blocks placed from two threads took up to several times
    the CPU when they did), and shared, the mapping takes them half the time. Each call lets other
    threads run; a write to a page not mapped yet maps it as usual, so the calls only save time.
    Below numpy's huge-page size, or where the system cannot map ahead, what numpy gives (often
    memory that malloc reuses) and no calls."""
    populate = _madvise() if size >= _HUGE_PAGE_ALLOCATION else None
    memory = None if populate is None else _anonymous_map(size)
    if memory is None or populate is None:
        return np.empty(size, dtype=np.uint8), []
    huge_pages = getattr(mmap, "MADV_HUGEPAGE", None)
    if huge_pages is not None:
        with contextlib.suppress(OSError, ValueError):
            memory.madvise(huge_pages)
    buffer = np.frombuffer(memory, dtype=np.uint8)
    return buffer, [
        functools.partial(_map_ahead, populate, buffer, start, min(_MAPPING_PIECE_BYTES, size - start))
        for start in range(0, size, _MAPPING_PIECE_BYTES)
    ]


def _map_ahead(
    populate: Callable[[int, int, int], int], buffer: npt.NDArray[np.uint8], start: int, length: int
) -> None:
    """Map `length` bytes of `buffer` from `start` for writing; kernels before 5.14 refuse (EINVAL),
    and the writes then map them."""
    populate(buffer.ctypes.data + start, length, _MADV_POPULATE_WRITE)


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """The C library's madvise(2), which (unlike `mmap.madvise`) lets other threads run while the
    kernel maps pages; None where there is none."""
    if not _LINUX:
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _anonymous_map(size: int) -> mmap.mmap | None:
    """`size` bytes of private anonymous memory, or None where the system cannot map them."""
    flags = getattr(mmap, "MAP_PRIVATE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if size <= 0 or flags is None or anonymous is None:
        return None
    try:
        return mmap.mmap(-1, size, flags=flags | anonymous)
    except (OSError, ValueError, OverflowError):
        return None
