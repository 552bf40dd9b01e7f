"""The seam between the streaming parser and one model's call format."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from snapcache.server.tools._values import ToolCall, new_call_id, normalized_arguments


@dataclass(frozen=True, slots=True)
class Step:
    """What a call format made of the text after one of its markers.

    `consumed` characters of that text are used up; the text after them is content again. A malformed
    step's consumed text (with its marker) stays content: a broken call is shown, never raised.
    """

    calls: tuple[ToolCall, ...]
    consumed: int
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class Opening:
    """The start of a call still being written: its name, its id if the format gives one, and where
    its JSON arguments object begins in the text after the marker."""

    name: str
    id: str | None
    arguments_at: int


class CallSyntax(Protocol):
    """How one model family writes its tool calls."""

    @property
    def markers(self) -> tuple[str, ...]:
        """Texts that open a call region (special tokens, detokenized with `special=True`)."""
        ...

    @property
    def opens_with_json(self) -> bool:
        """Whether a reply that starts with `{` may be a call without any marker (Llama 3.x)."""
        ...

    def take(self, marker: str, body: str, final: bool) -> Step | None:
        """Read the call region that `marker` opened; None while `body` may still be incomplete.

        `final` says no more text will come: then the answer is never None. `marker` is "" for a
        reply that opened with `{` where `opens_with_json`.
        """
        ...

    def opening(self, marker: str, body: str) -> Opening | None:
        """The call being written, once its name is known and its JSON arguments have begun; else None."""
        ...


def call_from_object(value: Any) -> ToolCall | None:
    """A call from a decoded `{"name": ..., "arguments" | "parameters": {...}, "id"?: ...}`, or None."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = normalized_arguments(value.get("arguments", value.get("parameters")))
    if arguments is None:
        return None
    given_id = value.get("id")
    return ToolCall(given_id if isinstance(given_id, str) and given_id else new_call_id(), name, arguments)


def opening_match(pattern: re.Pattern[str], body: str) -> Opening | None:
    """An Opening from a pattern whose group "name" is a JSON string body and whose end is the `{`."""
    match = pattern.match(body)
    if match is None:
        return None
    try:
        name = json.loads(f'"{match.group("name")}"')
    except ValueError:
        return None
    given = match.groupdict().get("id")
    return Opening(name, given, match.end()) if name else None


def decode_json(text: str, start: int = 0) -> tuple[Any, int] | None:
    """The JSON value that starts at `text[start]` and the index after it, or None."""
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
