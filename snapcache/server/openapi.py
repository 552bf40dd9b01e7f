"""The server's /openapi.json says what the server does: which routes it serves, what bodies they
accept, which answers they give, and whether they take credentials.

FastAPI generates the schema from the routes' request models; `describe_api` corrects it where the
server answers otherwise. The security schemes appear only when the server runs with an API key;
`/v1/embeddings` is left out where the model computes none (every request to it would get a 400);
a body the server refuses for a reason JSON Schema can state is invalid in the schema too (no
messages, logprobs without the logits they need, two prompts, a logit_bias key that is no token
id, min_tokens with a grammar, a scope or priority out of range, a warm request without exactly one
text, an Ollama request that would bypass the chat template, an image where the model is served
without its projector); a grammar has the `gbnf` format. With a projector, images are described
where each API takes them (what the bytes must be is said in words: a schema cannot hold a PNG).
Every operation documents its 400 in its API's error shape, and none documents a 422 where the
server answers 400 instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from snapcache.key import MAX_SCOPE_LENGTH
from snapcache.server.chat.dialects.chat_completions.chat_completions_protocol import ChatCompletionRequest
from snapcache.server.checks import ModelLimits
from snapcache.server.schema_images import describe_images
from snapcache.server.schema_rules import (
    END,
    GBNF,
    GRAMMAR_FORMAT,
    NOTHING,
    gbnf_grammar,
    given,
    no_min_tokens_with_a_grammar,
    refuse,
    token_ids_in_logit_bias,
)

__all__ = ["GRAMMAR_FORMAT", "describe_api"]

Document = dict[str, Any]

_ERROR_SCHEMA: Document = {
    "title": "ErrorDocument",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_REF = {"$ref": "#/components/schemas/ErrorDocument"}
_BAD_REQUEST = {
    "description": "The request cannot be served; the message says why",
    "content": {"application/json": {"schema": _REF}},
}
# FastAPI's own answer to a request without the key (llama-cpp-python's check raises it).
_UNAUTHORIZED = {
    "description": "The API key is missing or wrong",
    "content": {
        "application/json": {
            "schema": {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}}
        }
    },
}
# llama-cpp-python documents a stream as one string; a client (and schemathesis) reads it as events.
_EVENT_SCHEMA: Document = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
_NOT_FOUND = {
    "description": "No completion has run in this scope",
    "content": {"application/json": {"schema": _REF}},
}
# What `snapcache.key.validate_scope` takes (else a 400).
_SCOPE: Document = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_SCOPE_LENGTH,
    "pattern": f"^[^\\x00\\n\\r\\x1f]*{END}",
}
# The one route whose body FastAPI checks (a 422); the server checks the others' itself (a 400).
_VALIDATED_FORM = "/snapcache/warm"
_EMBEDDINGS_PATH = "/v1/embeddings"
_CHAT_PATH = "/v1/chat/completions"
# The Chat Completions request models, named apart from the other routes' in the components.
_CHAT = "OpenAIChat"
# A Chat Completions body that offers tools (either way): they hold its answer to a grammar.
_OFFERS_TOOLS: Document = {
    "anyOf": [
        {"required": ["functions"], "properties": {"functions": {"type": "array", "minItems": 1}}},
        {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
    ]
}
_QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
_CHAT_EXAMPLES: Document = {
    "chat": {"summary": "A chat", "value": {"model": "local", "messages": _QUESTION}},
    "json": {
        "summary": "An answer in JSON",
        "value": {"messages": _QUESTION, "response_format": {"type": "json_object"}},
    },
    "tools": {
        "summary": "A tool to call",
        "value": {
            "messages": _QUESTION,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "look_up",
                        "description": "Look a fact up",
                        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                    },
                }
            ],
        },
    },
    "grammar": {
        "summary": "An answer held to a grammar",
        "value": {"messages": _QUESTION, "grammar": 'root ::= "Paris" | "Lyon"', "max_tokens": 4},
    },
}


def describe_api(app: FastAPI, limits: ModelLimits, *, api_key: bool, images: bool = False) -> None:
    """Make `app.openapi()` say what the server does for the model of `limits` (see the module
    docstring); `api_key`: whether clients must send one; `images`: whether chats take images (the
    model is served with its projector)."""
    generate = app.openapi

    def openapi() -> Document:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()
        _describe(document, limits, api_key=api_key)
        describe_images(document, _body_schema, images=images)
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def _describe(document: Document, limits: ModelLimits, *, api_key: bool) -> None:
    components = document.setdefault("components", {})
    components.setdefault("schemas", {})["ErrorDocument"] = _ERROR_SCHEMA
    paths: Document = document.get("paths", {})
    if not limits.embeddings:
        paths.pop(_EMBEDDINGS_PATH, None)
    if not api_key:
        components.pop("securitySchemes", None)
    for path, operations in paths.items():
        for method, operation in operations.items():
            _describe_answers(path, method, operation, api_key=api_key)
    corrected: set[int] = set()  # two paths may share one request model
    for path, correct in _BODIES.items():
        schema = _body_schema(document, path)
        if schema is not None and id(schema) not in corrected:
            corrected.add(id(schema))
            correct(schema, limits)
    _chat_completions(document, limits)


def _ollama_generate(schema: Document, _limits: ModelLimits) -> None:
    """What `/api/generate` refuses: what would bypass the model's chat template (its images: see
    `_describe_images`)."""
    refuse(schema, "raw", {"anyOf": [{"const": False}]}, "false: prompts are rendered by the chat template")
    for name in ("suffix", "template"):
        refuse(schema, name, {"anyOf": [{"const": ""}, {"type": "null"}]}, "empty: the chat template renders")
    refuse(schema, "context", NOTHING, "null or none: send a conversation to /api/chat")


def _chat_completions(document: Document, limits: ModelLimits) -> None:
    """`POST /v1/chat/completions` takes the chat engine's request model (see
    `snapcache.server.chat.dialects.chat_completions`), with what the server refuses beyond it."""
    operation = document.get("paths", {}).get(_CHAT_PATH, {}).get("post")
    if operation is None:
        return
    mapping, definitions = models_json_schema(
        [(ChatCompletionRequest, "validation")], ref_template=f"#/components/schemas/{_CHAT}{{model}}"
    )
    schemas = document["components"]["schemas"]
    for name, schema in definitions.get("$defs", {}).items():
        schemas[_CHAT + name] = schema
    _as_the_engine_checks(schemas, limits)
    content = {"schema": mapping[(ChatCompletionRequest, "validation")], "examples": _CHAT_EXAMPLES}
    operation["requestBody"] = {"required": True, "content": {"application/json": content}}


def _as_the_engine_checks(schemas: Document, limits: ModelLimits) -> None:
    """What the engine's route refuses beyond its request model (each a 400)."""
    schema = schemas[_CHAT + "ChatCompletionRequest"]
    request = schema["properties"]
    request["messages"]["contains"] = {"properties": {"role": {"enum": ["user", "assistant", "tool"]}}}
    request["n"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 1}, {"type": "null"}]}
    refuse(schema, "logprobs", {"anyOf": [{"const": False}, {"type": "null"}]}, "false or null")
    gbnf_grammar(schema)
    token_ids_in_logit_bias(schema, limits.n_vocab)
    grammar = given("grammar", GBNF)
    response_format = given(
        "response_format",
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": ["json_object", "json_schema"]}},
        },
    )
    # Each holds the answer to a grammar: one at a time, and then no min_tokens (llama.cpp fails
    # where a grammar ends before it).
    text = {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"type": {"const": "text"}}}]}
    short = {"min_tokens": {"maximum": 0}}
    schema.setdefault("allOf", []).extend(
        [
            {
                "if": _OFFERS_TOOLS,
                "then": {"properties": {"grammar": {"type": "null"}, "response_format": text, **short}},
            },
            {"if": grammar, "then": {"properties": {"response_format": text, **short}}},
            {"if": response_format, "then": {"properties": short}},
        ]
    )
    schemas[_CHAT + "ResponseFormat"].setdefault("allOf", []).append(
        {
            "if": given("type", {"const": "json_schema"}),
            "then": {"required": ["json_schema"], "properties": {"json_schema": {"required": ["schema"]}}},
        }
    )
    message = schemas[_CHAT + "Message"]
    message.setdefault("allOf", []).append(
        {
            "if": given("role", {"const": "tool"}),
            "then": {
                "required": ["tool_call_id"],
                "properties": {"tool_call_id": {"type": "string", "minLength": 1}},
            },
        }
    )
    schemas[_CHAT + "ContentPart"] = {
        "description": "Text parts, and an assistant's refusal; images, audio and files are a 400.",
        "anyOf": [
            {
                "type": "object",
                "required": ["type", "text"],
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
            },
            {
                "type": "object",
                "required": ["type", "refusal"],
                "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
            },
        ],
    }


