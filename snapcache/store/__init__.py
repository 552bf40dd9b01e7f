"""SnapshotStore: the façade over the RAM, disk and remote tiers, and what it keeps in memory and reports."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from snapcache.store.inputs import resolve_secret
from snapcache.store.savings import MIN_TIMED_TOKENS, SavingsLedger, ScopeSavings
from snapcache.store.snapshot_store import DEFAULT_DIRECTORY, SnapshotStore, StoreEntry, StoreStats

if TYPE_CHECKING:
    from snapcache.disk import DirectoryReport
    from snapcache.remote import RemoteStats

__all__ = [
    "DEFAULT_DIRECTORY",
    "MIN_TIMED_TOKENS",
    "DirectoryReport",
    "RemoteStats",
    "SavingsLedger",
    "ScopeSavings",
    "SnapshotStore",
    "StoreEntry",
    "StoreStats",
    "resolve_secret",
]

# What the store returns from its tiers, imported on first use: a RAM-only store never loads the
# disk tier, and the remote tier needs redis, an optional dependency.
_LAZY = {"DirectoryReport": "snapcache.disk", "RemoteStats": "snapcache.remote"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapcache.store' has no attribute {name!r}")
    return getattr(import_module(module), name)
