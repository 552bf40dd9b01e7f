"""One completion through the Llama's own code: its `generate` intercepted so that the longest stored
prefix of the final prompt tokens is restored first, the states saved once it ends (a stream: once
exhausted or closed), and the restored tokens reported in the result's usage."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import llama_cpp

from snapcache.llama.hook.completion import Completion, CompletionCache
from snapcache.llama.hook.request_streams import stop_with_request
from snapcache.llama.stored.reports import RestoreInfo
from snapcache.llama.templates.chat_prefix import patched

_MISSING = object()


class CompletionFlow:
    """Runs completions of one Llama, one at a time; `last_restore` is what the last one restored."""

    def __init__(self, llm: llama_cpp.Llama, completions: CompletionCache) -> None:
        self._llm = llm
        self._completions = completions
        self.last_restore: RestoreInfo | None = None

    def run(self, call: Completion, complete: Callable[[], Any], *, stream: bool) -> Any:
        """`complete()` (the Llama's own completion) with `call`'s prefix restored and its states saved."""
        self.last_restore = None
        if stream:
            chunks = self._stream(call, complete)
            stop_with_request(call.cancel, functools.partial(_close_unless_running, chunks))
            return chunks
        with self._intercept_generate(call):
            result = complete()
        self._completions.finish(call)
        if isinstance(result, dict) and call.restore is not None:
            _add_cached_tokens(result, call.restore.cached_tokens)
        return result

    def _stream(self, call: Completion, complete: Callable[[], Any]) -> Generator[Any, None, None]:
        # llama-cpp-python builds its stream lazily: the prompt reaches generate() on the first next().
        chunks: Iterator[Any] | None = None
        try:
            with self._intercept_generate(call):
                chunks = iter(complete())
                first = next(chunks, _MISSING)
            if first is _MISSING:
                return
            yield first
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            self._completions.finish(call)

    @contextmanager
    def _intercept_generate(self, call: Completion) -> Iterator[None]:
        original = self._llm.generate

        def generate(tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
            started = time.perf_counter()  # the checkpoints read in prepare are part of the read
            if not call.prepared:
                call.prepared = True
                self._completions.prepare(tokens, call)
                self.last_restore = call.restore
            media = call.media
            if media is not None:
                media.write_tokens(self._llm, keys=False)  # what generate compares its prompt with
            inner = original(tokens, *args, **kwargs)
            try:
                for token in inner:
                    if call.cancelled:
                        return  # its reader is gone: what was read is saved when the stream closes
                    if call.generated == 0:
                        call.read_seconds = time.perf_counter() - started
                    call.generated += 1
                    call.last_token = token
                    yield token
            finally:
                inner.close()

        with patched(self._llm, "generate", generate):
            yield


def _close_unless_running(chunks: Generator[Any, None, None]) -> None:
    """Close a stream its reader left (its state is saved now, while its request still holds the
    Llama); one a thread is running is left to that thread."""
    with suppress(ValueError):  # "generator already executing"
        chunks.close()


def _add_cached_tokens(result: dict[str, Any], cached_tokens: int) -> None:
    """Report restored tokens where OpenAI clients look for them: usage.prompt_tokens_details."""
    usage = result.get("usage")
    if isinstance(usage, dict):
        details = usage.setdefault("prompt_tokens_details", {})
        if isinstance(details, dict):
            details["cached_tokens"] = cached_tokens
