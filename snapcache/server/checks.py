"""What a request body must be before it queues for the model, and the token cap it gets.

Every JSON route of llama-cpp-python's that `snapcache serve` exposes is checked here, because its
route handler answers a bad body with a 500 (a body that is not JSON, a field of the wrong type, a
value the model code refuses), and some values crash llama.cpp itself: a grammar it cannot parse, a
token id outside the vocabulary.

A request that gives no limit on the tokens to generate gets the server's cap, so that one client
cannot hold the model for minutes; `max_completion_tokens` (what current OpenAI clients send) wins
over `max_tokens`, as OpenAI has it.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import LlamaGrammar
from llama_cpp.server.types import (
    CreateCompletionRequest,
    CreateEmbeddingRequest,
    DetokenizeInputRequest,
    TokenizeInputRequest,
)
from pydantic import BaseModel, BeforeValidator, ValidationError

from snapcache.server.error_answers import BadRequest

__all__ = [
    "AS_JSON_INTEGER",
    "CHAT_PATH",
    "COMPLETION_PATHS",
    "MAX_GRAMMAR_NESTING",
    "ModelLimits",
    "RequestChecks",
    "check_grammar",
    "check_logit_bias",
    "grammar_problem",
    "parse_body",
    "schema_problem",
    "whole_numbers",
]

CHAT_PATH = "/v1/chat/completions"  # the chat engine's route checks its own bodies
COMPLETION_PATHS = frozenset({"/v1/completions", "/v1/engines/copilot-codex/completions"})
EMBEDDINGS_PATH = "/v1/embeddings"
DETOKENIZE_PATH = "/extras/detokenize"
_MODELS: dict[str, type[BaseModel] | None] = {
    "/v1/completions": CreateCompletionRequest,
    "/v1/engines/copilot-codex/completions": CreateCompletionRequest,
    EMBEDDINGS_PATH: CreateEmbeddingRequest,
    "/extras/tokenize": TokenizeInputRequest,
    "/extras/tokenize/count": TokenizeInputRequest,
    DETOKENIZE_PATH: DetokenizeInputRequest,
    "/snapcache/warm": None,  # its body: FastAPI validates it against snapcache's own model (a 422)
}


def whole_numbers(value: Any) -> Any:
    """`value` with every float that is a whole number made an int, at any depth.

    JSON has one number type (its schema's `integer` takes 2.0), while pydantic's strict mode, which
    keeps `true` and `"2"` from passing for numbers, takes no float for an int.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [whole_numbers(item) for item in value]
    return value


# llama.cpp parses a grammar's groups recursively, a stack frame a level: llama-cpp-python writes a
# string's maxLength as that many nested groups, and some 15,000 of them overflowed a thread's stack
# and killed the server (measured: 1,000 parse, 2,000 to 12,000 are refused, 20,000 crash).
MAX_GRAMMAR_NESTING = 1024

# An int field of a strict request model read as JSON's `integer` (2.0 included): the last part of
# its `Annotated`, after its constraints (which the schema shows only there).
AS_JSON_INTEGER = BeforeValidator(whole_numbers)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What the checks need to know of the served model. `vocab`: its llama_vocab pointer, which
    grammars are parsed against (None: grammars are not checked)."""

    n_vocab: int
    n_ctx: int
    logits_all: bool = False
    embeddings: bool = False
    vocab: Any = None

    @classmethod
    def of(cls, llm: llama_cpp.Llama) -> ModelLimits:
        return cls(
            n_vocab=int(llm.n_vocab()),
            n_ctx=int(llm.n_ctx()),
            logits_all=bool(getattr(llm, "_logits_all", False)),
            embeddings=bool(getattr(llm.context_params, "embeddings", False)),
            vocab=llm._model.vocab,
        )


def parse_body(data: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest saying why it is not one."""
    try:
        document = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotJson as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc} is not a JSON number") from None
    except _TooLarge as exc:
        raise BadRequest(f"the request body holds {exc}, a number too large for a float") from None
    except (ValueError, UnicodeDecodeError):
        what = "empty" if not data.strip() else "not valid JSON"
        raise BadRequest(f"the request body is {what}; send a JSON object") from None
    if not isinstance(document, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            "the request holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
        ) from None
    return document


