"""The remote tier: snapshots in a Redis (or Valkey) server that machines share, under a budget kept there."""

from __future__ import annotations

from snapcache.remote.remote_tier import RemoteStats, RemoteTier

__all__ = ["RemoteStats", "RemoteTier"]
