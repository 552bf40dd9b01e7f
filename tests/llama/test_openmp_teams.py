"""llama.cpp's OpenMP teams: a thread that decoded keeps a team of threads while it lives, and
`on_passing_thread` runs a call on a thread that takes its team with it (see `openmp_teams`).

Teams are counted as the process's threads that Python did not start (`/proc/self/task` less
`threading.enumerate()`), counted while the thread that made the call is still alive."""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from snapcache.llama.exactness import alignment
from snapcache.llama.setup.openmp_teams import on_passing_thread

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc"),
    pytest.mark.skipif(
        "OPENMP = 1" not in llama_cpp.llama_print_system_info().decode(errors="replace"),
        reason="this llama.cpp build runs without OpenMP",
    ),
]


def threads_python_did_not_start() -> int:
    return len(os.listdir("/proc/self/task")) - len(threading.enumerate())


def counted_while_the_caller_lives(call: Callable[[], Any]) -> int:
    """The threads Python did not start, more than before `call()`, counted once `call()` returned
    on a thread that is still alive then (a passing thread's team leaves soon after that thread
    ends, not at the same instant: the count may take up to 2 s to settle)."""
    before = threads_python_did_not_start()
    done, counted = threading.Event(), threading.Event()

    def caller() -> None:
        call()
        done.set()
        counted.wait(30)

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        assert done.wait(120)
        deadline = time.monotonic() + 2.0
        while threads_python_did_not_start() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        return threads_python_did_not_start() - before
    finally:
        counted.set()
        thread.join()


@pytest.fixture
def two_thread_llama(make_llama: Any, tiny_model_path: Path) -> llama_cpp.Llama:
    return make_llama(tiny_model_path, n_ctx=512, n_threads=2, n_threads_batch=2)  # type: ignore[no-any-return]


def test_a_thread_that_decoded_keeps_its_team_while_it_lives(two_thread_llama: llama_cpp.Llama) -> None:
    # The fact the module rests on: one more thread (2 threads a decode, the caller being one).
    tokens = two_thread_llama.tokenize(b"The team stays while its thread does.")
    assert counted_while_the_caller_lives(lambda: two_thread_llama.eval(tokens)) == 1


def test_a_decode_on_a_passing_thread_leaves_no_team(two_thread_llama: llama_cpp.Llama) -> None:
    tokens = two_thread_llama.tokenize(b"The team goes with its thread.")
    decoded = lambda: on_passing_thread(lambda: two_thread_llama.eval(tokens))  # noqa: E731
    assert counted_while_the_caller_lives(decoded) == 0
    assert two_thread_llama.n_tokens == len(tokens)  # the decode did run


def test_the_exactness_probe_leaves_no_team_on_its_callers_thread(two_thread_llama: llama_cpp.Llama) -> None:
    found: list[int | None] = []
    probe = lambda: found.append(alignment.measure_alignment(two_thread_llama))  # noqa: E731
    assert counted_while_the_caller_lives(probe) == 0
    assert found[0] is not None  # measured: the tiny model has no sliding window


def test_a_passing_thread_gives_back_what_the_call_returns_and_raises() -> None:
    where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")
    where.set("the caller's")

    def seen() -> tuple[str, bool]:
        return where.get(), threading.current_thread() is threading.main_thread()

    assert on_passing_thread(seen) == ("the caller's", False)  # its context variables, another thread

    def failing() -> None:
        raise ValueError("raised on the passing thread")

    with pytest.raises(ValueError, match="raised on the passing thread"):
        on_passing_thread(failing)
