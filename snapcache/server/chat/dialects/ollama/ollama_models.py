"""Ollama's model routes for the one served model: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`.

The model is listed under its served name (`--model-alias`, else its file's name); `/api/show` and
`/api/ps` answer for any name asked, as the chat routes serve any name with the one model. `digest`
is the model's snapcache fingerprint (an id, as clients use it: not a SHA-256 of the file), and
`capabilities` says `tools` for every model, since tool calls work with any chat template (see
`ChatEngine`), and `vision` for a model served with its projector (`--mmproj`). `/api/version`
gives the Ollama API version these routes follow.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from snapcache.server.served_model import ServedModel

__all__ = ["OLLAMA_API_VERSION", "model_details", "running", "shown", "tags"]

# The Ollama release whose API these routes follow (call ids and streamed tool calls included).
OLLAMA_API_VERSION = "0.12.0"
_KEPT_FOR = timedelta(days=365 * 100)  # the served model is never unloaded


def model_details(model: ServedModel) -> dict[str, Any]:
    family = model.architecture
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else [],
        "parameter_size": model.parameter_size,
        "quantization_level": model.quantization,
    }


def tags(model: ServedModel) -> dict[str, Any]:
    """`/api/tags`: the model list, of one."""
    entry = {
        "name": model.name,
        "model": model.name,
        "modified_at": _time(model.modified_at),
        "size": model.size,
        "digest": model.fingerprint,
        "details": model_details(model),
    }
    return {"models": [entry]}


def shown(model: ServedModel, name: str) -> dict[str, Any]:
    """`/api/show` of `name` (served by the one model)."""
    return {
        "modelfile": f"FROM {model.path.name}\n",
        "parameters": f"num_ctx {model.n_ctx}",
        "template": model.chat_template,
        "details": model_details(model),
        "model_info": model.typed_metadata(),
        "capabilities": ["completion", "tools", *(["vision"] if model.reads_images else [])],
        "modified_at": _time(model.modified_at),
        "model": name or model.name,
    }


def running(model: ServedModel) -> dict[str, Any]:
    """`/api/ps`: the model, loaded."""
    entry = {
        "name": model.name,
        "model": model.name,
        "size": model.size,
        "digest": model.fingerprint,
        "details": model_details(model),
        "expires_at": _time(datetime.now(timezone.utc) + _KEPT_FOR),
        "size_vram": model.size if model.on_gpu else 0,
        "context_length": model.n_ctx,
    }
    return {"models": [entry]}


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
