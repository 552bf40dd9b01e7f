"""The one error the commands raise for bad input, and the one-line text every error is shown as."""

from __future__ import annotations

import errno

from snapcache import (
    CorruptSnapshot,
    InsecureDirectory,
    ModelError,
    SnapcacheError,
    StoreUnavailable,
)


class CliError(Exception):
    """A problem with what the user asked for; shown as one line, exit status `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def describe(exc: BaseException) -> str:
    """One line that tells a user what went wrong, without a traceback."""
    if isinstance(exc, CliError):
        return exc.message
    if isinstance(exc, InsecureDirectory):
        return f"insecure cache directory: {_first_line(exc)}"
    if isinstance(exc, StoreUnavailable):
        return f"cache directory unavailable: {_first_line(exc)}"
    if isinstance(exc, CorruptSnapshot):
        return f"corrupt snapshot: {_first_line(exc)}"
    if isinstance(exc, ModelError):
        return f"model error: {_first_line(exc)}"
    if isinstance(exc, SnapcacheError):
        return _first_line(exc)
    if isinstance(exc, OSError):
        return _describe_os_error(exc)
    if isinstance(exc, MemoryError):
        return "out of memory"
    return f"unexpected {type(exc).__name__}: {_first_line(exc)}"


def _describe_os_error(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on device{where}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied{where}"
    reason = exc.strerror or _first_line(exc)
    return f"{reason}{where}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
