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
(logged once per outage), and every failure is a miss or a write not made, counted in `stats()`.
Puts only queue (`remote.writes`): a slow Redis never holds up a completion.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from snapcache.errors import CorruptSnapshot, InvalidArgument
from snapcache.formats import codec
from snapcache.formats.snapshot_file import MacMismatch, decode, encode, mac_key, read_header
from snapcache.key import SnapshotKey, rolling_hash, validate_budget
from snapcache.remote.budget import FORGET, PUT, TOUCH, BudgetKeys
from snapcache.remote.writes import RemoteWrites
from snapcache.snapshot import Snapshot
from snapcache.tier import CatalogRow, EntryInfo, PayloadSource

log = logging.getLogger("snapcache")

__all__ = ["DEFAULT_REMOTE_BUDGET_BYTES", "DEFAULT_REMOTE_PREFIX", "RemoteStats", "RemoteTier"]

DEFAULT_REMOTE_PREFIX = "snapcache"
DEFAULT_REMOTE_BUDGET_BYTES = 4 << 30
# Redis refuses a bulk string over proto-max-bulk-len (512 MiB unless configured otherwise).
MAX_VALUE_BYTES = 512 << 20
_MAX_PREFIX_LENGTH = 100
_MAX_REMEMBERED = 10_000
# The most a value may expand when decoded: its bytes times this, and at least the minimum.
_MAX_EXPANSION = 64
_MIN_STATE_LIMIT = 1 << 20
# entries() reads this much of each value first: the head and the tokens of a block or a short prompt;
# a longer head is read again whole, up to _MAX_HEAD_READ.
_HEAD_READ = 8 << 10
_MAX_HEAD_READ = 1 << 20

# A connection refused, reset or timed out: the server is away or overloaded, so skip it a while.
_OUTAGES: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)

_T = TypeVar("_T")

