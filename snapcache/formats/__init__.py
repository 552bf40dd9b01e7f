"""The checked file formats (snapshot file, pack file, bundle), the envelope they share, and the codec
their payloads use."""

from __future__ import annotations

from snapcache.formats import bundle_file, codec, envelope, pack_file, snapshot_file, threads

__all__ = ["bundle_file", "codec", "envelope", "pack_file", "snapshot_file", "threads"]
