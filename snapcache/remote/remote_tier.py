"""The remote tier: snapshots in a Redis (or Valkey) server that several machines share.

A value is exactly the bytes of a local snapshot file (`formats.snapshot_file`): the same header, checksums
and, with a secret, HMAC, verified before anything is used. The header names the remote namespace
(`remote:<prefix>`) where a local file names its directory's store id, so a local file copied into
Redis is refused like a value copied from another key. Without a secret anyone who can write to the
Redis can plant a state that decodes as valid: the tier then logs a warning once.

Keys are `<prefix>:<model fingerprint>:<scope>:<key id>`, so one Redis serves several models and
teams (blocks sit under their prompt's scope); the budget's bookkeeping is in `remote.budget`.

Nothing a remote fault does reaches the caller: every call is bounded by short socket timeouts
(no retries), a connection failure or a timeout makes the tier skip Redis for `backoff_s` seconds
(logged once per outage; `remote.connection`), and every failure is a miss or a write not made,
counted in `stats()`. Puts only queue (`remote.writes`): a slow Redis never holds up a completion.
What the namespace holds is listed and summed up in `remote.listing`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from snapcache.errors import CorruptSnapshot, InvalidArgument
from snapcache.formats import codec
from snapcache.formats.compression import CodecChoice, PayloadSource
from snapcache.formats.snapshot_file import Encoding, MacMismatch, decode, mac_key
from snapcache.key import SnapshotKey, rolling_hash, validate_budget
from snapcache.remote import remote_listing
from snapcache.remote.budget import FORGET, PUT, TOUCH, BudgetKeys
from snapcache.remote.connection import Connection, validate_prefix, warn_no_secret
from snapcache.remote.remote_listing import RemoteStats
from snapcache.remote.writes import RemoteWrites
from snapcache.snapshot import Snapshot
from snapcache.tier_contract import CatalogRow, EntryInfo

log = logging.getLogger("snapcache")

_T = TypeVar("_T")

__all__ = ["DEFAULT_REMOTE_BUDGET_BYTES", "DEFAULT_REMOTE_PREFIX", "RemoteStats", "RemoteTier"]

DEFAULT_REMOTE_PREFIX = "snapcache"
DEFAULT_REMOTE_BUDGET_BYTES = 4 << 30
# Redis refuses a bulk string over proto-max-bulk-len (512 MiB unless configured otherwise).
MAX_VALUE_BYTES = 512 << 20
_MAX_REMEMBERED = 10_000
# The most a value may expand when decoded: its bytes times this, and at least the minimum.
_MAX_EXPANSION = 64
_MIN_STATE_LIMIT = 1 << 20


class RemoteTier:
    """Snapshots in a Redis server shared by machines: see the module docstring.

    `url` is a redis:// (or rediss://, unix://) URL. `secret` signs the values as it signs local
    files. `budget_bytes` bounds what this namespace holds in Redis. `timeout_s` bounds each call a
    lookup makes (connect, read and write alike); the background writer waits at most
    `write_timeout_s`. After a failure Redis is not asked again for `backoff_s` seconds. The write
    backlog holds at most `max_pending` snapshots and `max_pending_bytes` (the bytes bound is the one
    that matters: warming a 9K-token prompt on Gemma-3-270M queues about 140 blocks and 160 MB; the
    snapshots are mostly the ones the RAM tier holds anyway, not copies). `background=False`
    sends each put before returning (for tests and tools). Thread-safe.

    It honours the tier contract (`tier.Tier`) with two differences a shared Redis imposes: a put of
    a key Redis already holds at the same priority or higher is not sent again (whoever holds the
    prefix holds the same state; resending it would cost every machine the bandwidth), and with the
    background writer `put` only queues, so it returns True before Redis has decided. `used_bytes`,
    `len()` and `entries()` describe the whole namespace, whichever process wrote it; `evictions`
    counts this process's. A figure Redis cannot be asked for reads as 0 (or no entries).
    """

    name = "remote"

    def __init__(
        self,
        url: str,
        *,
        secret: bytes | None = None,
        prefix: str = DEFAULT_REMOTE_PREFIX,
        budget_bytes: int = DEFAULT_REMOTE_BUDGET_BYTES,
        timeout_s: float = 0.1,
        write_timeout_s: float = 2.0,
        backoff_s: float = 5.0,
        max_pending: int = 4096,
        max_pending_bytes: int = 1 << 30,
        compression_level: int = codec.DEFAULT_LEVEL,
        shuffle: bool = codec.DEFAULT_SHUFFLE,
        background: bool = True,
    ) -> None:
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise InvalidArgument("secret must be non-empty bytes or None")
        self.prefix = validate_prefix(prefix)
        self.budget_bytes = validate_budget("budget_bytes", budget_bytes)
        for name, value in (("timeout_s", timeout_s), ("write_timeout_s", write_timeout_s)):
            if not 0 < value <= 60:
                raise InvalidArgument(f"{name} must lie in (0, 60] seconds, got {value!r}")
        if not 0 <= backoff_s <= 3600:
            raise InvalidArgument(f"backoff_s must lie in [0, 3600] seconds, got {backoff_s!r}")
        self._redis = Connection(
            url, timeout_s=timeout_s, write_timeout_s=write_timeout_s, backoff_s=backoff_s
        )
        self.url = self._redis.url
        self._reader = self._redis.reader
        self._writer = self._redis.writer
        self._keys = BudgetKeys.of(self.prefix)
        self._put_script = self._writer.register_script(PUT)
        self._forget_script = self._reader.register_script(FORGET)
        self._mac_key = None if secret is None else mac_key(secret)
        self._store_id = f"remote:{self.prefix}"
        # Always compressed: a network is slower than any decode (formats.compression).
        codecs = CodecChoice("zstd", level=compression_level, shuffle=shuffle)
        self._encoding = Encoding(self._store_id, codecs, self._mac_key)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            (
                "hits",
                "misses",
                "writes",
                "already_held",
                "refused",
                "evictions",
                "rejected",
                "unauthenticated",
            ),
            0,
        )
        self._unauthenticated: set[str] = set()  # value keys found under another secret
        self._last_stamp = 0  # the last time of use recorded (ms), see _stamp
        # Where writes get their compressed states: a store with a disk tier shares them with it.
        self.payloads: PayloadSource | None = None
        if secret is None:
            warn_no_secret(self.url, self.prefix)
        self._writes: RemoteWrites | None = None
        if background:
            self._writes = RemoteWrites(
                self.write, max_items=max_pending, max_bytes=max(0, max_pending_bytes)
            )

    # -- what the store calls -----------------------------------------------------------------

    def value_key(self, key: SnapshotKey) -> str:
        """The Redis key of `key`'s value."""
        return f"{self.prefix}:{key.model_fingerprint}:{key.user_scope}:{key.id}"

    def catalog_key(self, model_fingerprint: str, scope: str) -> str:
        """The Redis key of the catalog of one fingerprint and scope."""
        return f"{self.prefix}:#catalog:{model_fingerprint}:{scope}"

    @property
    def used_bytes(self) -> int:
        """The bytes of the values the namespace holds, by the budget's records (0 if unreadable)."""
        total = self._call("used_bytes", lambda: self._reader.get(self._keys.total), None)
        return int(total) if isinstance(total, bytes) and total.isdigit() else 0

    @property
    def evictions(self) -> int:
        """Values this process's puts evicted."""
        with self._lock:
            return self._counts["evictions"]

    def __len__(self) -> int:
        found = self._call("len", lambda: self._reader.hlen(self._keys.sizes), 0)
        return found if isinstance(found, int) else 0

    def __contains__(self, key: object) -> bool:
        return isinstance(key, SnapshotKey) and self.held(key)

    def put(self, snapshot: Snapshot) -> bool:
        """Queue `snapshot` for the background writer (True), or without one send it now: whether
        Redis holds it then. False once closed."""
        if self._redis.closed:
            return False
        if self._writes is None:
            return self.write(snapshot)
        self._writes.submit(snapshot)
        return True

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The verified snapshot under `key`, or None (absent, unreachable, or failing verification)."""
        name = self.value_key(key)

        def fetch() -> Any:
            pipe = self._reader.pipeline(transaction=False)
            pipe.get(name)
            keys = self._keys.with_value(name)
            # EVAL, not EVALSHA: a pipeline running a registered script asks first whether the server
            # has it, a round trip more; the server caches the script by its hash either way.
            pipe.eval(TOUCH, len(keys), *keys, self._stamp())
            return pipe.execute()[0]

        data = self._call("get", fetch, None)
        if not isinstance(data, bytes):
            self._count("misses")
            return None
        snapshot = self._verify(key, name, data)
        self._count("misses" if snapshot is None else "hits")
        return snapshot

    def get_many(self, keys: Sequence[SnapshotKey]) -> list[Snapshot | None]:
        """`get` of each of `keys`, in order, in one round trip (a pipeline of a GET and a TOUCH per
        key): a record's blocks cost one network wait, not one each."""
        if not keys:
            return []
        names = [self.value_key(key) for key in keys]

        def fetch() -> list[Any]:
            pipe = self._reader.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            stamp = self._stamp()
            for name in names:
                value_keys = self._keys.with_value(name)
                pipe.eval(TOUCH, len(value_keys), *value_keys, stamp)
            return list(pipe.execute(raise_on_error=False)[: len(names)])

        found = self._call("get", fetch, [None] * len(names))
        snapshots: list[Snapshot | None] = []
        for key, name, data in zip(keys, names, found, strict=True):
            snapshot = self._verify(key, name, data) if isinstance(data, bytes) else None
            self._count("misses" if snapshot is None else "hits")
            snapshots.append(snapshot)
        return snapshots

    def catalog(self, model_fingerprint: str, scope: str) -> list[CatalogRow]:
        """The (token_count, prefix_hash, rolling_hash) of every snapshot and record Redis holds in one
        fingerprint and scope (not blocks): candidates for a longest-prefix lookup, to be verified
        when read. Malformed rows are left out; empty when Redis cannot be asked."""
        name = self.catalog_key(model_fingerprint, scope)
        found: Any = self._call("catalog", lambda: self._reader.hvals(name), None)
        rows: list[CatalogRow] = []
        for raw in found if isinstance(found, list) else []:
            parts = raw.split() if isinstance(raw, bytes) else []
            if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
                rows.append((int(parts[0]), parts[1].decode("ascii", "replace"), int(parts[2])))
        return rows

    def held(self, key: SnapshotKey) -> bool:
        """Whether Redis holds a value under `key` that this tier has not found unauthenticated (no
        verification, nothing marked as used; False when Redis cannot be asked)."""
        name = self.value_key(key)
        with self._lock:
            if name in self._unauthenticated:
                return False
        return bool(self._call("held", lambda: self._reader.exists(name), 0))

    def held_priority(self, key: SnapshotKey) -> int | None:
        """The priority recorded for `key` in the budget's records, or None."""
        name = self.value_key(key)
        return _priority(
            self._call("held_priority", lambda: self._reader.hget(self._keys.priority, name), None)
        )

    def remove(self, key: SnapshotKey) -> bool:
        """Delete `key`'s value and its records; True if Redis held either."""
        name = self.value_key(key)
        found = self._call("remove", lambda: self._forget_script(keys=self._keys.with_value(name)), 0)
        return bool(found)

    def entries(self) -> list[EntryInfo]:
        """One row per value the namespace holds whose head verifies as this namespace's (its MAC
        aside): read from each value's head and the budget's records, a few round trips in all."""
        return remote_listing.entries(
            self._redis, self._keys, mac_key=self._mac_key, store_id=self._store_id, value_key=self.value_key
        )

    def stats(self) -> RemoteStats:
        """The namespace's figures from Redis (one round trip, unless backing off) and the counters."""
        with self._lock:
            counts = dict(self._counts)
        return remote_listing.stats(
            self._redis,
            self._keys,
            prefix=self.prefix,
            budget_bytes=self.budget_bytes,
            counts=counts,
            writes=self._writes,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued put was sent (or given up); False if `timeout` passed first."""
        return True if self._writes is None else self._writes.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Send what is queued (waiting at most `timeout`), then close the connections."""
        if self._redis.closed:
            return
        if self._writes is not None:
            self._writes.close(timeout)
        self._redis.close()

    # -- the writer ---------------------------------------------------------------------------

    def write(self, snapshot: Snapshot) -> bool:
        """Encode and store `snapshot` now, unless Redis holds it already at its priority or higher;
        True if Redis holds it then (never raises for Redis)."""
        key = snapshot.key
        name = self.value_key(key)
        with self._lock:
            trusted = name not in self._unauthenticated
        held = _priority(self._call("held", lambda: self._writer.hget(self._keys.priority, name), None))
        if trusted and held is not None and held >= snapshot.priority:
            self._count("already_held")
            return True
        try:
            encoded = self._encoding.encode(snapshot, self.payloads)
        except (CorruptSnapshot, ValueError) as exc:
            log.warning("snapcache: snapshot %s not sent to the remote tier: %s", snapshot.key.id[:16], exc)
            return False
        if encoded.size > min(self.budget_bytes, MAX_VALUE_BYTES):
            self._count("refused")
            return False
        row = "" if key.is_block else f"{key.token_count} {key.prefix_hash} {rolling_hash(snapshot.tokens)}"
        keys = [*self._keys.with_value(name), self.catalog_key(key.model_fingerprint, key.scope)]
        value = b"".join(encoded.parts)
        args: list[bytes | str | int] = [
            value,
            snapshot.priority,
            self._stamp(),
            self.budget_bytes,
            row,
        ]
        result = self._call("put", lambda: self._put_script(keys=keys, args=args), None)
        if not isinstance(result, list) or len(result) != 2:
            return False
        stored, evicted = int(result[0]), int(result[1])
        with self._lock:
            self._counts["writes" if stored else "refused"] += 1
            self._counts["evictions"] += evicted
            self._unauthenticated.discard(name)
        return bool(stored)

    # -- internals ------------------------------------------------------------------------------

    def _stamp(self) -> str:
        """A time of use to record (ms), later than every one this tier recorded before: two uses
        within one millisecond keep their order (Redis would otherwise order them by key name)."""
        with self._lock:
            self._last_stamp = max(int(time.time() * 1000), self._last_stamp + 1)
            return str(self._last_stamp)

    def _verify(self, key: SnapshotKey, name: str, data: bytes) -> Snapshot | None:
        """The snapshot `data` holds if it verifies as `key`'s; a damaged or foreign value is deleted,
        one authenticated under another secret (or none) is kept for the processes that have it."""
        try:
            # A value claims its own decompressed size; KV states hardly compress (1.1-1.5x), so a
            # claim far beyond its bytes is a crafted value, refused before any memory is taken.
            limit = max(_MIN_STATE_LIMIT, _MAX_EXPANSION * len(data))
            return decode(
                data, key=key, store_id=self._store_id, mac_secret=self._mac_key, max_state_bytes=limit
            )
        except MacMismatch as exc:
            with self._lock:
                self._counts["unauthenticated"] += 1
                first = name not in self._unauthenticated
                if len(self._unauthenticated) >= _MAX_REMEMBERED:
                    self._unauthenticated.clear()
                self._unauthenticated.add(name)
            if first:
                log.warning(
                    "snapcache: remote value %s is a miss and was kept: %s (check the secret: "
                    "SNAPCACHE_SECRET or secret=)",
                    key.id[:16],
                    exc,
                )
            return None
        except (CorruptSnapshot, ValueError, ArithmeticError) as exc:  # a crafted value is a miss too
            self._count("rejected")
            log.warning(
                "snapcache: remote value %s failed verification and was deleted: %s", key.id[:16], exc
            )
            self._call("discard", lambda: self._forget_script(keys=self._keys.with_value(name)), 0)
            return None

    def _call(self, what: str, action: Callable[[], _T], default: _T) -> _T:
        """`action()`, or `default` when Redis is being skipped or the call fails (logged, counted)."""
        return self._redis.call(what, action, default)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1


def _priority(raw: object) -> int | None:
    """A priority read back from the records; None for none (or one no put could have written)."""
    try:
        return int(raw) if isinstance(raw, bytes) else None
    except ValueError:
        return None
