"""One request handed to a `Scheduler`: its prompt and parameters, and the tokens it gets back."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

from snapcache.errors import SnapcacheError
from snapcache.key import TokenArray
from snapcache.llama.batch._sampling import SamplingParams
from snapcache.llama.stored.reports import RestoreInfo

__all__ = ["FinishReason", "Request", "SchedulerError"]

FinishReason = Literal["stop", "length", "cancelled", "error"]


class SchedulerError(SnapcacheError, RuntimeError):
    """A request could not be run: llama.cpp failed, or the scheduler was closed under it."""


class _End:
    """Marks the end of a request's tokens in its queue."""


_END = _End()


class Request:
    """A request in flight: iterate it for its generated tokens as they are sampled (the
    end-of-generation token is not among them); `cancel` frees its sequence.

    Each request has a queue of its own, so a slow reader never holds the others back. After the
    last token: `finish_reason` ("stop": end of generation; "length": `max_tokens` or the context's
    end; "cancelled"; "error", with `error`), `restore` (what was restored of its prompt) and
    `first_token_seconds` (from submission to its first token).
    """

    def __init__(
        self,
        prompt: TokenArray,
        params: SamplingParams,
        max_tokens: int,
        scope: str,
        chat_prefix: TokenArray | None,
        wake: Callable[[], None],
        *,
        chat: bool = False,
    ) -> None:
        self.prompt = prompt
        self.params = params
        self.max_tokens = max_tokens
        self.scope = scope
        self.chat_prefix = chat_prefix
        self.chat = chat  # a rendered chat (its restore points are a chat's: no ladder)
        self.tokens: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.error: BaseException | None = None
        self.restore: RestoreInfo | None = None
        self.submitted_at = time.perf_counter()
        self.first_token_seconds: float | None = None
        self._queue: queue.SimpleQueue[int | _End] = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._wake = wake

    def __iter__(self) -> Iterator[int]:
        """The generated tokens, as they come; raises SchedulerError when the request failed."""
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                self._queue.put(item)  # a second iteration ends at once too
                if self.error is not None:
                    raise SchedulerError(str(self.error)) from self.error
                return
            yield item

    def result(self, timeout: float | None = None) -> list[int]:
        """All generated tokens once the request is done; SchedulerError if it failed, TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError("the request is still running")
        if self.error is not None:
            raise SchedulerError(str(self.error)) from self.error
        return list(self.tokens)

    def cancel(self) -> None:
        """Stop the request: its sequence is freed before the scheduler's next step."""
        if not self._done.is_set():
            self._cancelled.set()
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # -- called by the scheduler --------------------------------------------------------------------

    def emit(self, token: int) -> None:
        if self.first_token_seconds is None:
            self.first_token_seconds = time.perf_counter() - self.submitted_at
        self.tokens.append(token)
        self._queue.put(token)

    def finish(self, reason: FinishReason, error: BaseException | None = None) -> None:
        if self._done.is_set():
            return
        self.finish_reason = reason
        self.error = error
        self._done.set()
        self._queue.put(_END)
