"""The values a tool-calling chat passes around: a tool offered, a call made, a reply parsed."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function tool as OpenAI describes one: its name, what it does, a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        """The tool in the shape chat templates iterate: `{"type": "function", "function": {...}}`."""
        function = {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made; `arguments` is compact JSON text of an object."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        """The call as an OpenAI assistant message carries it in `tool_calls`."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a call still being written, from a stream.

    The first delta of an `index` (the call's place among the reply's calls) names the call with
    empty `arguments`; the next ones add the arguments' JSON text as the model writes it. The
    `ToolCall` with the same id follows when the call closes, its arguments normalized (the same
    object). A call announced and then not made comes back as a `ToolCallDropped`.
    """

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDropped:
    """A call a stream announced (by `ToolCallDelta`s) and then did not make.

    The reply ended inside it (a token limit), it turned out malformed, or it was a call the reply
    already made. `text` is what a whole reply shows in its place as content: the call's text as
    written, or "" where it is left out (a repeat, or a call `cut` short). `cut`: the token limit
    ended the reply inside the call; its text is never shown, and the call as far as it went (its
    deltas) is what the answer holds, as the hosted APIs leave a call they cut.
    """

    index: int
    id: str
    text: str
    cut: bool = False


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A model's reply split into its text and the tool calls it made, in order."""

    content: str
    calls: tuple[ToolCall, ...] = ()


def new_call_id() -> str:
    """A fresh id for a call whose format carries none: `call_` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def compact_json(value: object) -> str:
    """JSON text without spaces, non-ASCII kept as is: the one form every parsed argument takes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def arguments_json(arguments: object) -> str:
    """A call's arguments as a client sent them, as JSON text: text as it is, an object as compact JSON."""
    return arguments if isinstance(arguments, str) else compact_json(arguments)


def arguments_object(arguments: str) -> Any:
    """The value a call's JSON arguments hold, for a template that expects an object: empty text is
    an empty object; text that is not JSON stays the text, as the model wrote it."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def normalized_arguments(arguments: object) -> str | None:
    """The compact JSON of a call's arguments (an object, or JSON text of one); None when not an object.

    Missing arguments are an empty object; some models encode the object once more as a JSON string.
    """
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    return compact_json(arguments) if isinstance(arguments, dict) else None