def _describe_answers(path: str, method: str, operation: Document, *, api_key: bool) -> None:
    responses: Document = operation.setdefault("responses", {})
    if not api_key:
        operation.pop("security", None)
        responses.pop("401", None)
    elif operation.get("security"):
        responses.setdefault("401", _UNAUTHORIZED)
    if path != _VALIDATED_FORM:
        responses.pop("422", None)
    if method == "post" or operation.get("parameters"):
        responses.setdefault("400", _BAD_REQUEST)
    if path == "/snapcache/why":
        responses.setdefault("404", _NOT_FOUND)
    for parameter in operation.get("parameters", ()):
        if parameter.get("name") == "scope":
            parameter["schema"] = {**parameter.get("schema", {}), **_SCOPE}
    for answer in responses.values():
        stream = answer.get("content", {}).get("text/event-stream")
        if stream is not None:
            stream["schema"] = {**stream.get("schema", {}), **_EVENT_SCHEMA}


def _body_schema(document: Document, path: str) -> Document | None:
    """The schema of the JSON body of `POST path` (the component it refers to), to correct in place."""
    operation = document.get("paths", {}).get(path, {}).get("post")
    if operation is None:
        return None
    schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if not isinstance(schema, dict):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        found = document.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[1])
        return found if isinstance(found, dict) else None
    return schema


