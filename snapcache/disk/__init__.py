"""The disk tier: snapshot and pack files under a byte budget, a SQLite index, repair, the cache directory."""

from __future__ import annotations

from snapcache.disk.cache_dir import DirectoryReport, default_cache_dir, inspect_store_dir
from snapcache.disk.disk_tier import Change, DiskTier, Miss
from snapcache.disk.repair import CheckReport

__all__ = [
    "Change",
    "CheckReport",
    "DirectoryReport",
    "DiskTier",
    "Miss",
    "default_cache_dir",
    "inspect_store_dir",
]
