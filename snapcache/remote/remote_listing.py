"""What the remote tier reports: one row per value its namespace holds (read from each value's head
and the budget's records) and its figures (`RemoteStats`)."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from snapcache.errors import CorruptSnapshot
from snapcache.formats.snapshot_file import read_header
from snapcache.key import SnapshotKey, rolling_hash
from snapcache.remote.budget import BudgetKeys
from snapcache.remote.connection import Connection
from snapcache.remote.writes import RemoteWrites
from snapcache.tier_contract import EntryInfo

__all__ = ["RemoteStats", "entries", "stats"]

# entries() reads this much of each value first: the head and the tokens of a block or a short prompt;
# a longer head is read again whole, up to _MAX_HEAD_READ.
_HEAD_READ = 8 << 10
_MAX_HEAD_READ = 1 << 20


@dataclass(frozen=True, slots=True)
class RemoteStats:
    """What the remote tier holds and how it has fared in this process."""

    url: str  # without a password
    prefix: str
    reachable: bool  # answered a PING just now (False while backing off after a failure)
    used_bytes: int | None  # None when it could not be read
    entries: int | None
    budget_bytes: int
    server_maxmemory: int | None  # the server's own limit (0: none), if it tells
    server_policy: str | None  # its maxmemory-policy
    hits: int
    misses: int
    writes: int  # values stored
    already_held: int  # puts not sent: Redis held the key already, at that priority or higher
    refused: int  # values the budget did not admit
    evictions: int  # values this process's puts evicted
    rejected: int  # values that failed verification (deleted from Redis)
    unauthenticated: int  # intact values under another secret (or none): misses, kept
    errors: int  # calls that failed (unreachable, timed out, refused by the server)
    skipped: int  # calls not made while backing off
    dropped_writes: int  # snapshots dropped unsent from a full write backlog
    pending_writes: int


def entries(
    redis: Connection,
    k: BudgetKeys,
    *,
    mac_key: bytes | None,
    store_id: str,
    value_key: Callable[[SnapshotKey], str],
) -> list[EntryInfo]:
    """One row per value the namespace holds whose head verifies as `store_id`'s (its MAC aside):
    read from each value's head and the budget's records, a few round trips in all."""

    def records() -> list[Any]:
        pipe = redis.reader.pipeline(transaction=False)
        pipe.hgetall(k.sizes)
        pipe.hgetall(k.priority)
        return list(pipe.execute())

    found = redis.call("entries", records, None)
    if found is None:
        return []
    sizes: dict[bytes, bytes] = found[0]
    priorities: dict[bytes, bytes] = found[1]
    names = sorted(sizes)
    heads = _heads(redis, names, [_HEAD_READ] * len(names))
    if heads is None:
        return []
    longer = [i for i, head in enumerate(heads) if head is not None and len(head) == _HEAD_READ]
    if longer:
        again = _heads(redis, [names[i] for i in longer], [_MAX_HEAD_READ] * len(longer))
        for i, head in zip(longer, again or [None] * len(longer), strict=True):
            heads[i] = head
    used = _last_uses(redis, k, names, priorities)
    rows: list[EntryInfo] = []
    for name, head in zip(names, heads, strict=True):
        size, priority = _int(sizes.get(name)), _int(priorities.get(name))
        if head is None or size is None or priority is None:
            continue
        try:
            info = read_header(io.BytesIO(head), size, mac_secret=mac_key)
        except (CorruptSnapshot, ValueError, OSError):  # damaged or foreign: a get deletes it
            continue
        if info.store_id != store_id or value_key(info.key).encode() != name:
            continue
        rows.append(
            EntryInfo(
                key=info.key,
                tier="remote",
                priority=priority,
                nbytes=size,
                state_bytes=info.state_bytes,
                created_at=info.created_at,
                last_used_at=used.get(name, info.created_at),
                rolling_hash=rolling_hash(info.tokens),
            )
        )
    return rows


def stats(
    redis: Connection,
    k: BudgetKeys,
    *,
    prefix: str,
    budget_bytes: int,
    counts: Mapping[str, int],
    writes: RemoteWrites | None,
) -> RemoteStats:
    """The namespace's figures from Redis (one round trip, unless backing off) and the counters."""
    reachable = False
    used = count = maxmemory = None
    policy = None

    def figures() -> list[Any]:
        pipe = redis.reader.pipeline(transaction=False)
        pipe.ping()
        pipe.get(k.total)
        pipe.hlen(k.sizes)
        pipe.info("memory")
        return list(pipe.execute(raise_on_error=False))

    found = redis.call("stats", figures, None)
    if found is not None:
        pong, total, held, info = found
        reachable = pong is True
        used = int(total) if isinstance(total, bytes) and total.isdigit() else 0
        count = int(held) if isinstance(held, int) else None
        if isinstance(info, dict):
            maxmemory = info.get("maxmemory") if isinstance(info.get("maxmemory"), int) else None
            policy = str(info["maxmemory_policy"]) if "maxmemory_policy" in info else None
    return RemoteStats(
        url=redis.url,
        prefix=prefix,
        reachable=reachable,
        used_bytes=used,
        entries=count,
        budget_bytes=budget_bytes,
        server_maxmemory=maxmemory,
        server_policy=policy,
        dropped_writes=0 if writes is None else writes.dropped,
        pending_writes=0 if writes is None else writes.pending,
        errors=redis.errors,
        skipped=redis.skipped,
        **counts,
    )


def _heads(redis: Connection, names: list[bytes], lengths: list[int]) -> list[bytes | None] | None:
    """The first `lengths` bytes of each value `names` (None for one that is gone)."""

    def fetch() -> list[Any]:
        pipe = redis.reader.pipeline(transaction=False)
        for name, length in zip(names, lengths, strict=True):
            pipe.getrange(name, 0, length - 1)
        return list(pipe.execute(raise_on_error=False))

    found = redis.call("entries", fetch, None)
    if found is None:
        return None
    return [head if isinstance(head, bytes) and head else None for head in found]


def _last_uses(
    redis: Connection, k: BudgetKeys, names: list[bytes], priorities: dict[bytes, bytes]
) -> dict[bytes, float]:
    """When each of `names` was last used (seconds), from its priority's LRU set."""

    def fetch() -> list[Any]:
        pipe = redis.reader.pipeline(transaction=False)
        for name in names:
            level = priorities.get(name, b"0").decode("ascii", "replace")
            pipe.zscore(k.lru_prefix + level, name)
        return list(pipe.execute(raise_on_error=False))

    found = redis.call("entries", fetch, None) or [None] * len(names)
    return {name: score / 1000 for name, score in zip(names, found, strict=True) if isinstance(score, float)}


def _int(raw: object) -> int | None:
    """An integer record read back from Redis, or None."""
    try:
        return int(raw) if isinstance(raw, bytes) else None
    except ValueError:
        return None
