"""Replies in the generic JSON format, read whole or as they stream.

A template without a call format of its own gets its model's answer as one JSON object (llama-server's
generic format): `{"response": "..."}` for text, `{"tool_calls": [{"name": ..., "arguments": {...}},
...]}` for calls (`{"tool_call": {...}}` where one call is allowed). Text around the object, such as
a code fence, is tolerated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from snapcache.server.tools._stream import StreamItem, _Preview
from snapcache.server.tools._values import (
    ParsedReply,
    ToolCall,
    ToolCallDelta,
    ToolCallDropped,
    new_call_id,
    normalized_arguments,
)

_TEXT_ANSWER = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_CALLS_OPEN = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[')
_CALL_OPEN = re.compile(r'\s*\{\s*"tool_call"\s*:\s*(?=\{)')
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')
_NEXT_IN_LIST = re.compile(r"\s*\}\s*([,\]])")
_CALL_END = re.compile(r"\s*\}")


def parse_generic(text: str, names: Collection[str], *, parallel: bool = True) -> ParsedReply:
    """The content and calls of a whole reply. Calls of tools not in `names` are not calls; without
    `parallel` only the first call counts. A reply that is no such object is content as it is."""
    answer = _json_object(text)
    if answer is None:
        return ParsedReply(text)
    calls = []
    listed = answer.get("tool_calls")
    for call in ([answer.get("tool_call")] if listed is None else listed) or ():
        if isinstance(call, Mapping) and call.get("name") in names:
            arguments = normalized_arguments(call.get("arguments", {}))
            if arguments is not None:
                calls.append(ToolCall(new_call_id(), str(call["name"]), arguments))
    if not parallel:
        calls = calls[:1]
    response = answer.get("response")
    if calls:
        return ParsedReply(response if isinstance(response, str) else "", tuple(calls))
    return ParsedReply(response if isinstance(response, str) else text)


class GenericCallStream:
    """Fed the text of one reply as it comes; gives back what is known (as `ToolCallStream` does).

    The text of a `{"response": ...}` answer streams as it grows; a call is announced once its name
    is written (a `ToolCallDelta` with empty arguments), its arguments stream as written, and the
    `ToolCall`s, with the ids their deltas announced, come when the reply ends. Anything else is
    held until then and parsed whole (`parse_generic`). A reply cut short inside its calls (a token
    limit) keeps the calls it finished, the rest given back as content. A call the reply already made
    made again, the same tool with the same arguments, is where small models start to loop: the
    reply is `finished` there, that call and anything after it dropped; its pieces are held back
    while it is written as the earlier one was, so a repeat is never announced. A call announced and
    not made comes back as a `ToolCallDropped` (with the text given back in its place, if any).
    """

    def __init__(self, names: Collection[str], *, parallel: bool = True) -> None:
        self._names = frozenset(names)
        self._parallel = parallel
        self._text = ""
        self._shown = ""
        self._mode: str | None = None  # "text", "calls" (a list), "call" (one), "held", None: unknown yet
        self._at = 0  # where the next call of a list (or the one call) starts
        self._open: _Preview | None = None
        self._done = False
        self._ids: list[tuple[str, str]] = []  # (id, name) of each call announced
        self._arguments_at = 0  # where the arguments of the call being written start
        self._made: list[ToolCall] = []  # the calls whose objects closed
        self._complete = False  # the list (or the one call) closed
        self._repeated = False
        self._written: list[tuple[str, str]] = []  # (name, arguments as written) of each call made
        self._held: list[ToolCallDelta] = []  # pieces of the call being written, not yet passed on
        self._sent: set[str] = set()  # the ids of the calls announced

    @property
    def finished(self) -> bool:
        """Whether the reply holds all it will (its calls closed, or one made again): the rest of
        the generation would be dropped."""
        return self._complete or self._repeated

    def feed(self, text: str) -> list[StreamItem]:
        self._text += text
        return self._advance()

    def finish(self) -> list[StreamItem]:
        items = self._advance()
        made = range(len(self._made))
        if self._repeated:
            return [*items, *self._made, *self._dropped(made, "")]
        reply = parse_generic(self._text, self._names, parallel=self._parallel)
        if not reply.calls and self._made:
            rest = self._text[self._at :].strip()
            return [*items, *self._made, *self._dropped(made, rest)]
        content = ""
        if reply.content.startswith(self._shown) and len(reply.content) > len(self._shown):
            content = reply.content[len(self._shown) :]
        calls: list[StreamItem] = []
        kept: set[int] = set()
        for index, call in enumerate(reply.calls):
            if index < len(self._ids) and self._ids[index][1] == call.name:
                kept.add(index)
                call = ToolCall(self._ids[index][0], call.name, call.arguments)  # the id announced
            calls.append(call)
        if reply.calls:
            return [*items, *([content] if content else []), *calls, *self._dropped(kept, "")]
        return [*items, *self._dropped(kept, content)]

    def _send(self, items: list[StreamItem], delta: ToolCallDelta) -> None:
        """Pass on a piece of the call being written; held back while the call so far is the start of
        one the reply made already, as written (a repeat is dropped unseen)."""
        self._held.append(delta)
        written = self._text[self._arguments_at : self._open.sent] if self._open is not None else ""
        if not any(name == delta.name and made.startswith(written) for name, made in self._written):
            self._flush(items)

    def _flush(self, items: list[StreamItem]) -> None:
        """Pass on the pieces held back: their call is announced."""
        items.extend(self._held)
        self._sent.update(held.id for held in self._held)
        self._held.clear()

    def _dropped(self, kept: Collection[int], text: str) -> list[StreamItem]:
        """The calls begun but not among `kept` (their indices): those announced as dropped, `text`
        given back in the first one's place, or as content where that one was never announced."""
        unmade = [(i, id_) for i, (id_, _) in enumerate(self._ids) if i not in kept]
        dropped: list[StreamItem] = [ToolCallDropped(i, id_, "") for i, id_ in unmade if id_ in self._sent]
        if not text:
            return dropped
        if unmade and unmade[0][1] in self._sent:
            return [ToolCallDropped(unmade[0][0], unmade[0][1], text), *dropped[1:]]
        return [text, *dropped]

    def _advance(self) -> list[StreamItem]:
        if self._mode is None:
            self._mode = self._opening()
        if self._mode == "text":
            visible = streamed_text(self._text)
            if len(visible) > len(self._shown) and visible.startswith(self._shown):
                piece, self._shown = visible[len(self._shown) :], visible
                return [piece]
            return []
        items: list[StreamItem] = []
        while self._mode in ("calls", "call") and not self._done and self._read_call(items):
            pass
        return items

    def _opening(self) -> str | None:
        """What the reply is, once its opening says so (None: not yet known)."""
        if _TEXT_ANSWER.match(self._text):
            return "text"
        for mode, pattern in (("calls", _CALLS_OPEN), ("call", _CALL_OPEN)):
            found = pattern.match(self._text)
            if found is not None:
                self._at = found.end()
                return mode
        stripped = self._text.lstrip()
        if stripped and not stripped.startswith("{"):
            return "held"  # not the format's object: parsed whole when the reply ends
        return None

    def _read_call(self, items: list[StreamItem]) -> bool:
        """Read on in the call being written; True when it closed and another may follow."""
        text = self._text
        if self._open is None:
            head = _CALL_HEAD.match(text, self._at)
            if head is None:
                return False
            try:
                name = str(json.loads(f'"{head.group(1)}"'))
            except ValueError:
                name = ""
            index = len(self._ids)
            if name not in self._names or (index and not self._parallel):
                self._done = True  # not a call this request takes: the whole reply decides
                return False
            self._open, self._arguments_at = _Preview(index, new_call_id(), name, head.end()), head.end()
            self._ids.append((self._open.id, name))
            self._send(items, ToolCallDelta(index, self._open.id, name, ""))
        preview = self._open
        if not preview.end.closed:
            piece = text[preview.sent :]
            size = preview.end.scan(piece)
            if size:
                preview.sent += size
                self._send(items, ToolCallDelta(preview.index, preview.id, preview.name, piece[:size]))
            if not preview.end.closed:
                return False
        ending = (_NEXT_IN_LIST if self._mode == "calls" else _CALL_END).match(text, preview.sent)
        if ending is None:
            return False
        arguments = text[self._arguments_at : preview.sent]
        made = ToolCall(preview.id, preview.name, normalized_arguments(arguments) or arguments)
        self._open = None
        if any((call.name, call.arguments) == (made.name, made.arguments) for call in self._made):
            self._held.clear()
            self._repeated = self._done = True
            return False
        self._flush(items)
        self._made.append(made)
        self._written.append((made.name, arguments))
        self._at = ending.end()
        if self._mode == "call" or ending.group(1) == "]":
            self._complete = self._done = True
            return False
        return True


