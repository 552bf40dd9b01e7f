"""One reused, pre-touched buffer per Llama: captures are written into it before a save copies them
out, and restores assemble their blob in it before llama.cpp copies it in.

llama.cpp copied an 8B model's 1,024-token state (128 MiB) into a buffer it had written before in
23 ms, and into a fresh one in 80 ms (2026-11-26, 2 cores): a fresh buffer's pages fault in one by
one as llama.cpp writes them. A save copies the capture out into the buffers the store keeps, off
the request's path (`SnapshotStore.defer`), and gives the buffer back then (`release`); the next
capture on the same Llama waits for that, and the buffer grows when a larger state comes. A
restore's blob, assembled from blocks, met the same faults (a third of a restore from RAM): it is
built here too (`loan`), since a Llama never captures and restores at once.

Where the Llama keeps its K/V cache on a GPU, the buffer is pinned memory (`host_memory`): llama.cpp
copies a capture into it and a restore out of it at the bus's speed, where pageable memory goes
through the driver's bounce buffer. It needs no touching then (pinned pages are mapped when
allocated), and a restore into it may use more threads (`workers`, see `threads.wider`):
llama.cpp's own threads are idle while a GPU's restore waits for its blob. Above the pinned-memory
limit the buffer is plain memory, as on a CPU.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.formats.threads import HOST_COPY_THREADS, RESTORE_THREADS, copy_in_parallel, wider
from snapcache.llama.state.host_memory import PinnedMemory, pinned_memory_for

__all__ = ["CaptureBuffer", "Loan", "capture_buffer", "release_capture_buffer"]

# Grown a quarter beyond what a capture needs: a chat's states grow turn by turn, and each growth
# pays for fresh pages again.
_GROWTH = 1.25

_buffers: weakref.WeakKeyDictionary[Any, CaptureBuffer] = weakref.WeakKeyDictionary()
_buffers_lock = threading.Lock()


class CaptureBuffer:
    """A buffer lent to one capture at a time: `lease(size)` waits until the last one is released.
    `pinned`: where its memory comes from (see the module docstring), or None for plain memory."""

    def __init__(self, pinned: PinnedMemory | None = None) -> None:
        self._array = np.empty(0, dtype=np.uint8)
        self._lent = False
        self._free = threading.Condition(threading.Lock())
        self._pinned_from = pinned
        self._is_pinned = False

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)

    @property
    def pinned(self) -> bool:
        """Whether the buffer's memory is pinned now (it may not be: above the limit, or before its
        first use)."""
        return self._is_pinned

    @property
    def for_device(self) -> bool:
        """Whether the buffer is meant to be pinned memory: the Llama's K/V cache is on a GPU."""
        return self._pinned_from is not None

    @property
    def workers(self) -> int:
        """How many threads a restore through this buffer may use: more for a GPU's pinned memory."""
        return HOST_COPY_THREADS if self._pinned_from is not None else RESTORE_THREADS

    def holds(self, array: npt.NDArray[np.uint8]) -> bool:
        """Whether `array` lies in the buffer's memory (a blob assembled there)."""
        return self._array.nbytes > 0 and np.shares_memory(array, self._array)

    def lease(self, size: int) -> npt.NDArray[np.uint8]:
        """The first `size` bytes of the buffer (grown and touched when too small), lent until
        `release`; waits while another capture holds it."""
        with self._free:
            while self._lent:
                self._free.wait()
            self._lent = True
        return self._sized(size)

    def try_lease(self, size: int) -> npt.NDArray[np.uint8] | None:
        """`lease(size)` when the buffer is free now, else None: never waits (see `Loan`)."""
        with self._free:
            if self._lent:
                return None
            self._lent = True
        return self._sized(size)

    def _sized(self, size: int) -> npt.NDArray[np.uint8]:
        """The first `size` bytes of the buffer just lent, grown first if needed."""
        if self._array.nbytes < size:
            try:
                self._array = np.zeros(0, dtype=np.uint8)  # the old one goes before the new one comes
                self._is_pinned = False
                wanted = int(size * _GROWTH)
                pinned = None if self._pinned_from is None else self._pinned_from.allocate(wanted)
                if pinned is None:
                    grown = np.empty(wanted, dtype=np.uint8)
                    grown.fill(0)  # touched now: every page is there when llama.cpp writes
                else:
                    grown = pinned
                self._array = grown
                self._is_pinned = pinned is not None
            except BaseException:
                self.release()
                raise
        return self._array[:size]

    def holding(self, state: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.uint8], Callable[[], None]]:
        """`state` where llama.cpp copies it to a GPU fastest, and what gives that memory back: this
        buffer, `state` copied in on the threads `threads.wider` allows, when it is pinned memory
        that is free now and `state` is not in it already; else `state` itself (plain memory: a
        copy would gain nothing; or busy: a save still copies out of it)."""
        if not self.for_device or self.holds(state):
            return state, _nothing
        copy = self.try_lease(state.nbytes)
        if copy is None:
            return state, _nothing
        if not self._is_pinned:  # above the pinned-memory limit
            self.release()
            return state, _nothing
        with wider(self.workers):
            copy_in_parallel(copy, state)
        return copy, self.release

    def loan(self) -> Loan:
        """A lender of this buffer to the first assembly that asks (see `assembly.Assembly`)."""
        return Loan(self)

    def release(self) -> None:
        """The capture written into the buffer is no longer needed: the next one may have it."""
        with self._free:
            self._lent = False
            self._free.notify_all()


