"""Talk to a running `snapcache serve`: warm a prompt there (`snapcache warm --server URL`)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from .command_errors import CliError

API_KEY_ENV = "SNAPCACHE_API_KEY"
# Reading a long prompt on a laptop CPU can take minutes; the server answers when it is done.
_WARM_TIMEOUT_S = 3600.0


def warm_on_server(
    url: str, text: str, *, scope: str, priority: int, raw: bool, api_key: str | None
) -> dict[str, Any]:
    """POST the prompt to the server's /snapcache/warm; the report `snapcache warm` prints."""
    body = {"prompt" if raw else "system": text, "scope": scope, "priority": priority}
    answer = _post(_endpoint(url, "/snapcache/warm"), body, api_key or os.environ.get(API_KEY_ENV))
    return {
        "key": answer.get("key"),
        "scope": answer.get("scope", scope),
        "priority": answer.get("priority", priority),
        "token_count": answer.get("token_count"),
        "state_bytes": answer.get("state_bytes"),
        "stored_bytes": None,
        "seconds": answer.get("seconds"),
        "from_cache": answer.get("from_cache"),
        "exactness": answer.get("exactness"),
        "server": url,
    }


def _endpoint(url: str, path: str) -> str:
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise CliError(f"--server must be an http:// or https:// URL, got {url!r}")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + path


def _post(url: str, body: dict[str, Any], api_key: str | None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=_WARM_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise CliError(f"the server refused: {_server_message(exc)}") from None
    except urllib.error.URLError as exc:
        raise CliError(f"cannot reach the server at {url}: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise CliError(f"no valid answer from the server at {url}: {exc}") from None
    if not isinstance(answer, dict):
        raise CliError(f"no valid answer from the server at {url}")
    return answer


def _server_message(exc: urllib.error.HTTPError) -> str:
    """The error message in an OpenAI-style or FastAPI-style error body, else the HTTP status."""
    try:
        document = json.loads(exc.read())
    except (OSError, ValueError):
        return f"HTTP {exc.code}"
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict) and error.get("message"):
            return f"{error['message']} (HTTP {exc.code})"
        if document.get("detail"):
            return f"{document['detail']} (HTTP {exc.code})"
    return f"HTTP {exc.code}"
