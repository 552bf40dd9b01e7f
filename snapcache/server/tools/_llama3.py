"""Llama 3.1-3.3: `{"name": ..., "parameters": {...}}`, bare or after `<|python_tag|>`.

The 3.1 template names `<|python_tag|>` (its built-in tools); 3.2's does not, and both models also
answer with the bare object. Several calls come separated by `;` or whitespace.
"""

from __future__ import annotations

import re

from snapcache.server.tools._syntax import Opening, Step, call_from_object, decode_json, opening_match
from snapcache.server.tools._values import ToolCall

_PYTHON_TAG = "<|python_tag|>"
# Where a call turn ends; only seen when the caller keeps stop tokens in the text.
_ENDS = ("<|eom_id|>", "<|eot_id|>")
_OPENING = re.compile(
    r'\s*\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"(?:parameters|arguments)"\s*:\s*(?=\{)'
)


def _skip_separators(text: str, at: int) -> int:
    while at < len(text) and (text[at].isspace() or text[at] == ";"):
        at += 1
    return at


class Llama3Syntax:
    """JSON objects with a name and parameters, to the end of the reply."""

    markers = (_PYTHON_TAG,)
    opens_with_json = True

    def opening(self, marker: str, body: str) -> Opening | None:
        """The first call's name once `{"name": ..., "parameters": {` has been written."""
        return opening_match(_OPENING, body)

    def take(self, marker: str, body: str, final: bool) -> Step | None:
        """Read every call of the region; a region ends at the end of the reply or a turn-end token."""
        ends = [i for i in (body.find(end) for end in _ENDS) if i >= 0]
        if not ends and not final:
            return None
        end = min(ends) if ends else len(body)
        whole = end + next((len(e) for e in _ENDS if body.startswith(e, end)), 0)
        calls: list[ToolCall] = []
        at = _skip_separators(body, 0)
        while at < end:
            decoded = decode_json(body[:end], at)
            call = call_from_object(decoded[0]) if decoded else None
            if call is None:
                # Text after the calls is content again; anything else that is not a call was never one.
                return Step(tuple(calls), at) if calls else Step((), whole, malformed=True)
            calls.append(call)
            at = _skip_separators(body, decoded[1]) if decoded else end
        if not calls:
            return Step((), whole, malformed=True)
        return Step(tuple(calls), whole)
