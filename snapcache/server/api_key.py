"""The API key of the OpenAI text routes and snapcache's own: a bearer token, as OpenAI's clients send it.

The chat dialects take it as Anthropic's `x-api-key` header too (see `snapcache.server.chat.routes`).
Without a key set, every request passes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import HTTPException, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

__all__ = ["bearer_key_check"]

_BEARER = Security(HTTPBearer(auto_error=False))


def bearer_key_check(api_key: str | None) -> Callable[..., Awaitable[None]]:
    """A route dependency that answers 401 unless the request's bearer token is `api_key`."""

    async def authenticate(authorization: HTTPAuthorizationCredentials | None = _BEARER) -> None:
        if api_key is None or (authorization is not None and authorization.credentials == api_key):
            return
        raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Invalid API key")

    return authenticate
