"""Qwen3-Coder, Qwen3.5 (and Seed-OSS with `<seed:tool_call>`): XML calls,
`<tool_call><function=name><parameter=key>value</parameter>...</function></tool_call>`.

Values are written bare: a string as its text (over several lines if need be), anything else as
JSON. Which one a value is comes from the tool's JSON schema where the caller gives the tools;
otherwise a value that reads as JSON other than a string (a number, a boolean, an object...) is taken
as JSON and the rest as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from snapcache.server.tools._syntax import Opening, Step
from snapcache.server.tools._values import ToolCall, compact_json, new_call_id

_FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*?)(?:</function>\s*)?\Z", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_LITERALS = {"true": True, "false": False, "True": True, "False": False, "null": None, "None": None}


def _value(text: str, kind: str | None) -> Any:
    """A parameter's value: text where the schema says string, else JSON where it reads as JSON."""
    if kind == "string":
        return text
    if text.strip() in _LITERALS and kind in (None, "boolean", "null"):
        return _LITERALS[text.strip()]
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text if isinstance(value, str) and kind is None else value


class QwenXmlSyntax:
    """One `<function=...>` block with its parameters between an opening and a closing tag."""

    opens_with_json = False

    def __init__(
        self,
        open_call: str = "<tool_call>",
        close_call: str = "</tool_call>",
        kinds: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.markers = (open_call,)
        self._close = close_call
        self._kinds = kinds or {}

    @property
    def closing(self) -> str:
        """The tag that closes a call."""
        return self._close

    def typed(self, tools: Sequence[Any]) -> QwenXmlSyntax:
        """The same syntax reading values by the JSON schema types of `tools` (objects like ToolSpec)."""
        kinds: dict[str, dict[str, str]] = {}
        for tool in tools:
            properties = (tool.parameters or {}).get("properties") or {}
            kinds[tool.name] = {
                key: schema["type"]
                for key, schema in properties.items()
                if isinstance(schema, Mapping) and isinstance(schema.get("type"), str)
            }
        return QwenXmlSyntax(self.markers[0], self._close, kinds)

    def opening(self, marker: str, body: str) -> Opening | None:
        """None: the arguments are not JSON, so a call comes whole."""
        return None

    def take(self, marker: str, body: str, final: bool) -> Step | None:
        """Read one call up to its closing tag (or, at the end of the reply, without it)."""
        close = body.find(self._close)
        if close < 0 and not final:
            return None
        inside = body if close < 0 else body[:close]
        consumed = len(body) if close < 0 else close + len(self._close)
        match = _FUNCTION.match(inside.rstrip())
        if match is None:
            return Step((), consumed, malformed=True)
        name, rest = match.group(1), match.group(2)
        kinds = self._kinds.get(name, {})
        arguments = {key: _value(text, kinds.get(key)) for key, text in _PARAMETER.findall(rest)}
        if _PARAMETER.sub("", rest).strip():
            return Step((), consumed, malformed=True)  # text that is no parameter: not this format
        return Step((ToolCall(new_call_id(), name, compact_json(arguments)),), consumed)
