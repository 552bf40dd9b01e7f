"""The channel between a chat request's tools and a model: how to render them, hold the answer to
them, read it.

`engine.tool_channel_for` picks the channel for a request and a model: the model's own call format
(`native_tools`) where the chat template it renders with (its GGUF's `tokenizer.chat_template`)
writes calls in a format `snapcache.server.tools` reads (its `ToolFormat`) and places the tools
itself; else the generic one (`generic_tools`), which works with any template.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Protocol

import llama_cpp
from llama_cpp.llama_grammar import LlamaGrammar

from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.tools import StreamItem

__all__ = ["PlainReader", "ReplyReader", "ToolChannel", "chat_template", "checked_grammar"]

_log = logging.getLogger("snapcache")

# llama-cpp-python's name for the chat format of the template a GGUF carries.
_GGUF_TEMPLATE = "chat_template.default"


class ReplyReader(Protocol):
    """Reads one answer as it is generated: content, pieces of calls being written, calls."""

    def feed(self, text: str) -> list[StreamItem]:
        """Take the next text of the answer; return what is now known (content as `str`, calls as
        `ToolCallDelta`s and `ToolCall`s, in order)."""
        ...

    def finish(self) -> list[StreamItem]:
        """The answer is over: return everything still held."""
        ...

    @property
    def finished(self) -> bool:
        """Whether the answer holds all it will: what the model writes next would be dropped, so
        generation may stop."""
        ...


class ToolChannel(Protocol):
    """How one request's tools and tool history reach a model, and how its calls come back."""

    def messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        """The request's messages as the model's chat template takes them."""
        ...

    def options(self, request: ChatRequest) -> dict[str, Any]:
        """What `create_chat_completion` passes to the template besides the messages (the tools, for
        a template that places them itself)."""
        ...

    def stop(self, request: ChatRequest) -> tuple[str, ...]:
        """Texts that end the answer besides the model's end-of-turn tokens."""
        ...

    def grammar(self, request: ChatRequest) -> Any | None:
        """A `LlamaGrammar` the answer must follow, or None."""
        ...

    def special_text(self, request: ChatRequest) -> bool:
        """Whether the answer must be read with the special tokens it holds as text (call markers
        such as `[TOOL_CALLS]` are special tokens)."""
        ...

    def reader(self, request: ChatRequest) -> ReplyReader:
        """A reader of one answer to `request`."""
        ...


class PlainReader:
    """An answer that is all content."""

    finished = False

    def feed(self, text: str) -> list[StreamItem]:
        return [text] if text else []

    def finish(self) -> list[StreamItem]:
        return []


def chat_template(llm: Any) -> str | None:
    """The Jinja template `llm`'s chats render with: its GGUF's, where llama-cpp-python uses it (no
    chat format or handler chosen instead); else None."""
    if str(getattr(llm, "chat_format", None)) != _GGUF_TEMPLATE:
        return None
    template = getattr(llm, "metadata", {}).get("tokenizer.chat_template")
    return template if isinstance(template, str) and template else None


@functools.lru_cache(maxsize=32)
def checked_grammar(gbnf: str, vocab: Any) -> Any | None:
    """A `LlamaGrammar` of GBNF text that llama.cpp takes on this vocabulary (None, logged, where it
    refuses it: the answer is then read as it comes)."""
    grammar = LlamaGrammar.from_string(gbnf, verbose=False)
    if vocab is not None:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
        if not sampler:
            _log.warning("tool calls: llama.cpp refused the grammar of these tools; the answer is read as is")
            return None
        llama_cpp.llama_sampler_free(sampler)
    return grammar
