"""GBNF grammars that hold a reply to tool calls in the model's own format (a call is required).

A grammar starts with the format's marker: where the marker is one token of the model's vocabulary
(`<tool_call>`, `[TOOL_CALLS]`...), that token itself (`<[id]>`), so the model writes the special
token its template taught it, never the same text spelled in other tokens. JSON formats (Hermes/Qwen,
Llama 3.x, Mistral) constrain the name and the arguments by the tools' JSON schemas, as
llama-cpp-python's converter turns them into rules (a schema it cannot take: any object); formats
whose arguments are not JSON (FunctionGemma, Gemma 4, Qwen3-Coder's XML) constrain the marker, the
name and the closing marker, and leave the arguments free.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from snapcache.server.tools._gemma import GemmaSyntax
from snapcache.server.tools._mistral import MistralSyntax
from snapcache.server.tools._qwen_xml import QwenXmlSyntax
from snapcache.server.tools._syntax import CallSyntax

_log = logging.getLogger("snapcache")

# Returns the id of the one token a text is in the model's vocabulary, or None.
TokenOf = Callable[[str], int | None]

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


class _ReadableLiterals(SchemaConverter):
    """llama-cpp-python's JSON-schema converter with literals llama.cpp's parser reads: its own escape
    only quotes and line ends, so a constant holding a backspace or form feed (JSON's `\\b`, `\\f`)
    made a grammar llama.cpp refused, and a backslash in one was read as an escape."""

    def _format_literal(self, text: str) -> str:
        return literal(text)


_Converter: Any = _ReadableLiterals


def schema_gbnf(schema: Mapping[str, Any]) -> str:
    """The GBNF of a JSON schema, its object keys in their order (not sorted)."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "schema"), "")
    return str(converter.format_grammar())


_MISTRAL_ID: dict[str, Any] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}


_LITERAL_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """`text` as a GBNF string literal: llama.cpp's parser knows only the escapes written here (not
    JSON's `\\b` or `\\f`), so every other character that does not print is a `\\u` or `\\U`."""
    return '"' + "".join(_literal_char(c) for c in text) + '"'


def _literal_char(c: str) -> str:
    escaped = _LITERAL_ESCAPES.get(c)
    if escaped is not None:
        return escaped
    if c.isprintable():
        return c
    return f"\\u{ord(c):04X}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08X}"


def _char_class(chars: str, negated: bool) -> str:
    escaped = "".join(c if c.isalnum() and c.isascii() else f"\\u{ord(c):04X}" for c in sorted(set(chars)))
    return f"[{'^' if negated else ''}{escaped}]"


class _Rules:
    """The rules of one grammar: those of JSON schemas (llama-cpp-python's converter) and our own."""

    def __init__(self, token_of: TokenOf) -> None:
        # The tool's name before its arguments, the id last: the order the templates render.
        order = {"name": 0, "arguments": 1, "parameters": 1, "id": 2}
        self._converter = _Converter(prop_order=order, allow_fetch=False, dotall=False, raw_pattern=False)
        self._token_of = token_of
        self._schemas = 0

    def add(self, name: str, rule: str) -> str:
        return str(self._converter._add_rule(name, rule))

    def schema(self, schema: Mapping[str, Any], name: str) -> str:
        """The rule of a JSON schema."""
        self._schemas += 1
        resolved = self._converter.resolve_refs(json.loads(json.dumps(schema)), f"schema-{self._schemas}")
        return str(self._converter.visit(resolved, name))

    def marker(self, text: str) -> str:
        """The marker as its one token where the vocabulary has it so, else as text."""
        token = self._token_of(text)
        return f"<[{token}]>" if token is not None else literal(text)

    def until(self, name: str, end: str) -> str:
        """Any text that does not hold `end`, then `end` (an automaton over the characters of `end`)."""
        fallback = [0] * (len(end) + 1)
        for i in range(1, len(end)):
            k = fallback[i]
            while k and end[i] != end[k]:
                k = fallback[k]
            fallback[i + 1] = k + 1 if end[i] == end[k] else 0

        def state(k: int) -> str:
            return f"{name}-{k}"

        for k in range(len(end)):
            alternatives, onward = [], ""
            for char in sorted(set(end)):
                j = k
                while j and end[j] != char:
                    j = fallback[j]
                after = j + 1 if end[j] == char else 0
                if after:
                    onward += char
                    alternatives.append(literal(char) + ("" if after == len(end) else f" {state(after)}"))
            alternatives.append(f"{_char_class(onward, negated=True)} {state(0)}")
            self.add(state(k), " | ".join(alternatives))
        return state(0)

    def arguments(self, tool: Any, name: str) -> str:
        """The rule of a tool's arguments: its schema where the converter takes it, else any object."""
        parameters = dict(getattr(tool, "parameters", None) or _ANY_OBJECT)
        try:
            scratch = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            scratch.visit(scratch.resolve_refs(json.loads(json.dumps(parameters)), "check"), "check")
        except Exception as exc:
            _log.info("tool %r: its argument schema cannot be a grammar (%s): any object", tool.name, exc)
            parameters = _ANY_OBJECT
        return self.schema(parameters, name)

    def text(self, root: str) -> str:
        self._converter._rules["root"] = root
        return str(self._converter.format_grammar())