def _completion(schema: Document, limits: ModelLimits) -> None:
    prompt = schema.get("properties", {}).get("prompt", {})
    for choice in prompt.get("anyOf", ()):
        if choice.get("type") == "array":
            choice["maxItems"] = 1
    if not limits.logits_all:
        refuse(schema, "logprobs", {"type": "null"}, "null: the model keeps no log-probabilities")
    token_ids_in_logit_bias(schema, limits.n_vocab)
    gbnf_grammar(schema)
    no_min_tokens_with_a_grammar(schema, [given("grammar", GBNF)])


def _warm(schema: Document, _limits: ModelLimits) -> None:
    scope = schema.get("properties", {}).get("scope")
    if scope is not None:
        scope.update(_SCOPE)
    # Exactly one of them given, not null; what `messages` warms is its leading system messages.
    texts = ("system", "messages", "prompt")
    given: dict[str, Document] = {
        "system": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "prefixItems": [
                {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {"role": {"enum": ["system", "developer"]}, "content": {"type": "string"}},
                }
            ],
        },
        "prompt": {"type": "string"},
    }
    schema["description"] = (
        f"{schema.get('description', '')}\n\nA 400 says why where the text is too short to be worth "
        "storing (chats with a system prompt share fewer than 64 tokens) or longer than the context."
    ).strip()
    schema["oneOf"] = [
        {
            "required": [name],
            "properties": {other: given[name] if other == name else {"type": "null"} for other in texts},
        }
        for name in texts
    ]


def _detokenize(schema: Document, limits: ModelLimits) -> None:
    tokens = schema.get("properties", {}).get("tokens", {}).get("items")
    if tokens is not None:
        tokens.update(minimum=0, maximum=limits.n_vocab - 1)


_BODIES: dict[str, Callable[[Document, ModelLimits], None]] = {
    "/api/generate": _ollama_generate,
    "/v1/completions": _completion,
    "/v1/engines/copilot-codex/completions": _completion,
    "/snapcache/warm": _warm,
    "/extras/detokenize": _detokenize,
}
