"""snapcache: restore the llama.cpp state of prompts a local model has already read."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from snapcache.errors import (
    CorruptSnapshot,
    ImageError,
    InsecureDirectory,
    InvalidArgument,
    KeyMismatch,
    ModelError,
    RestoreError,
    SnapcacheError,
    StoreUnavailable,
)
from snapcache.formats.snapshot_file import FORMAT_VERSION as SNAPSHOT_FILE_FORMAT_VERSION
from snapcache.key import DEFAULT_SCOPE, SnapshotKey, prefix_hash
from snapcache.snapshot import Snapshot
from snapcache.tier_contract import EntryInfo
from snapcache.version import __version__ as __version__

if TYPE_CHECKING:
    from snapcache.llama.exactness.fingerprint import model_fingerprint
    from snapcache.llama.hook.cache_hook import CacheHook
    from snapcache.llama.hook.cached import CachedLlama, attach, detach
    from snapcache.llama.hook.miss import MissExplanation
    from snapcache.llama.setup.loader import load_llama
    from snapcache.llama.stored.bundle import export_bundle, import_bundle
    from snapcache.llama.stored.reports import RestoreInfo
    from snapcache.store import SavingsLedger, ScopeSavings, SnapshotStore, StoreStats


__all__ = [
    "DEFAULT_SCOPE",
    "SNAPSHOT_FILE_FORMAT_VERSION",
    "CacheHook",
    "CachedLlama",
    "CorruptSnapshot",
    "EntryInfo",
    "ImageError",
    "InsecureDirectory",
    "InvalidArgument",
    "KeyMismatch",
    "MissExplanation",
    "ModelError",
    "RestoreError",
    "RestoreInfo",
    "SavingsLedger",
    "ScopeSavings",
    "SnapcacheError",
    "Snapshot",
    "SnapshotKey",
    "SnapshotStore",
    "StoreStats",
    "StoreUnavailable",
    "attach",
    "detach",
    "export_bundle",
    "import_bundle",
    "load_llama",
    "model_fingerprint",
    "prefix_hash",
]

# Imported on first use, so that the store never pays for importing llama_cpp.
_LAZY = {
    "SnapshotStore": "snapcache.store",
    "StoreStats": "snapcache.store",
    "SavingsLedger": "snapcache.store",
    "ScopeSavings": "snapcache.store",
    "CachedLlama": "snapcache.llama.hook.cached",
    "attach": "snapcache.llama.hook.cached",
    "detach": "snapcache.llama.hook.cached",
    "CacheHook": "snapcache.llama.hook.cache_hook",
    "RestoreInfo": "snapcache.llama.stored.reports",
    "MissExplanation": "snapcache.llama.hook.miss",
    "model_fingerprint": "snapcache.llama.exactness.fingerprint",
    "load_llama": "snapcache.llama.setup.loader",
    "export_bundle": "snapcache.llama.stored.bundle",
    "import_bundle": "snapcache.llama.stored.bundle",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapcache' has no attribute {name!r}")
    return getattr(import_module(module), name)