class RequestChecks:
    """The checks and defaults of the JSON routes; `review` runs on a worker thread (it may parse a
    grammar)."""

    def __init__(self, limits: ModelLimits, max_tokens_default: int | None = None) -> None:
        self._limits = limits
        self._cap = max_tokens_default if max_tokens_default else None

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(_MODELS)

    def review(self, path: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """The request to pass on when it had to change (None: as it is); BadRequest when the model
        must not run it."""
        model = _MODELS[path]
        if model is None:
            return None
        _validate(model, request)
        if path == EMBEDDINGS_PATH and not self._limits.embeddings:
            raise BadRequest(
                "this server does not compute embeddings: snapcache serve loads its model for completions "
                "(llama.cpp's embedding mode cannot generate text); use a server started for embeddings",
                param="model",
                code="unsupported_endpoint",
            )
        if path == DETOKENIZE_PATH:
            _check_token_ids(request["tokens"], "tokens", self._limits)
        if path not in COMPLETION_PATHS:
            return None
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) > 1:
            raise BadRequest(
                "prompt: one prompt per request (a list of one string is accepted)", param="prompt"
            )
        self._check_logprobs(request)
        check_logit_bias(request.get("logit_bias"), request.get("logit_bias_type"), self._limits)
        if request.get("grammar") is not None:
            check_grammar(request["grammar"], self._limits)
        if request.get("min_tokens") and request.get("grammar") is not None:
            raise BadRequest(
                "min_tokens cannot be combined with grammar, whose grammar may end the answer sooner",
                param="min_tokens",
            )
        changes = {name: 0.0 for name in _ZERO_WHEN_NULL if name in request and request[name] is None}
        limit = self._token_limit(request)
        if limit is not None:
            changes["max_tokens"] = limit
        return {**request, **changes} if changes else None

    def _check_logprobs(self, request: Mapping[str, Any]) -> None:
        if request.get("logprobs") is None or self._limits.logits_all:
            return
        kept = self._limits.n_ctx * self._limits.n_vocab * 4
        raise BadRequest(
            "logprobs is not supported: snapcache serve loads the model without the logits of every "
            f"position (logits_all=False), which log-probabilities need; keeping them would hold "
            f"{self._limits.n_ctx} x {self._limits.n_vocab} floats ({kept / (1 << 20):.0f} MiB) for this "
            "model and context, and copy a row per token read",
            param="logprobs",
            code="unsupported_parameter",
        )

    def _token_limit(self, request: Mapping[str, Any]) -> int | None:
        """The max_tokens to pass on when it must change (None: as it is)."""
        given = request.get("max_completion_tokens")
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, int) or given < 1:
                message = "max_completion_tokens must be a whole number of at least 1"
                raise BadRequest(message, param="max_completion_tokens")
            return None if request.get("max_tokens") == given else given
        if "max_tokens" not in request:
            return None  # a text completion without max_tokens gets 16, llama-cpp-python's and OpenAI's
        limit = request.get("max_tokens")
        if isinstance(limit, int) and limit > 0:
            return None
        return self._cap  # no limit (None, 0 or less is none to llama-cpp-python): the server's


def check_grammar(grammar: str, limits: ModelLimits, param: str = "grammar") -> None:
    """BadRequest where llama.cpp cannot use the GBNF `grammar` with the model of `limits`."""
    problem = grammar_problem(grammar, limits.vocab)
    if problem is not None:
        raise BadRequest(f"{param}: {problem}", param=param)


