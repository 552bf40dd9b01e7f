"""Every error snapcache raises derives from SnapcacheError; each also subclasses the builtin it resembles."""

from __future__ import annotations


class SnapcacheError(Exception):
    """Base class of all snapcache errors."""


class InvalidArgument(SnapcacheError, ValueError):
    """An argument to the public API is out of range or of the wrong kind."""


class ImageError(InvalidArgument):
    """Bytes that are not an image mtmd may decode: another format, damaged, or too large. `image`:
    which of a chat's images it is (from 0, in the order the messages hold them), where known."""

    def __init__(self, message: str, *, image: int | None = None) -> None:
        super().__init__(message)
        self.image = image


class KeyMismatch(InvalidArgument):
    """The tokens given with a snapshot do not hash to its key."""


class CorruptSnapshot(SnapcacheError, ValueError):
    """A stored snapshot failed its header, checksum or MAC check."""


class StoreUnavailable(SnapcacheError, OSError):
    """The cache directory cannot be created, opened or written."""


class InsecureDirectory(StoreUnavailable, PermissionError):
    """The cache directory is writable by other users and the caller did not opt in."""


class ModelError(SnapcacheError, RuntimeError):
    """A model cannot be loaded, fingerprinted or used for a snapshot."""


class RestoreError(SnapcacheError, RuntimeError):
    """llama.cpp refused a snapshot; the sequence was cleared."""
