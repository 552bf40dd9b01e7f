"""The server's /openapi.json says what its checks answer: a 400 in OpenAI's error format."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

__all__ = ["document_errors"]

_ERROR_SCHEMA: dict[str, Any] = {
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
# llama-cpp-python documents a stream as one string; a client (and schemathesis) reads it as events.
_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
_NOT_FOUND = {
    "description": "No completion has run in this scope",
    "content": {"application/json": {"schema": _REF}},
}


def document_errors(app: FastAPI) -> None:
    """Add the 400 of every operation that takes a body or a parameter (and /snapcache/why's 404) to
    the schema FastAPI generates, and say what a streamed answer's events hold."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()
        document.setdefault("components", {}).setdefault("schemas", {})["ErrorDocument"] = _ERROR_SCHEMA
        for path, operations in document.get("paths", {}).items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                if method == "post" or operation.get("parameters"):
                    responses.setdefault("400", _BAD_REQUEST)
                if path == "/snapcache/why":
                    responses.setdefault("404", _NOT_FOUND)
                for answer in responses.values():
                    stream = answer.get("content", {}).get("text/event-stream")
                    if stream is not None:
                        stream["schema"] = {**stream.get("schema", {}), **_EVENT_SCHEMA}
        return document

    app.openapi = openapi  # type: ignore[method-assign]
