"""The context `snapcache serve` gives each request unless told: room for what agents send.

Claude Code and Codex send prompts of 20,000 to 25,000 tokens (their system text and tools), so
the server's default is 32,768 tokens, or the model's trained context where that is smaller.
"""

from __future__ import annotations

import ctypes
import os

import llama_cpp

__all__ = ["SERVE_N_CTX", "serve_context_size", "trained_context"]

SERVE_N_CTX = 32768


def trained_context(model_path: str | os.PathLike[str]) -> int | None:
    """The context the model was trained with (its GGUF's `context_length`); None where unknown.
    Reads the model's metadata and vocabulary only, not its weights."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(model_path), params)
    if not model:
        return None
    try:
        # A vocabulary-only load reads the metadata but not the hyperparameters (n_ctx_train is 0).
        architecture = _metadata(model, b"general.architecture")
        value = _metadata(model, architecture + b".context_length") if architecture else None
    finally:
        llama_cpp.llama_model_free(model)
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


def _metadata(model: object, key: bytes) -> bytes | None:
    buffer = ctypes.create_string_buffer(256)
    if llama_cpp.llama_model_meta_val_str(model, key, buffer, len(buffer)) < 0:
        return None
    return buffer.value


def serve_context_size(model_path: str | os.PathLike[str]) -> int:
    """`SERVE_N_CTX`, or the model's trained context where that is smaller."""
    trained = trained_context(model_path)
    return SERVE_N_CTX if trained is None else min(SERVE_N_CTX, trained)
