"""A completion whose text keeps the model's special tokens, on llama-cpp-python's own path.

`Llama._create_completion` makes a completion's text with the Llama's `detokenize`, which leaves
special tokens out; a caller that reads a model's own tool-call markers (`[TOOL_CALLS]` is a control
token) needs them in. For one call, the Llama's `detokenize` is shadowed while the call runs, and a
stream's while each of its chunks is made (the call holds the Llama's own context all along, so
nothing else runs there meanwhile). Code that detokenizes on the Llama beside it (the batched path's
readers) calls `Llama.detokenize` of the class, which the shadow does not touch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

import llama_cpp

from snapcache.llama.templates.chat_prefix import patched

__all__ = ["keeping_special_text", "stream_keeping_special_text"]

_END = object()


@contextlib.contextmanager
def keeping_special_text(llm: llama_cpp.Llama, keep: bool = True) -> Iterator[None]:
    """While the block runs, the Llama's own completion text keeps special tokens (if `keep`)."""
    if not keep:
        yield
        return

    def detokenize(tokens: Any, prev_tokens: Any = None, special: bool = False) -> bytes:
        return bytes(llama_cpp.Llama.detokenize(llm, tokens, prev_tokens=prev_tokens, special=True))

    with patched(llm, "detokenize", detokenize):
        yield


def stream_keeping_special_text(llm: llama_cpp.Llama, chunks: Iterator[Any]) -> Generator[Any, None, None]:
    """`chunks`, each made with special tokens kept in its text; closing this closes them."""
    try:
        while True:
            with keeping_special_text(llm):
                chunk = next(chunks, _END)
            if chunk is _END:
                return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