def _key(name: str) -> str:
    """A JSON object key and its colon, spaced as llama-cpp-python's converter spaces them."""
    return f'{literal(json.dumps(name))} space ":" space'


def _json_calls(rules: _Rules, tools: Sequence[Any], arguments_key: str, *, with_id: bool = False) -> str:
    """A rule for one JSON call of any of `tools`: `{"name": ..., <arguments_key>: {...}}` (and an
    `"id"` of 9 letters and digits, as Mistral's templates write it)."""
    alternatives = []
    for i, tool in enumerate(tools):
        call = f'"{{" space {_key("name")} {literal(json.dumps(tool.name))} space "," space '
        call += f"{_key(arguments_key)} {rules.arguments(tool, f'arguments-{i}')}"
        if with_id:
            call += f' "," space {_key("id")} {rules.schema(_MISTRAL_ID, "call-id")}'
        alternatives.append(rules.add(f"call-{i}", f'{call} "}}"'))
    return rules.add("call", " | ".join(alternatives))


def call_grammar(
    format_name: str,
    syntax: CallSyntax | None,
    tools: Sequence[Any],
    *,
    parallel: bool,
    token_of: TokenOf,
) -> str | None:
    """The GBNF text of a reply that is one call (several where `parallel` and the format allows)
    of one of `tools` (objects like ToolSpec), written as the format `format_name` writes calls (see
    `ToolFormat`); None for a format without calls, or no tools."""
    if not tools or syntax is None:
        return None
    rules = _Rules(token_of)
    if format_name == "hermes":
        call = rules.add(
            "tool-call",
            f'{rules.marker("<tool_call>")} "\\n" {_json_calls(rules, tools, "arguments")} "\\n" '
            f"{rules.marker('</tool_call>')}",
        )
        return rules.text(f'{call} ("\\n" {call})*' if parallel else call)
    if format_name == "llama3":
        # One call a turn: Llama 3.x templates refuse more.
        return rules.text(_json_calls(rules, tools, "parameters"))
    if isinstance(syntax, MistralSyntax):
        return rules.text(_mistral(rules, syntax, tools, parallel))
    if isinstance(syntax, GemmaSyntax):
        body = rules.add("body", f'([^<] | {rules.marker(syntax.quote)})* "}}"')
        names = " | ".join(literal(tool.name) for tool in tools)
        call = rules.add(
            "tool-call",
            f'{rules.marker(syntax.markers[0])} "call:" ({names}) "{{" {body} {rules.marker(syntax.closing)}',
        )
        return rules.text(f"{call}+" if parallel else call)
    if isinstance(syntax, QwenXmlSyntax):
        call = rules.add("tool-call", _xml_call(rules, syntax, tools))
        return rules.text(f'{call} ("\\n" {call})*' if parallel else call)
    return None


def _mistral(rules: _Rules, syntax: MistralSyntax, tools: Sequence[Any], parallel: bool) -> str:
    marker = rules.marker("[TOOL_CALLS]")
    if not syntax.named:  # [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]
        call = _json_calls(rules, tools, "arguments", with_id=True)
        more = f' ("," space {call})*' if parallel else ""
        return f'{marker} "[" {call}{more} "]"'
    call_id = f" {rules.marker('[CALL_ID]')} [a-zA-Z0-9]{{9}}" if syntax.call_ids else ""
    alternatives = [
        f"{literal(tool.name)}{call_id} {rules.marker('[ARGS]')} {rules.arguments(tool, f'arguments-{i}')}"
        for i, tool in enumerate(tools)
    ]
    call = rules.add("tool-call", f"{marker} ({' | '.join(alternatives)})")
    return f"{call}+" if parallel else call


def _xml_call(rules: _Rules, syntax: QwenXmlSyntax, tools: Sequence[Any]) -> str:
    """`<tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n...</function>\\n</tool_call>`,
    the keys those of the tool's schema, the values free text."""
    value = rules.until("value", "\n</parameter>\n")
    functions = []
    for i, tool in enumerate(tools):
        properties = (getattr(tool, "parameters", None) or {}).get("properties") or {}
        keys = " | ".join(literal(key) for key in properties) or "[^>\\n]+"
        parameter = rules.add(f"parameter-{i}", f'"<parameter=" ({keys}) ">\\n" {value}')
        opening = literal(f"<function={tool.name}>\n")
        functions.append(rules.add(f"function-{i}", f'{opening} {parameter}* "</function>"'))
    opening, closing = rules.marker(syntax.markers[0]), rules.marker(syntax.closing)
    return f'{opening} "\\n" ({" | ".join(functions)}) "\\n" {closing}'
