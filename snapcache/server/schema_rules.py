"""Rules the server's checks make, stated in JSON Schema for /openapi.json (`openapi.describe_api`):
a property refused but for some values, a grammar's format, token ids as a map's keys, no
`min_tokens` beside a grammar. Each changes a request body's schema in place.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "END",
    "GBNF",
    "GRAMMAR_FORMAT",
    "NOTHING",
    "decimal_below",
    "gbnf_grammar",
    "given",
    "no_min_tokens_with_a_grammar",
    "refuse",
    "token_ids_in_logit_bias",
]

Document = dict[str, Any]
# The end of a pattern, for JavaScript's reading and Python's alike (Python's `$` also matches before
# a last line break, and Python-based generators write one).
END = "(?!\\n)$"
# The string format of a grammar: llama.cpp's GBNF, with a `root` rule, that llama.cpp can parse.
GRAMMAR_FORMAT = "gbnf"
GBNF: Document = {"type": "string", "format": GRAMMAR_FORMAT}
# A list property that must be left out, null or empty.
NOTHING: Document = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


def refuse(schema: Document, name: str, allowed: Document, why: str) -> None:
    """Only `allowed` (with `why` in its description) for property `name`, where the schema has it."""
    prop = schema.get("properties", {}).get(name)
    if prop is None:
        return
    kept = {key: prop[key] for key in ("title", "description") if key in prop}
    kept["description"] = f"{kept.get('description', '')} Only {why}.".strip()
    schema["properties"][name] = {**kept, **copy.deepcopy(allowed)}


def gbnf_grammar(schema: Document) -> None:
    """`grammar` is GBNF that llama.cpp parses, with a `root` rule: the format says so."""
    grammar = schema.get("properties", {}).get("grammar")
    for choice in (grammar or {}).get("anyOf", ()):
        if choice.get("type") == "string":
            choice.update(GBNF)


def token_ids_in_logit_bias(schema: Document, n_vocab: int) -> None:
    """`logit_bias` keys are token ids of the vocabulary, unless `logit_bias_type` is "tokens"."""
    if "logit_bias" not in schema.get("properties", {}):
        return
    ids = {"type": "object", "propertyNames": {"pattern": decimal_below(n_vocab)}}
    schema.setdefault("allOf", []).append(
        {
            "if": given("logit_bias_type", {"const": "tokens"}),
            "else": {"properties": {"logit_bias": {"anyOf": [ids, {"type": "null"}]}}},
        }
    )


def no_min_tokens_with_a_grammar(schema: Document, grammars: list[Document]) -> None:
    """`min_tokens` only 0 where a grammar is given, as each of `grammars` describes a body that
    gives one: llama.cpp fails where a grammar ends before `min_tokens`."""
    if "min_tokens" not in schema.get("properties", {}):
        return
    for condition in grammars:
        schema.setdefault("allOf", []).append(
            {"if": condition, "then": {"properties": {"min_tokens": {"maximum": 0}}}}
        )


def given(name: str, value: Document) -> Document:
    """A body that gives `name`, as `value` describes it."""
    return {"required": [name], "properties": {name: value}}


def decimal_below(n: int) -> str:
    """A pattern of the decimal numbers 0 to n - 1 (leading zeros allowed)."""
    top = str(n - 1)
    shorter = len(top) - 1
    choices = ["[0-9]" if shorter == 1 else f"[0-9]{{1,{shorter}}}"] if shorter else []
    for i, digit in enumerate(top):
        low = 1 if i == 0 and len(top) > 1 else 0
        high = int(digit) - 1
        if high >= low:
            left = len(top) - i - 1
            rest = "" if left == 0 else "[0-9]" if left == 1 else f"[0-9]{{{left}}}"
            choices.append(top[:i] + (str(low) if high == low else f"[{low}-{high}]") + rest)
    choices.append(top)
    return f"^0*({'|'.join(choices)}){END}"
