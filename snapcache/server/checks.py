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

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import LlamaGrammar
from llama_cpp.server.types import (
    CreateChatCompletionRequest,
    CreateCompletionRequest,
    CreateEmbeddingRequest,
    DetokenizeInputRequest,
    TokenizeInputRequest,
)
from pydantic import BaseModel, ValidationError

from snapcache.server.errors import BadRequest

__all__ = ["CHAT_PATH", "COMPLETION_PATHS", "ModelLimits", "RequestChecks", "parse_body"]

CHAT_PATH = "/v1/chat/completions"
COMPLETION_PATHS = frozenset({CHAT_PATH, "/v1/completions", "/v1/engines/copilot-codex/completions"})
EMBEDDINGS_PATH = "/v1/embeddings"
DETOKENIZE_PATH = "/extras/detokenize"
_MODELS: dict[str, type[BaseModel] | None] = {
    CHAT_PATH: CreateChatCompletionRequest,
    "/v1/completions": CreateCompletionRequest,
    "/v1/engines/copilot-codex/completions": CreateCompletionRequest,
    EMBEDDINGS_PATH: CreateEmbeddingRequest,
    "/extras/tokenize": TokenizeInputRequest,
    "/extras/tokenize/count": TokenizeInputRequest,
    DETOKENIZE_PATH: DetokenizeInputRequest,
    "/snapcache/warm": None,  # its body: FastAPI validates it against snapcache's own model (a 422)
}


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
        document = json.loads(data, parse_constant=_refuse_constant)
    except _NotJson as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc} is not a JSON number") from None
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
            self._check_token_ids(request["tokens"], "tokens")
        if path not in COMPLETION_PATHS:
            return None
        chat = path == CHAT_PATH
        if chat and request.get("messages", []) == []:
            raise BadRequest("messages must hold at least one message", param="messages")
        prompt = request.get("prompt")
        if not chat and isinstance(prompt, list) and len(prompt) > 1:
            raise BadRequest(
                "prompt: one prompt per request (a list of one string is accepted)", param="prompt"
            )
        self._check_logprobs(request, chat)
        self._check_logit_bias(request)
        self._check_grammars(request, chat)
        changes = {name: 0.0 for name in _ZERO_WHEN_NULL if name in request and request[name] is None}
        limit = self._token_limit(request, chat)
        if limit is not None:
            changes["max_tokens"] = limit
        return {**request, **changes} if changes else None

    def _check_token_ids(self, tokens: list[int], param: str) -> None:
        n_vocab = self._limits.n_vocab
        for token in tokens:
            if not 0 <= token < n_vocab:
                raise BadRequest(
                    f"{param}: token id {token} is outside the vocabulary (0 to {n_vocab - 1})", param=param
                )

    def _check_logprobs(self, request: Mapping[str, Any], chat: bool) -> None:
        wanted = bool(request.get("logprobs")) if chat else request.get("logprobs") is not None
        if not wanted or self._limits.logits_all:
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

    def _check_logit_bias(self, request: Mapping[str, Any]) -> None:
        bias = request.get("logit_bias")
        if not bias or request.get("logit_bias_type") == "tokens":
            return
        ids = []
        for key in bias:
            try:
                ids.append(int(key))
            except ValueError:
                raise BadRequest(
                    f"logit_bias: key {key!r} is not a token id (or set logit_bias_type to 'tokens')",
                    param="logit_bias",
                ) from None
        self._check_token_ids(ids, "logit_bias")

    def _check_grammars(self, request: Mapping[str, Any], chat: bool) -> None:
        grammar = request.get("grammar")
        if grammar is not None:
            self._check_grammar(grammar, "grammar")
        if not chat:
            return
        response_format = request.get("response_format") or {}
        if response_format.get("type") == "json_object" and "schema" in response_format:
            self._check_schema(response_format["schema"], "response_format")
        tool = _chosen_tool(request)
        if tool is not None:
            self._check_schema(tool["function"]["parameters"], "tools")

    def _check_schema(self, schema: Any, param: str) -> None:
        """A JSON schema llama-cpp-python turns into a grammar (it falls back to any JSON when it
        cannot convert one, but hands llama.cpp whatever it converted)."""
        try:
            grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)._grammar
        except Exception:
            return
        self._check_grammar(grammar, param)

    def _check_grammar(self, grammar: str, param: str) -> None:
        vocab = self._limits.vocab
        if vocab is None:
            return
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
        if not sampler:
            raise BadRequest(
                f"{param}: llama.cpp cannot use this grammar (a syntax error, an undefined rule, left "
                "recursion, or no 'root' rule)",
                param=param,
            )
        llama_cpp.llama_sampler_free(sampler)

    def _token_limit(self, request: Mapping[str, Any], chat: bool) -> int | None:
        """The max_tokens to pass on when it must change (None: as it is)."""
        given = request.get("max_completion_tokens")
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, int) or given < 1:
                message = "max_completion_tokens must be a whole number of at least 1"
                raise BadRequest(message, param="max_completion_tokens")
            return None if request.get("max_tokens") == given else given
        if not chat and "max_tokens" not in request:
            return None  # a text completion without max_tokens gets 16, llama-cpp-python's and OpenAI's
        limit = request.get("max_tokens")
        if isinstance(limit, int) and limit > 0:
            return None
        return self._cap  # no limit (None, 0 or less is none to llama-cpp-python): the server's


# Nullable in llama-cpp-python's request models, but handed to llama.cpp's sampler as they are,
# where None is a ctypes TypeError (a 500); OpenAI's default is 0.
_ZERO_WHEN_NULL = ("presence_penalty", "frequency_penalty")


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJson(name)


def _validate(model: type[BaseModel], request: Mapping[str, Any]) -> None:
    """Checked against llama-cpp-python's own request model, whose route would answer a 500."""
    try:
        model.model_validate(request)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or None
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise BadRequest(
            f"{where or 'request'}: {first.get('msg', 'invalid value')}{more}", param=where
        ) from None


def _chosen_tool(request: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The tool a chat request forces, as llama-cpp-python's chat handler picks it (legacy
    `functions` and `function_call` win over `tools` and `tool_choice`); BadRequest if it is not
    among the tools."""
    functions = request.get("functions")
    tools = (
        [{"type": "function", "function": f} for f in functions]
        if functions is not None
        else request.get("tools")
    )
    choice = request.get("tool_choice")
    call = request.get("function_call")
    if isinstance(call, dict) and "name" in call:
        choice = {"type": "function", "function": {"name": call["name"]}}
    elif call in ("none", "auto"):
        choice = call
    if not isinstance(choice, dict) or tools is None:
        return None
    name = choice["function"]["name"]
    for tool in tools:
        if tool["function"]["name"] == name:
            return tool
    raise BadRequest(f"tool_choice: no tool named {name!r} among the tools", param="tool_choice")
