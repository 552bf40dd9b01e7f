"""What the server knows about one completion request: its scope, and what it reused.

The middleware makes the record of a text completion (from its `X-Snapcache-Scope` header) and keeps
it in the request's ASGI state, where the route finds it (`record_of`); a chat dialect's route makes
its own. The route hands it to the model engine with the completion, which writes into it what the
completion restored and generated, for the response headers (`reuse_headers`) and the usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from snapcache.key import DEFAULT_SCOPE
from snapcache.llama.stored.reports import RestoreInfo

__all__ = ["RECORD_STATE", "RESTORED_HEADER", "SOURCE_HEADER", "TIMING_HEADER", "RequestRecord", "record_of"]

RESTORED_HEADER = b"x-snapcache-restored-tokens"
SOURCE_HEADER = b"x-snapcache-source"
# W3C Server Timing: where the time to the first token went (batched requests), in milliseconds.
TIMING_HEADER = b"server-timing"

# Where the middleware keeps a text completion's record in the request's ASGI state.
RECORD_STATE = "snapcache_record"


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


def record_of(request: Request) -> RequestRecord:
    """The record the middleware made for `request` (one in the default scope if it made none)."""
    state: dict[str, Any] = request.scope.get("state") or {}
    record = state.get(RECORD_STATE)
    return record if isinstance(record, RequestRecord) else RequestRecord()
