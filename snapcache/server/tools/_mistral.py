"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (v0.3, Nemo) and
`[TOOL_CALLS]name[ARGS]{...}` (Small 3.2, Devstral, Ministral 3; `[CALL_ID]id` may sit before `[ARGS]`).
"""

from __future__ import annotations

import re

from snapcache.server.tools._syntax import Opening, Step, call_from_object, decode_json, opening_match
from snapcache.server.tools._values import ToolCall, new_call_id, normalized_arguments

_MARKER = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_NAMED = re.compile(r"\s*(?P<name>[\w.\-]+)(?:\[CALL_ID\](?P<id>[\w\-]+))?\[ARGS\]")
_OPENING = re.compile(_NAMED.pattern + r"\s*(?=\{)")


class MistralSyntax:
    """A JSON list of calls, or one named call with its JSON arguments, after each `[TOOL_CALLS]`."""

    markers = (_MARKER,)
    opens_with_json = False

    def __init__(self, *, named: bool = False, call_ids: bool = False) -> None:
        # How the template writes calls (what a grammar asks for; both are read either way):
        # `name[ARGS]{...}` rather than a JSON list, with `[CALL_ID]id` before `[ARGS]`.
        self.named = named
        self.call_ids = call_ids

    def opening(self, marker: str, body: str) -> Opening | None:
        """The call's name (and id) once `name[ARGS]{` has been written; calls in a JSON list are not
        streamed."""
        return opening_match(_OPENING, body)

    def take(self, marker: str, body: str, final: bool) -> Step | None:
        """Read the list, or the one named call, that follows the marker."""
        start = len(body) - len(body.lstrip())
        if start == len(body):
            return Step((), len(body), malformed=True) if final else None
        if body[start] in "[{":
            return self._json_list(body, start, final)
        return self._named(body, final)

    def _json_list(self, body: str, start: int, final: bool) -> Step | None:
        decoded = decode_json(body, start)
        if decoded is None:
            return Step((), len(body), malformed=True) if final else None
        value, end = decoded
        calls = [call_from_object(item) for item in (value if isinstance(value, list) else [value])]
        if not calls or any(call is None for call in calls):
            return Step((), end, malformed=True)
        return Step(tuple(call for call in calls if call is not None), end)

    def _named(self, body: str, final: bool) -> Step | None:
        if _ARGS not in body:
            return Step((), len(body), malformed=True) if final else None
        match = _NAMED.match(body)
        if match is None:
            return Step((), body.index(_ARGS) + len(_ARGS), malformed=True)
        decoded = decode_json(body, match.end())
        if decoded is None:
            return Step((), len(body), malformed=True) if final else None
        arguments = normalized_arguments(decoded[0])
        if arguments is None:
            return Step((), decoded[1], malformed=True)
        call_id = match.group("id") or new_call_id()
        return Step((ToolCall(call_id, match.group("name"), arguments),), decoded[1])
