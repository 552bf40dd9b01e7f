"""The reused capture buffer: one capture at a time holds it, it grows when needed, and it is touched."""

from __future__ import annotations

import threading

import numpy as np

from snapcache.llama.state.capture_buffer import CaptureBuffer, capture_buffer


class Owner:
    """Anything a buffer can belong to (a Llama in use)."""


def test_a_second_lease_waits_for_the_first_release() -> None:
    buffer = CaptureBuffer()
    first = buffer.lease(1_000)
    first[:] = 7
    leased = threading.Event()

    def second() -> None:
        buffer.lease(500)
        leased.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not leased.wait(0.2)  # the first capture is still being copied out
    buffer.release()
    assert leased.wait(30)
    thread.join()
    buffer.release()


def test_it_grows_beyond_a_larger_state_and_keeps_its_memory_otherwise() -> None:
    buffer = CaptureBuffer()
    small = buffer.lease(1_000)
    buffer.release()
    again = buffer.lease(800)
    assert np.shares_memory(small, again)  # reused, not allocated again
    buffer.release()
    large = buffer.lease(10_000)
    assert large.nbytes == 10_000
    assert buffer.nbytes >= 10_000 * 1.25 - 1
    assert not np.shares_memory(large, small)
    buffer.release()


def test_one_buffer_per_owner() -> None:
    a, b = Owner(), Owner()
    assert capture_buffer(a) is capture_buffer(a)
    assert capture_buffer(a) is not capture_buffer(b)


def test_a_restore_never_waits_for_a_save_holding_the_buffer() -> None:
    """A restore assembles on the codec's threads, which the save holding the buffer may need: its
    loan takes the buffer only when free, and otherwise gets nothing (the assembly allocates)."""
    buffer = CaptureBuffer()
    held = buffer.lease(1_000)  # a capture whose deferred save has not run yet
    loan = buffer.loan()
    assert loan(800) is None  # at once: no wait
    loan.release()  # gives back nothing it did not take
    buffer.release()
    loan = buffer.loan()
    lent = loan(800)
    assert lent is not None
    assert np.shares_memory(lent, held)
    assert loan(800) is None  # lent once per restore
    loan.release()
    assert buffer.try_lease(10) is not None  # free again
    buffer.release()
