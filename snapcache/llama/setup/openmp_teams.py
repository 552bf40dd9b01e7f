"""Compute on a thread that ends: llama.cpp's OpenMP teams must not outnumber the cores.

llama.cpp's CPU backend, built with OpenMP (its default, and llama-cpp-python's), spreads each graph
over a team of threads that belongs to the thread calling `llama_decode`: the first call from a
thread starts the team's other threads, and they stay, asleep, until that thread ends. Once the
threads OpenMP keeps outnumber the cores, GNU OpenMP waits at each of the graph's hundreds of
barriers with a short spin and then sleeps (its "throttled" spin), and every decode of every team
slows: the batched scheduler's 4-sequence step of Gemma-3-270M took 48 ms instead of 39 ms on 2 cores
after one decode on another thread that stayed alive, and 39 ms again when that thread had ended
(docs/how-it-works/architecture.md, "What llama.cpp does underneath").

So snapcache's own decodes off the scheduler's thread (the exactness probe, the calls on a served
Llama's own context) run `on_passing_thread`: a thread started for the call, which takes its team
with it when it ends. A thread costs about 0.1 ms to start; the calls it carries read prompts.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["on_passing_thread"]

T = TypeVar("T")


def on_passing_thread(call: Callable[[], T], name: str = "snapcache-compute") -> T:
    """`call()`, run on a thread of its own that ends with it (in a copy of the caller's context
    variables); what it returns is returned, what it raises is raised here."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # the caller's to see, in the caller's thread
            failure.append(exc)

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), name=name, daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
