"""Hermes and Qwen 2.5/3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, once per call."""

from __future__ import annotations

import re

from snapcache.server.tools._syntax import Opening, Step, call_from_object, decode_json, opening_match

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
# Qwen writes the name first, so the arguments can be streamed; Hermes-2-Pro writes them first.
_OPENING = re.compile(r'\s*\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')


class HermesSyntax:
    """One JSON object between `<tool_call>` and `</tool_call>`; parallel calls repeat the pair."""

    markers = (_OPEN,)
    opens_with_json = False

    def opening(self, marker: str, body: str) -> Opening | None:
        """The call's name once `{"name": ..., "arguments": {` has been written."""
        return opening_match(_OPENING, body)

    def take(self, marker: str, body: str, final: bool) -> Step | None:
        """Read one call up to its closing tag (or, at the end of the reply, without it)."""
        close = body.find(_CLOSE)
        if close < 0 and not final:
            return None
        inside = body if close < 0 else body[:close]
        consumed = len(body) if close < 0 else close + len(_CLOSE)
        start = len(inside) - len(inside.lstrip())
        decoded = decode_json(inside, start)
        if decoded is None or inside[decoded[1] :].strip():
            return Step((), consumed, malformed=True)
        call = call_from_object(decoded[0])
        return Step((call,), consumed) if call else Step((), consumed, malformed=True)