def streamed_text(partial: str) -> str:
    """The text of a `{"response": "..."}` answer so far ("" until it is clearly one)."""
    opened = _TEXT_ANSWER.match(partial)
    if opened is None:
        return ""
    rest, end, i = partial[opened.end() :], 0, 0
    while i < len(rest) and rest[i] != '"':
        if rest[i] != "\\":
            i += 1
        elif rest[i + 1 : i + 2] == "u":
            if len(rest) < i + 6 or (0xD800 <= _hex(rest[i + 2 : i + 6]) < 0xDC00 and len(rest) < i + 12):
                break  # an escape, or a surrogate pair, not whole yet
            i += 12 if 0xD800 <= _hex(rest[i + 2 : i + 6]) < 0xDC00 else 6
        else:
            if len(rest) < i + 2:
                break
            i += 2
        end = i
    try:
        return str(json.loads(f'"{rest[:end]}"', strict=False))
    except ValueError:
        return ""


def _hex(digits: str) -> int:
    try:
        return int(digits, 16)
    except ValueError:
        return -1


def _json_object(text: str) -> Mapping[str, Any] | None:
    """The JSON object `text` holds (around it, at most spaces or a code fence), or None."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        found = json.loads(text[start : end + 1])
    except ValueError:
        return None
    return found if isinstance(found, Mapping) else None