_warned_lock = threading.Lock()
_warned_no_secret: set[str] = set()


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
        self.prefix = _validate_prefix(prefix)
        self.budget_bytes = validate_budget("budget_bytes", budget_bytes)
        for name, value in (("timeout_s", timeout_s), ("write_timeout_s", write_timeout_s)):
            if not 0 < value <= 60:
                raise InvalidArgument(f"{name} must lie in (0, 60] seconds, got {value!r}")
        if not 0 <= backoff_s <= 3600:
            raise InvalidArgument(f"backoff_s must lie in [0, 3600] seconds, got {backoff_s!r}")
        self.url = redact_url(url)
        self._reader = _client(url, timeout_s)
        self._writer = _client(url, write_timeout_s)
        self._keys = BudgetKeys.of(self.prefix)
        self._put_script = self._writer.register_script(PUT)
        self._forget_script = self._reader.register_script(FORGET)
        self._mac_key = None if secret is None else mac_key(secret)
        self._store_id = f"remote:{self.prefix}"
        self._level = codec.validate_level(compression_level)
        self._shuffle = bool(shuffle)
        self._backoff_s = float(backoff_s)
        self._lock = threading.Lock()
        self._down_until = 0.0  # time.monotonic() before which Redis is skipped
        self._down = False  # an outage was logged and has not ended yet
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
        ) | {"errors": 0, "skipped": 0}
        self._unauthenticated: set[str] = set()  # value keys found under another secret
        self._closed = False
        self._last_stamp = 0  # the last time of use recorded (ms), see _stamp
        # Where writes get their compressed states: a store with a disk tier shares them with it.
        self.payloads: PayloadSource | None = None
        if secret is None:
            _warn_no_secret(self.url, self.prefix)
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
        if self._closed:
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
        k = self._keys

        def records() -> list[Any]:
            pipe = self._reader.pipeline(transaction=False)
            pipe.hgetall(k.sizes)
            pipe.hgetall(k.priority)
            return list(pipe.execute())

        found = self._call("entries", records, None)
        if found is None:
            return []
        sizes: dict[bytes, bytes] = found[0]
        priorities: dict[bytes, bytes] = found[1]
        names = sorted(sizes)
        heads = self._heads(names, [_HEAD_READ] * len(names))
        if heads is None:
            return []
        longer = [i for i, head in enumerate(heads) if head is not None and len(head) == _HEAD_READ]
        if longer:
            again = self._heads([names[i] for i in longer], [_MAX_HEAD_READ] * len(longer))
            for i, head in zip(longer, again or [None] * len(longer), strict=True):
                heads[i] = head
        used = self._last_uses(names, priorities)
        rows: list[EntryInfo] = []
        for name, head in zip(names, heads, strict=True):
            size, priority = _int(sizes.get(name)), _int(priorities.get(name))
            if head is None or size is None or priority is None:
                continue
            try:
                info = read_header(io.BytesIO(head), size, mac_secret=self._mac_key)
            except (CorruptSnapshot, ValueError, OSError):  # damaged or foreign: a get deletes it
                continue
            if info.store_id != self._store_id or self.value_key(info.key).encode() != name:
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

    def stats(self) -> RemoteStats:
        """The namespace's figures from Redis (one round trip, unless backing off) and the counters."""
        reachable = False
        used = entries = maxmemory = None
        policy = None

        def figures() -> list[Any]:
            pipe = self._reader.pipeline(transaction=False)
            pipe.ping()
            pipe.get(self._keys.total)
            pipe.hlen(self._keys.sizes)
            pipe.info("memory")
            return list(pipe.execute(raise_on_error=False))

        found = self._call("stats", figures, None)
        if found is not None:
            pong, total, count, info = found
            reachable = pong is True
            used = int(total) if isinstance(total, bytes) and total.isdigit() else 0
            entries = int(count) if isinstance(count, int) else None
            if isinstance(info, dict):
                maxmemory = info.get("maxmemory") if isinstance(info.get("maxmemory"), int) else None
                policy = str(info["maxmemory_policy"]) if "maxmemory_policy" in info else None
        writes = self._writes
        with self._lock:
            counts = dict(self._counts)
        return RemoteStats(
            url=self.url,
            prefix=self.prefix,
            reachable=reachable,
            used_bytes=used,
            entries=entries,
            budget_bytes=self.budget_bytes,
            server_maxmemory=maxmemory,
            server_policy=policy,
            dropped_writes=0 if writes is None else writes.dropped,
            pending_writes=0 if writes is None else writes.pending,
            **counts,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued put was sent (or given up); False if `timeout` passed first."""
        return True if self._writes is None else self._writes.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Send what is queued (waiting at most `timeout`), then close the connections."""
        if self._closed:
            return
        if self._writes is not None:
            self._writes.close(timeout)
        self._closed = True
        for client in (self._reader, self._writer):
            try:
                client.close()
            except Exception as exc:  # closing must not fail the caller's shutdown
                log.debug("snapcache: closing the remote connection: %s", exc)

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
        source = self.payloads
        try:
            encoded = encode(
                snapshot,
                store_id=self._store_id,
                level=self._level,
                shuffle=self._shuffle,
                mac_secret=self._mac_key,
                payload=None if source is None else source(snapshot, self._level, self._shuffle),
            )
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

    def _heads(self, names: list[bytes], lengths: list[int]) -> list[bytes | None] | None:
        """The first `lengths` bytes of each value `names` (None for one that is gone)."""

        def fetch() -> list[Any]:
            pipe = self._reader.pipeline(transaction=False)
            for name, length in zip(names, lengths, strict=True):
                pipe.getrange(name, 0, length - 1)
            return list(pipe.execute(raise_on_error=False))

        found = self._call("entries", fetch, None)
        if found is None:
            return None
        return [head if isinstance(head, bytes) and head else None for head in found]

    def _last_uses(self, names: list[bytes], priorities: dict[bytes, bytes]) -> dict[bytes, float]:
        """When each of `names` was last used (seconds), from its priority's LRU set."""

        def fetch() -> list[Any]:
            pipe = self._reader.pipeline(transaction=False)
            for name in names:
                level = priorities.get(name, b"0").decode("ascii", "replace")
                pipe.zscore(self._keys.lru_prefix + level, name)
            return list(pipe.execute(raise_on_error=False))

        found = self._call("entries", fetch, None) or [None] * len(names)
        return {
            name: score / 1000 for name, score in zip(names, found, strict=True) if isinstance(score, float)
        }

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
        now = time.monotonic()
        with self._lock:
            if self._closed or now < self._down_until:
                self._counts["skipped"] += 1
                return default
        try:
            result = action()
        except _OUTAGES as exc:
            with self._lock:
                self._counts["errors"] += 1
                self._down_until = time.monotonic() + self._backoff_s
                first = not self._down
                self._down = True
            if first:
                log.warning(
                    "snapcache: remote tier %s unreachable (%s: %s); skipping it for %g s at a time",
                    self.url,
                    what,
                    exc,
                    self._backoff_s,
                )
            return default
        except redis.RedisError as exc:  # the server answered with an error: no reason to back off
            self._count("errors")
            log.warning("snapcache: remote tier %s refused %s: %s", self.url, what, exc)
            return default
        with self._lock:
            back = self._down
            self._down = False
        if back:
            log.warning("snapcache: remote tier %s reachable again", self.url)
        return result

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1


def _int(raw: object) -> int | None:
    """An integer record read back from Redis, or None."""
    try:
        return int(raw) if isinstance(raw, bytes) else None
    except ValueError:
        return None


def _priority(raw: object) -> int | None:
    """A priority read back from the records; None for none (or one no put could have written)."""
    try:
        return int(raw) if isinstance(raw, bytes) else None
    except ValueError:
        return None


def redact_url(url: str) -> str:
    """`url` without its password, for logs and reports."""
    if not isinstance(url, str) or not url:
        raise InvalidArgument(f"remote must be a redis:// URL, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + host))


def _client(url: str, timeout_s: float) -> redis.Redis:
    """A client whose every call ends within about `timeout_s`: no retries, no waiting to reconnect."""
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"remote URL {redact_url(url)!r} is invalid: {exc}") from None


def _validate_prefix(prefix: object) -> str:
    if (
        not isinstance(prefix, str)
        or not 1 <= len(prefix) <= _MAX_PREFIX_LENGTH
        or not prefix.isascii()
        or not prefix.isprintable()
        or " " in prefix
    ):
        raise InvalidArgument(
            f"prefix must be 1 to {_MAX_PREFIX_LENGTH} printable ASCII characters without spaces, "
            f"got {prefix!r}"
        )
    return prefix


def _warn_no_secret(url: str, prefix: str) -> None:
    """Once per server and namespace per process."""
    where = f"{url} ({prefix})"
    with _warned_lock:
        if where in _warned_no_secret:
            return
        _warned_no_secret.add(where)
    log.warning(
        "snapcache: the remote tier %s has no secret: anyone who can write to that Redis can plant "
        "states this process will load. Set SNAPCACHE_SECRET (or secret=) on every machine sharing it.",
        where,
    )
