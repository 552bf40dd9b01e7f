"""The remote tier's connection to Redis: bounded clients, the URL without its password, the prefix
checked, and every call made through one place that backs off for a while after an outage."""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from snapcache.errors import InvalidArgument

log = logging.getLogger("snapcache")

__all__ = ["Connection", "redact_url", "validate_prefix", "warn_no_secret"]

_MAX_PREFIX_LENGTH = 100

# A connection refused, reset or timed out: the server is away or overloaded, so skip it a while.
_OUTAGES: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)

_T = TypeVar("_T")

_warned_lock = threading.Lock()
_warned_no_secret: set[str] = set()


class Connection:
    """A reader and a writer client on `url` (each call bounded by `timeout_s`, the writer's by
    `write_timeout_s`), and `call`, which skips Redis for `backoff_s` seconds after an outage."""

    def __init__(self, url: str, *, timeout_s: float, write_timeout_s: float, backoff_s: float) -> None:
        self.url = redact_url(url)
        self.reader = _client(url, timeout_s)
        self.writer = _client(url, write_timeout_s)
        self._backoff_s = float(backoff_s)
        self._lock = threading.Lock()
        self._down_until = 0.0  # time.monotonic() before which Redis is skipped
        self._down = False  # an outage was logged and has not ended yet
        self.closed = False
        self.errors = 0  # calls that failed (unreachable, timed out, refused by the server)
        self.skipped = 0  # calls not made while backing off (or closed)

    def call(self, what: str, action: Callable[[], _T], default: _T) -> _T:
        """`action()`, or `default` when Redis is being skipped or the call fails (logged, counted)."""
        now = time.monotonic()
        with self._lock:
            if self.closed or now < self._down_until:
                self.skipped += 1
                return default
        try:
            result = action()
        except _OUTAGES as exc:
            with self._lock:
                self.errors += 1
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
            with self._lock:
                self.errors += 1
            log.warning("snapcache: remote tier %s refused %s: %s", self.url, what, exc)
            return default
        with self._lock:
            back = self._down
            self._down = False
        if back:
            log.warning("snapcache: remote tier %s reachable again", self.url)
        return result

    def close(self) -> None:
        """Close both clients; every later `call` is skipped."""
        with self._lock:
            self.closed = True
        for client in (self.reader, self.writer):
            try:
                client.close()
            except Exception as exc:  # closing must not fail the caller's shutdown
                log.debug("snapcache: closing the remote connection: %s", exc)


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


def validate_prefix(prefix: object) -> str:
    """`prefix` if it can name a namespace in Redis keys, else InvalidArgument."""
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


def warn_no_secret(url: str, prefix: str) -> None:
    """Warn that values under no secret can be planted: once per server and namespace per process."""
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
