"""The checked file formats (snapshot file, pack file, bundle) and the codec their payloads use."""

from __future__ import annotations

from snapcache.formats import bundle_file, codec, pack_file, snapshot_file, threads

__all__ = ["bundle_file", "codec", "pack_file", "snapshot_file", "threads"]
