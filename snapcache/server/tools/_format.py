"""ToolFormat: a chat template's call format, and how to read replies written in it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from snapcache.server.tools._grammar import TokenOf, call_grammar
from snapcache.server.tools._qwen_xml import QwenXmlSyntax
from snapcache.server.tools._stream import ToolCallStream, parse_reply
from snapcache.server.tools._syntax import CallSyntax
from snapcache.server.tools._values import ParsedReply


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How a model writes tool calls, found from its chat template by `tool_format_for`.

    `name` is one of "hermes", "qwen3_coder", "seed_oss", "llama3", "mistral", "functiongemma",
    "gemma4", or "none" where the template has no call format of its own (the caller then describes the tools
    itself and constrains the reply with a grammar). `renders_tools` says the template places the
    `tools` it is given in the prompt itself. `stop` lists texts to stop generation at, beyond the
    model's own end-of-turn tokens.
    """

    name: str
    renders_tools: bool = False
    stop: tuple[str, ...] = ()
    syntax: CallSyntax | None = field(default=None, repr=False, compare=False)

    @property
    def native(self) -> bool:
        """Whether the model has a call format of its own (so `parse` can find calls)."""
        return self.syntax is not None

    @property
    def call_marker(self) -> str | None:
        """The text that opens a call (`<tool_call>`, `[TOOL_CALLS]`...), or None.

        A caller that must have a call (`tool_choice` "required") can end the prompt with it and feed
        it to the parser before the model's text.
        """
        return self.syntax.markers[0] if self.syntax is not None else None

    def parse(self, text: str, tools: Sequence[Any] = ()) -> ParsedReply:
        """Split a whole reply into content and tool calls.

        `text` must be the reply detokenized with special tokens (`detokenize(..., special=True)`):
        markers such as `[TOOL_CALLS]`, `<|python_tag|>` or `<start_function_call>` are special
        tokens and vanish from text detokenized without them. Parallel calls come back in order;
        a malformed call stays in the content; ids are the model's where its format has them, else
        `call_` and random hex; arguments are compact JSON text of an object. Without calls the
        content is the text unchanged; with calls it is stripped of surrounding whitespace. `tools`
        (objects like ToolSpec) tell formats that write values bare (Qwen3-Coder's) which are text.
        """
        return parse_reply(self._syntax_for(tools), text)

    def stream(self, tools: Sequence[Any] = ()) -> ToolCallStream:
        """A parser for one streamed reply (same rules as `parse`): `feed(delta)`, then `finish()`."""
        return ToolCallStream(self._syntax_for(tools))

    def grammar(
        self, tools: Sequence[Any], *, parallel: bool = True, token_of: TokenOf | None = None
    ) -> str | None:
        """A GBNF grammar (text, root `root`) of a reply that calls one of `tools` (objects like
        ToolSpec), several calls where `parallel` and the format allows; None where the model has
        no call format. It starts with the call marker, as the one token `token_of(marker)` names
        where that gives an id (the model's vocabulary), else as text. JSON arguments follow the
        tools' schemas; other notations are left free between the markers."""
        return call_grammar(self.name, self.syntax, tools, parallel=parallel, token_of=token_of or _no_token)

    def _syntax_for(self, tools: Sequence[Any]) -> CallSyntax | None:
        if tools and isinstance(self.syntax, QwenXmlSyntax):
            return self.syntax.typed(tools)
        return self.syntax


def _no_token(text: str) -> int | None:
    return None