class Loan:
    """Lends the buffer once, to the first assembly of a restore, and takes it back (`release`): a
    second assembly of the same restore (a longer run of blocks) gets new memory, since the first
    one's blob is still wanted should the second fail. The buffer is only taken when free: an
    assembly runs on the codec's threads, which a deferred save may need while its capture still
    holds the buffer, so waiting for it there could wait for good."""

    def __init__(self, buffer: CaptureBuffer) -> None:
        self._buffer = buffer
        self._lent = False

    def __call__(self, size: int) -> npt.NDArray[np.uint8] | None:
        if self._lent:
            return None
        lent = self._buffer.try_lease(size)
        self._lent = lent is not None
        return lent

    def release(self) -> None:
        """The blob built in the buffer was handed to llama.cpp, or dropped: the buffer is free."""
        if self._lent:
            self._lent = False
            self._buffer.release()


def capture_buffer(owner: Any) -> CaptureBuffer:
    """The capture buffer of `owner` (a Llama), made on first use and gone with it: pinned memory
    where the Llama keeps its K/V cache on a GPU (see the module docstring), let go of when the
    Llama is closed too."""
    with _buffers_lock:
        buffer = _buffers.get(owner)
        if buffer is None:
            pinned = pinned_memory_for(owner) if isinstance(owner, llama_cpp.Llama) else None
            buffer = _buffers[owner] = CaptureBuffer(pinned)
            if pinned is not None:
                _release_on_close(owner)
        return buffer


def _release_on_close(llm: llama_cpp.Llama) -> None:
    """`release_capture_buffer(llm)` when `llm.close()` runs (llama-cpp-python closes a Llama's
    native parts through its `_stack`); a weak reference, so that the Llama still goes when dropped."""
    stack = getattr(llm, "_stack", None)
    if stack is None:
        return
    owner = weakref.ref(llm)

    def release() -> None:
        alive = owner()
        if alive is not None:
            release_capture_buffer(alive)

    stack.callback(release)


def release_capture_buffer(owner: Any) -> None:
    """Let go of `owner`'s capture buffer when it is a GPU's pinned memory (the cache is detached
    from it): that memory is scarce, and freed once the capture or restore that may still use it is
    done; a later one makes a new buffer. A plain buffer stays with its Llama, whatever attaches
    next: a fresh one would fault its pages in again on the next restore (an 8B-shaped model's
    1,024-token restore from RAM took 76-103 ms instead of 51 when `detach` dropped it, 2026-11-28)."""
    with _buffers_lock:
        buffer = _buffers.get(owner)
        if buffer is not None and buffer.for_device:
            del _buffers[owner]


def _nothing() -> None:
    pass
