"""The llama.cpp adapter: fingerprint a model and context, capture and restore one sequence's state."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from snapcache.llama.exactness.adapters import set_control_vector, set_lora_adapters
from snapcache.llama.exactness.fingerprint import file_fingerprint, model_fingerprint
from snapcache.llama.exactness.support import unsupported_reason
from snapcache.llama.setup.loader import check_gguf_file, load_llama, route_llama_cpp_log
from snapcache.llama.state.sequences import (
    CapturedState,
    can_truncate,
    can_truncate_to,
    capture_sequence,
    restore_sequence,
    truncate_sequence,
)
from snapcache.llama.templates.chat_templates import GEMMA3_TEMPLATE, gemma3_chat_handler

if TYPE_CHECKING:
    from snapcache.llama.hook.cached import CachedLlama, attach, detach

__all__ = [
    "GEMMA3_TEMPLATE",
    "CachedLlama",
    "CapturedState",
    "attach",
    "can_truncate",
    "can_truncate_to",
    "capture_sequence",
    "check_gguf_file",
    "detach",
    "file_fingerprint",
    "gemma3_chat_handler",
    "load_llama",
    "model_fingerprint",
    "restore_sequence",
    "route_llama_cpp_log",
    "set_control_vector",
    "set_lora_adapters",
    "truncate_sequence",
    "unsupported_reason",
]


def __getattr__(name: str) -> Any:
    if name in ("CachedLlama", "attach", "detach"):
        return getattr(import_module("snapcache.llama.hook.cached"), name)
    raise AttributeError(f"module 'snapcache.llama' has no attribute {name!r}")
