"""The llama.cpp adapter: fingerprint a model and context, capture and restore one sequence's state."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from snapcache.llama.fingerprint import file_fingerprint, model_fingerprint
from snapcache.llama.state import (
    CapturedState,
    can_truncate,
    capture_sequence,
    restore_sequence,
    truncate_sequence,
)

if TYPE_CHECKING:
    from snapcache.llama.cached import CachedLlama

__all__ = [
    "CachedLlama",
    "CapturedState",
    "can_truncate",
    "capture_sequence",
    "file_fingerprint",
    "model_fingerprint",
    "restore_sequence",
    "truncate_sequence",
]


def __getattr__(name: str) -> Any:
    if name == "CachedLlama":
        return import_module("snapcache.llama.cached").CachedLlama
    raise AttributeError(f"module 'snapcache.llama' has no attribute {name!r}")
