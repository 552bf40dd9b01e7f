"""Tool calls parsed from a reply as it streams: content while no call can start, calls as they close."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from snapcache.server.tools._syntax import CallSyntax
from snapcache.server.tools._values import ParsedReply, ToolCall, ToolCallDelta, ToolCallDropped, new_call_id

# What a stream hands back: a piece of content, a piece of a call being written, a whole call, or a
# call announced and not made.
StreamItem = str | ToolCallDelta | ToolCall | ToolCallDropped


def content_of(item: StreamItem) -> str:
    """The content a whole reply shows for `item`: its text, or a dropped call's."""
    if isinstance(item, str):
        return item
    return item.text if isinstance(item, ToolCallDropped) else ""


def _held_length(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that a marker could still begin with."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


@dataclass(slots=True)
class _ObjectEnd:
    """Where a JSON object arriving in pieces ends: its depth, and whether it is inside a string."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    closed: bool = False

    def scan(self, text: str) -> int:
        """How many characters of `text` still belong to the object."""
        for at, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.closed = True
                    return at + 1
        return len(text)


@dataclass(slots=True)
class _Preview:
    """A call whose arguments are being streamed: what was announced and how far its text was sent."""

    index: int
    id: str
    name: str
    sent: int
    end: _ObjectEnd = field(default_factory=_ObjectEnd)


class ToolCallStream:
    """Fed text deltas of one reply; gives back content deltas and tool calls in order.

    Text that may be the start of a call marker is held back until it is known; whitespace just
    before a call and between calls is dropped. Where the format writes a call's name before its
    JSON arguments (Hermes/Qwen, Llama 3.x, Mistral's `[ARGS]`), `ToolCallDelta`s stream the
    arguments before the `ToolCall`; otherwise the call comes whole. A call that turns out malformed
    is given back as content, marker included (as a `ToolCallDropped` where its deltas announced
    it). Call `finish()` once the reply is over.
    """

    def __init__(self, syntax: CallSyntax | None) -> None:
        self._syntax = syntax
        self._buffer = ""
        self._marker: str | None = None  # the marker of the call region being read, if any
        self._space = ""  # whitespace before that marker: given back if the region is no call
        self._began = False  # anything but whitespace seen: a bare JSON call can no longer start
        self._after_call = False
        self._preview: _Preview | None = None
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[StreamItem]:
        """Take the next piece of the reply; return what is now known."""
        self._buffer += text
        return self._advance(final=False)

    def finish(self) -> list[StreamItem]:
        """The reply is over: return everything still held."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[StreamItem]:
        syntax = self._syntax
        if syntax is None:
            text, self._buffer = self._buffer, ""
            return [text] if text else []
        out: list[StreamItem] = []
        while True:
            if self._marker is None:
                if not self._read_content(syntax, out, final):
                    break
            elif not self._read_call(syntax, self._marker, out, final) or not self._buffer:
                break
        return [item for item in out if item != ""]

    def _read_content(self, syntax: CallSyntax, out: list[StreamItem], final: bool) -> bool:
        """Give back content up to the next marker; True when a call region was entered."""
        if self._after_call:
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return False
            self._after_call = False
        if not self._began and syntax.opens_with_json:
            stripped = self._buffer.lstrip()
            if not stripped and not final:
                return False
            if stripped.startswith("{"):
                self._enter("", self._buffer[: len(self._buffer) - len(stripped)], stripped)
                return True
        found = [(self._buffer.find(m), m) for m in syntax.markers if m in self._buffer]
        if found:
            at, marker = min(found)
            before = self._buffer[:at]
            content = before.rstrip()
            out.append(content)
            self._enter(marker, before[len(content) :], self._buffer[at + len(marker) :])
            return True
        if final:
            out.append(self._buffer.rstrip() if self.calls else self._buffer)
            self._buffer = ""
            return False
        cut = len(self._buffer) - _held_length(self._buffer, syntax.markers)
        while cut > 0 and self._buffer[cut - 1].isspace():
            cut -= 1
        content, self._buffer = self._buffer[:cut], self._buffer[cut:]
        out.append(content)
        self._began = self._began or bool(content.strip())
        return False

    def _enter(self, marker: str, space: str, rest: str) -> None:
        self._began = True
        self._marker, self._space, self._buffer = marker, space, rest

    def _read_call(self, syntax: CallSyntax, marker: str, out: list[StreamItem], final: bool) -> bool:
        """Read the open call region; True when it closed."""
        self._stream_arguments(syntax, marker, out)
        step = syntax.take(marker, self._buffer, final)
        if step is None:
            return False
        preview = self._preview
        if step.malformed:
            text = self._space + marker + self._buffer[: step.consumed]
            out.append(text if preview is None else ToolCallDropped(preview.index, preview.id, text))
        else:
            calls = list(step.calls)
            if preview is not None and calls:
                calls[0] = replace(calls[0], id=preview.id)  # the id its deltas announced
            elif preview is not None:
                out.append(ToolCallDropped(preview.index, preview.id, ""))
            out.extend(calls)
            self.calls.extend(calls)
            self._after_call = bool(calls) or self._after_call
        self._marker, self._space, self._preview = None, "", None
        self._buffer = self._buffer[step.consumed :]
        return True

    def _stream_arguments(self, syntax: CallSyntax, marker: str, out: list[StreamItem]) -> None:
        """Announce the call being written once its name is known, then pass on its arguments."""
        if self._preview is None:
            opening = syntax.opening(marker, self._buffer)
            if opening is None:
                return
            preview = _Preview(
                len(self.calls), opening.id or new_call_id(), opening.name, opening.arguments_at
            )
            out.append(ToolCallDelta(preview.index, preview.id, preview.name, ""))
            self._preview = preview
        preview = self._preview
        if preview.end.closed:
            return
        piece = self._buffer[preview.sent :]
        size = preview.end.scan(piece)
        if size:
            out.append(ToolCallDelta(preview.index, preview.id, preview.name, piece[:size]))
            preview.sent += size


def parse_reply(syntax: CallSyntax | None, text: str) -> ParsedReply:
    """The whole reply at once: its content and its calls."""
    stream = ToolCallStream(syntax)
    items = stream.feed(text) + stream.finish()
    content = "".join(content_of(item) for item in items)
    return ParsedReply(content.strip() if stream.calls else content, tuple(stream.calls))
