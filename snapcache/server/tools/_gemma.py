"""FunctionGemma and Gemma 4 calls: `<start_function_call>call:name{key:<escape>text<escape>,n:3}`
then `<end_function_call>`.

Not JSON: keys are bare, strings sit between two quote tokens (`<escape>`; Gemma 4 `<|"|>`), numbers,
booleans, lists and nested objects are written as in JSON. Gemma 4 wraps calls in `<|tool_call>` and
`<tool_call|>`. After its calls the model opens a response turn, which the caller should stop on.
"""

from __future__ import annotations

import re
from typing import Any

from snapcache.server.tools._syntax import Opening, Step
from snapcache.server.tools._values import ToolCall, compact_json, new_call_id

_NAME = re.compile(r"\s*call:([\w.\-]+)\s*\{")


class _Malformed(ValueError):
    pass


class _Reader:
    """A recursive-descent reader of the argument notation."""

    def __init__(self, text: str, quote: str) -> None:
        self.text = text
        self.quote = quote
        self.at = 0

    def _skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def _expect(self, char: str) -> None:
        self._skip()
        if not self.text.startswith(char, self.at):
            raise _Malformed(f"expected {char!r} at {self.at}")
        self.at += len(char)

    def _quoted(self) -> str:
        self.at += len(self.quote)
        end = self.text.find(self.quote, self.at)
        if end < 0:
            raise _Malformed("unterminated string")
        value, self.at = self.text[self.at : end], end + len(self.quote)
        return value

    def value(self) -> Any:
        self._skip()
        if self.text.startswith(self.quote, self.at):
            return self._quoted()
        if self.text.startswith("{", self.at):
            return self.members()
        if self.text.startswith("[", self.at):
            return self._items()
        return self._scalar()

    def members(self) -> dict[str, Any]:
        """An object; the reader stands on its `{`."""
        self._expect("{")
        result: dict[str, Any] = {}
        self._skip()
        if self.text.startswith("}", self.at):
            self.at += 1
            return result
        while True:
            self._skip()
            if self.text.startswith(self.quote, self.at):
                key = self._quoted()
            else:
                colon = self.text.find(":", self.at)
                if colon < 0:
                    raise _Malformed("key without value")
                key, self.at = self.text[self.at : colon].strip(), colon
            if not key:
                raise _Malformed("empty key")
            self._expect(":")
            result[key] = self.value()
            self._skip()
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            self._expect("}")
            return result

    def _items(self) -> list[Any]:
        self._expect("[")
        result: list[Any] = []
        self._skip()
        if self.text.startswith("]", self.at):
            self.at += 1
            return result
        while True:
            result.append(self.value())
            self._skip()
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            self._expect("]")
            return result

    def _scalar(self) -> Any:
        match = re.compile(r"[^,}\]]*").match(self.text, self.at)
        token = match.group(0).strip() if match else ""
        if not token:
            raise _Malformed(f"no value at {self.at}")
        self.at = match.end() if match else self.at
        literal = {"true": True, "false": False, "null": None}
        if token in literal:
            return literal[token]
        try:
            return int(token)
        except ValueError:
            pass
        try:
            return float(token)
        except ValueError:
            # A bare word where a quoted string belongs: kept as the string the model meant.
            return token


def parse_call(text: str, quote: str) -> ToolCall | None:
    """The call in `call:name{...}`, or None when the text is not one."""
    match = _NAME.match(text)
    if match is None:
        return None
    reader = _Reader(text, quote)
    reader.at = match.end() - 1
    try:
        arguments = reader.members()
    except _Malformed:
        return None
    if text[reader.at :].strip():
        return None
    return ToolCall(new_call_id(), match.group(1), compact_json(arguments))


class GemmaSyntax:
    """Calls between an opening and a closing token; a response-turn opener after them is dropped."""

    def __init__(self, open_call: str, close_call: str, quote: str, open_response: str) -> None:
        self.markers = (open_call, open_response)
        self.opens_with_json = False
        self._open_call = open_call
        self._close_call = close_call
        self._quote = quote

    @property
    def closing(self) -> str:
        """The token that closes a call."""
        return self._close_call

    @property
    def quote(self) -> str:
        """The token on both sides of a string value."""
        return self._quote

    def opening(self, marker: str, body: str) -> Opening | None:
        """None: the arguments are not JSON, so a call comes whole."""
        return None

    def take(self, marker: str, body: str, final: bool) -> Step | None:
        """Read one call up to its closing token; a response opener is consumed without a trace."""
        if marker != self._open_call:
            return Step((), 0)
        close = body.find(self._close_call)
        if close < 0 and not final:
            return None
        inside = body if close < 0 else body[:close]
        consumed = len(body) if close < 0 else close + len(self._close_call)
        call = parse_call(inside, self._quote)
        return Step((call,), consumed) if call else Step((), consumed, malformed=True)


FUNCTION_GEMMA = GemmaSyntax(
    "<start_function_call>", "<end_function_call>", "<escape>", "<start_function_response>"
)
GEMMA4 = GemmaSyntax("<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>")
