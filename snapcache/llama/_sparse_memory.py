"""Large buffers for assembled blobs: zero-filled ones partly left zero (a padded sliding-window
blob), and ones written whole from several threads.

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
at once. `populated_empty` maps all of it, on huge pages, in one call before they start.
"""

from __future__ import annotations

import contextlib
import mmap
import sys

import numpy as np
import numpy.typing as npt

__all__ = ["populate_for_reading", "populated_empty", "sparse_zeros"]

# madvise(2) advice that Python's mmap module does not name on every version.
_MADV_POPULATE_READ = 22
_MADV_POPULATE_WRITE = 23
# numpy asks for huge pages from this size on.
_HUGE_PAGE_ALLOCATION = 4 << 20
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


def populated_empty(size: int) -> npt.NDArray[np.uint8]:
    """`size` bytes, every one of which the caller writes: mapped now, on huge pages where the system
    gives them, so that threads filling it at once do not fault on the same pages (blocks placed
    from two threads took up to several times the CPU when they did).
    Below numpy's huge-page size, what numpy gives (often memory that malloc reuses)."""
    memory = _anonymous_map(size) if _LINUX and size >= _HUGE_PAGE_ALLOCATION else None
    if memory is None:
        return np.empty(size, dtype=np.uint8)
    huge_pages = getattr(mmap, "MADV_HUGEPAGE", None)
    with contextlib.suppress(OSError, ValueError):
        if huge_pages is not None:
            memory.madvise(huge_pages)
        memory.madvise(_MADV_POPULATE_WRITE)
    return np.frombuffer(memory, dtype=np.uint8)


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
