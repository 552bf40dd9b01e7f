"""What the server knows about the request being served, where the cache hook can reach it.

A completion runs on a worker thread that llama-cpp-python's server starts for it; the request's
context variables travel with it. The middleware puts one `RequestRecord` into that context; the
hook reads its scope from there and the monitor writes back what the completion restored, for the
response headers and the usage the middleware adds.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from snapcache.key import DEFAULT_SCOPE
from snapcache.llama.stored.reports import RestoreInfo

__all__ = ["RequestRecord", "current_record", "current_scope", "serving"]

_current: ContextVar[RequestRecord | None] = ContextVar("snapcache_request", default=None)


@dataclass(slots=True)
class RequestRecord:
    """One completion request: its scope, whether it asked for streamed usage, and what it reused."""

    scope: str = DEFAULT_SCOPE
    stream_usage: bool = False
    restore: RestoreInfo | None = None
    completion_tokens: int | None = None


def current_record() -> RequestRecord | None:
    return _current.get()


def current_scope() -> str:
    """The scope of the request being served (the default scope outside a request)."""
    record = _current.get()
    return record.scope if record is not None else DEFAULT_SCOPE


serving = _current
