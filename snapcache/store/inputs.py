"""What callers hand the store, checked and copied once: the directory, the secret, state and logits."""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument
from snapcache.formats.compression import DEFAULT_COMPRESSION, Compression, validate_compression
from snapcache.key import SnapshotKey
from snapcache.snapshot import Buffer

if TYPE_CHECKING:
    from snapcache.remote import RemoteTier

_R = TypeVar("_R")
COMPRESSION_ENV = "SNAPCACHE_COMPRESSION"


class Default(enum.Enum):
    DIRECTORY = enum.auto()


DEFAULT_DIRECTORY = Default.DIRECTORY


def check_key(key: object) -> None:
    """InvalidArgument unless `key` is a SnapshotKey."""
    if not isinstance(key, SnapshotKey):
        raise InvalidArgument(f"key must be a SnapshotKey, got {type(key).__name__}")


def check_block_keys(keys: Iterable[object]) -> None:
    """InvalidArgument unless each of `keys` is the key of a block."""
    for key in keys:
        if not isinstance(key, SnapshotKey) or not key.is_block:
            raise InvalidArgument(f"not the key of a block: {key!r}")


def store_path(directory: str | os.PathLike[str] | Default | None) -> Path | None:
    """The disk tier's directory: the default one, a given path, or None for RAM only."""
    if directory is DEFAULT_DIRECTORY:
        from snapcache.disk import default_cache_dir

        return Path(default_cache_dir())
    if directory is None:
        return None
    if isinstance(directory, (str, os.PathLike)):
        return Path(directory)
    raise InvalidArgument(f"directory must be a path or None, got {directory!r}")


def resolve_secret(secret: bytes | str | None) -> bytes | None:
    """The secret given, else SNAPCACHE_SECRET, as bytes; None for none."""
    if secret is None:
        secret = os.environ.get("SNAPCACHE_SECRET") or None
    if isinstance(secret, str):
        secret = secret.encode()
    if secret is not None and not isinstance(secret, bytes):
        raise InvalidArgument("secret must be bytes, str or None")
    return secret or None


def resolve_remote(remote: _R) -> _R | str | None:
    """The remote tier given, else SNAPCACHE_REMOTE (a redis:// URL); None for none."""
    if remote is None:
        return os.environ.get("SNAPCACHE_REMOTE") or None
    if isinstance(remote, str) and not remote:
        raise InvalidArgument("remote must be a redis:// URL, a RemoteTier or None, got ''")
    return remote


def resolve_compression(compression: str | None) -> Compression:
    """The disk tier's compression given, else SNAPCACHE_COMPRESSION, else "auto"; InvalidArgument
    for another value."""
    if compression is not None:
        return validate_compression(compression)
    try:
        return validate_compression(os.environ.get(COMPRESSION_ENV) or DEFAULT_COMPRESSION)
    except InvalidArgument as exc:
        raise InvalidArgument(f"${COMPRESSION_ENV}: {exc}") from None


def copy_state(state: Buffer, *, owned: bool = False) -> bytes | memoryview:
    """One copy of the caller's buffer, since callers reuse theirs; kept as it is when `owned` (the
    caller handed it over) or `bytes` (nobody can write them): a save that built its buffers need
    not pay for a second copy."""
    try:
        view = memoryview(state)
    except TypeError:
        raise InvalidArgument(f"state_bytes must be bytes-like, got {type(state).__name__}") from None
    if view.nbytes == 0:
        raise InvalidArgument("state_bytes is empty")
    if type(state) is bytes:  # exactly bytes: a subclass may carry a mutable buffer of its own
        return state
    if owned and view.c_contiguous:
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    return view.tobytes()


def copy_logits(logits: npt.ArrayLike | None) -> npt.NDArray[np.float32] | None:
    """A read-only float32 copy of one row of logits, or None."""
    if logits is None:
        return None
    try:
        array = np.array(logits, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"logits must be an array of floats: {exc}") from None
    if array.ndim != 1 or array.size == 0:
        raise InvalidArgument(f"logits must be a non-empty one-dimensional array, got shape {array.shape}")
    array.flags.writeable = False
    return array


def open_remote(url: str, secret: bytes | None, budget_bytes: int | None) -> RemoteTier:
    """A remote tier on `url`; InvalidArgument when the redis client is missing or the URL is bad."""
    try:
        from snapcache.remote import RemoteTier
    except ImportError as exc:
        raise InvalidArgument(
            f"a remote tier needs the redis client: pip install 'snapcache[remote]' ({exc})"
        ) from None
    if budget_bytes is None:
        return RemoteTier(url, secret=secret)
    return RemoteTier(url, secret=secret, budget_bytes=budget_bytes)
