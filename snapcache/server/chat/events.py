"""What a chat request's run gives its dialect, in order: `Started`, text and calls, `Finished`.

The engine (`engine.py`) makes them and each dialect turns them into its own answer; they live here
so that a dialect imports them without the engine, and the model and its cache with it. Calls are
`snapcache.server.tools`' values: `ToolCallDelta` announces one as it is written, `ToolCalled`
holds it whole, `ToolCallDropped` says one announced was not made, and `ToolCallCut` holds one the
token limit cut short, as far as it went.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from snapcache.server.tools import ToolCall, ToolCallDelta, ToolCallDropped

__all__ = [
    "ChatEvent",
    "FinishReason",
    "Finished",
    "Started",
    "TextDelta",
    "ToolCallCut",
    "ToolCallDelta",
    "ToolCallDropped",
    "ToolCalled",
    "Usage",
]

FinishReason = Literal["end", "length", "stop_sequence", "tool_calls"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one request: its prompt, those of it restored (not read), and those generated."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def read_tokens(self) -> int:
        """Prompt tokens read afresh."""
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class Started:
    """The prompt is read; what it restored is known. `elapsed_ns`: since the request began to run
    (its turn on the model taken), in nanoseconds."""

    usage: Usage
    elapsed_ns: int = field(default=0, compare=False)  # timing, not what happened


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCalled:
    """A call the answer made, whole (a `ToolCallDelta` with its `id` may have announced it; see
    `snapcache.server.tools` for those and for `ToolCallDropped`: a call announced and not made)."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class Finished:
    """The answer is over: why, its usage, the stop sequence that ended it, and `elapsed_ns` since
    the request began to run."""

    reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    elapsed_ns: int = field(default=0, compare=False)  # timing, not what happened


@dataclass(frozen=True, slots=True)
class ToolCallCut:
    """A call the token limit cut short, as far as it went: its name and its arguments as written
    (no JSON yet). A `ToolCallDropped` marked `cut` follows it."""

    call: ToolCall


ChatEvent = Started | TextDelta | ToolCallDelta | ToolCalled | ToolCallCut | ToolCallDropped | Finished