def check_logit_bias(bias: Mapping[str, Any] | None, bias_type: str | None, limits: ModelLimits) -> None:
    """BadRequest for a logit bias whose keys are not the model's token ids (unless `bias_type` is
    "tokens": then they are texts, tokenized)."""
    if not bias or bias_type == "tokens":
        return
    ids = []
    for key in bias:
        if not (key.isascii() and key.isdigit()):
            raise BadRequest(
                f"logit_bias: key {key!r} is not a token id (or set logit_bias_type to 'tokens')",
                param="logit_bias",
            )
        ids.append(int(key))
    _check_token_ids(ids, "logit_bias", limits)


def _check_token_ids(tokens: list[int], param: str, limits: ModelLimits) -> None:
    for token in tokens:
        if not 0 <= token < limits.n_vocab:
            last = limits.n_vocab - 1
            raise BadRequest(
                f"{param}: token id {token} is outside the vocabulary (0 to {last})", param=param
            )


# Nullable in llama-cpp-python's request models, but handed to llama.cpp's sampler as they are,
# where None is a ctypes TypeError (a 500); OpenAI's default is 0.
_ZERO_WHEN_NULL = ("presence_penalty", "frequency_penalty")


class _NotJson(ValueError):
    pass


class _TooLarge(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJson(name)


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent, as a float; _TooLarge where it overflows one (1e400
    would be an infinity, which no sampler takes)."""
    number = float(text)
    if not math.isfinite(number):
        raise _TooLarge(text[:40])
    return number


def _validate(model: type[BaseModel], request: Mapping[str, Any]) -> None:
    """Checked against llama-cpp-python's own request model, whose route would answer a 500; strictly,
    as the schema documents it (`false` is no number, `"1"` no integer)."""
    try:
        model.model_validate(whole_numbers(request), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or None
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise BadRequest(
            f"{where or 'request'}: {first.get('msg', 'invalid value')}{more}", param=where
        ) from None


def grammar_problem(grammar: str, vocab: Any = None) -> str | None:
    """Why llama.cpp cannot use the GBNF `grammar` (root rule `root`), or None where it can.

    `vocab`: the model's llama_vocab (None: only the nesting is checked, and a grammar made from
    a JSON schema, which names no tokens, is parsed alone, as llama.cpp's own tests do).
    """
    depth = _nesting(grammar)
    if depth > MAX_GRAMMAR_NESTING:
        return (
            f"the grammar nests {depth} groups deep, deeper than llama.cpp's parser is given "
            f"({MAX_GRAMMAR_NESTING}; it recurses once a level, and a string's maxLength is a level "
            "a character)"
        )
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        return (
            "llama.cpp cannot use this grammar (a syntax error, an undefined rule, left recursion, "
            "no 'root' rule, or more repetition than it allows)"
        )
    llama_cpp.llama_sampler_free(sampler)
    return None


@functools.lru_cache(maxsize=256)
def _schema_problem(schema: str) -> str | None:
    try:
        grammar = LlamaGrammar.from_json_schema(schema, verbose=False)._grammar
    except Exception:
        return None
    return grammar_problem(grammar)


def schema_problem(schema: Any) -> str | None:
    """Why llama.cpp cannot use the grammar llama-cpp-python makes of the JSON schema `schema`
    (a tool's arguments, a response format), or None: where it can, and where llama-cpp-python makes
    none (keywords it does not support; a tool's arguments are then any JSON object)."""
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return _schema_problem(text)


def _nesting(grammar: str) -> int:
    """How deep the groups of a GBNF grammar nest (parentheses outside literals, classes, comments)."""
    depth = deepest = 0
    quote: str | None = None
    i = 0
    while i < len(grammar):
        char = grammar[i]
        if quote is not None:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in '"[':
            quote = "]" if char == "[" else char
        elif char == "#":
            end = grammar.find("\n", i)
            i = len(grammar) if end < 0 else end
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
        i += 1
    return deepest
