"""What /openapi.json says of images: where each API takes them when the model is served with its
projector (the bytes described in words: a schema cannot hold a PNG), and none anywhere without one
(each a 400 that says to serve the model with `--mmproj`). See `openapi` for the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapcache.server.schema_rules import NOTHING, Document, refuse

__all__ = ["describe_images"]


_IMAGE_BLOCK = "#/components/schemas/ImageBlock"
_IMAGE_BYTES = "a PNG, JPEG, GIF or BMP image of at most 20 MiB and 35 million pixels"
_DATA_URL: Document = {
    "type": "string",
    "pattern": "^data:image/[a-z]+;base64,",
    "description": f"A base64 data URL of {_IMAGE_BYTES} (the server fetches nothing).",
}
_BASE64_IMAGES: Document = {
    "title": "Images",
    "description": f"Base64 texts, each {_IMAGE_BYTES}; they go before the text.",
    "anyOf": [{"type": "null"}, {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}],
}
_CHAT_IMAGE_PART: Document = {
    "type": "object",
    "required": ["type", "image_url"],
    "properties": {
        "type": {"const": "image_url"},
        "image_url": {
            "anyOf": [_DATA_URL, {"type": "object", "required": ["url"], "properties": {"url": _DATA_URL}}]
        },
    },
}
_RESPONSES_IMAGE_PART: Document = {
    "type": "object",
    "required": ["type", "image_url"],
    "properties": {"type": {"const": "input_image"}, "image_url": _DATA_URL},
}


def describe_images(
    document: Document, body_schema: Callable[[Document, str], Document | None], *, images: bool
) -> None:
    """Where each API takes images in `document`: described where the server reads them, else
    refused (each a 400 that says to serve the model with --mmproj); `body_schema` finds a path's
    request body."""
    schemas: Document = document.get("components", {}).get("schemas", {})
    messages = [schemas.get("Message")]  # Ollama's /api/chat messages
    generate = body_schema(document, "/api/generate")
    if not images:
        for schema in [*messages, generate]:
            if isinstance(schema, dict):
                refuse(schema, "images", NOTHING, "null or none: the model is served without --mmproj")
        _drop_refs(schemas, _IMAGE_BLOCK)
        return
    for schema in [*messages, generate]:
        if isinstance(schema, dict) and "images" in schema.get("properties", {}):
            schema["properties"]["images"] = _BASE64_IMAGES
    chat_part = schemas.get("OpenAIChatContentPart")
    if isinstance(chat_part, dict):
        chat_part["description"] = (
            "Text parts, an assistant's refusal, and a user's images; audio and files are a 400."
        )
        chat_part.setdefault("anyOf", []).append(_CHAT_IMAGE_PART)
    responses_part = schemas.get("ContentPart")
    if isinstance(responses_part, dict):
        responses_part["anyOf"] = [
            {key: value for key, value in responses_part.items() if key in ("properties", "required")},
            _RESPONSES_IMAGE_PART,
        ]
        responses_part.pop("properties", None)
        responses_part.pop("required", None)


def _drop_refs(node: Any, ref: str) -> None:
    """Take every choice that is a reference to `ref` (and its discriminator's entry) out of `node`."""
    if isinstance(node, list):
        for item in node:
            _drop_refs(item, ref)
        return
    if not isinstance(node, dict):
        return
    for key in ("oneOf", "anyOf"):
        if isinstance(node.get(key), list):
            node[key] = [
                item for item in node[key] if not (isinstance(item, dict) and item.get("$ref") == ref)
            ]
    mapping = (
        node.get("discriminator", {}).get("mapping") if isinstance(node.get("discriminator"), dict) else None
    )
    if isinstance(mapping, dict):
        for name in [name for name, target in mapping.items() if target == ref]:
            del mapping[name]
    for value in node.values():
        _drop_refs(value, ref)
