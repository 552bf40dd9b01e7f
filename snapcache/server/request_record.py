"""What the server knows about the request being served, where the cache hook can reach it.

A completion runs on a worker thread that the server starts for it; the request's context variables
travel with it. The middleware (text completions) or the chat engine puts one `RequestRecord` into
that context; the hook reads its scope from there and the monitor writes back what the completion
restored, for the response headers (`reuse_headers`) and the usage.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from snapcache.key import DEFAULT_SCOPE
from snapcache.llama.stored.reports import RestoreInfo

__all__ = [
    "RESTORED_HEADER",
    "SOURCE_HEADER",
    "TIMING_HEADER",
    "RequestRecord",
    "current_record",
    "current_scope",
    "serving",
]

RESTORED_HEADER = b"x-snapcache-restored-tokens"
SOURCE_HEADER = b"x-snapcache-source"
# W3C Server Timing: where the time to the first token went (batched requests), in milliseconds.
TIMING_HEADER = b"server-timing"

_current: ContextVar[RequestRecord | None] = ContextVar("snapcache_request", default=None)


@dataclass(slots=True)
class RequestRecord:
    """One completion request: its scope, whether it asked for streamed usage, and what it reused."""

    scope: str = DEFAULT_SCOPE
    stream_usage: bool = False
    restore: RestoreInfo | None = None
    completion_tokens: int | None = None

    def reuse_headers(self) -> list[tuple[bytes, bytes]]:
        """The response headers that say what the request reused: the tokens restored and the tier
        they came from ("none" where nothing was), and on the batched path where the time to its
        first token went (`Server-Timing`); none before its prompt was read."""
        restore = self.restore
        if restore is None:
            return []
        headers = [
            (RESTORED_HEADER, str(restore.restored_tokens).encode()),
            (SOURCE_HEADER, (restore.source or "none").encode()),
        ]
        if restore.phases is not None:
            timing = ", ".join(
                f"{name.replace('_', '-')};dur={seconds * 1000:.1f}"
                for name, seconds in restore.phases.as_dict().items()
            )
            headers.append((TIMING_HEADER, timing.encode()))
        return headers


def current_record() -> RequestRecord | None:
    return _current.get()


def current_scope() -> str:
    """The scope of the request being served (the default scope outside a request)."""
    record = _current.get()
    return record.scope if record is not None else DEFAULT_SCOPE


serving = _current
