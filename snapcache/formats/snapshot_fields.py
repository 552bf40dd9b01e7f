"""The fields of a snapshot file's header, each checked as it is read: its key, priority and creation
time, the logits it holds, and the token ids after it; and the file's envelope and hard caps.

`snapshot_file` writes and reads the whole file; the pack file checks its members' fields here too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from snapcache.errors import CorruptSnapshot
from snapcache.formats.envelope import Envelope
from snapcache.key import SnapshotKey, TokenArray
from snapcache.snapshot import MAX_PRIORITY, Buffer

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_LOGITS",
    "MAX_STATE_BYTES",
    "MAX_TOKENS",
    "SNAPSHOT",
    "checked_time_and_priority",
    "file_tokens",
    "header_key",
    "key_fields",
    "logits_count",
]

MAGIC = b"\x89SNAPC\r\n"
FORMAT_VERSION = 2
MAX_HEADER_BYTES = 64 << 10
MAX_TOKENS = 1 << 24
MAX_LOGITS = 1 << 28
MAX_STATE_BYTES = 1 << 38
SNAPSHOT = Envelope(MAGIC, (1, FORMAT_VERSION), MAX_HEADER_BYTES, "snapshot")


def checked_time_and_priority(header: dict[str, Any]) -> tuple[int, float]:
    """A header's priority and creation time, checked."""
    priority: int = SNAPSHOT.field(header, "priority", int)
    if abs(priority) > MAX_PRIORITY:
        raise CorruptSnapshot("priority out of range")
    try:
        created_at = float(SNAPSHOT.field(header, "created_at", float, int))
    except OverflowError:  # an integer beyond any float
        raise CorruptSnapshot("created_at is out of range") from None
    if not math.isfinite(created_at):
        raise CorruptSnapshot("created_at is not finite")
    return priority, created_at


def file_tokens(raw: Buffer) -> TokenArray:
    """A read-only copy of the token ids stored in a file; ids no tokenizer produces (negative ones)
    mean a foreign file."""
    tokens = np.frombuffer(raw, dtype="<i4").copy()
    if tokens.size and int(tokens.min()) < 0:
        raise CorruptSnapshot("file holds invalid tokens: token ids must not be negative")
    tokens.flags.writeable = False
    return tokens


def header_key(header: dict[str, Any], expected: SnapshotKey | None = None) -> SnapshotKey:
    """The key the header names; CorruptSnapshot when it is malformed or not `expected`."""
    fields = SNAPSHOT.field(header, "key", dict)
    if expected is not None:
        # Comparing with a key already checked is cheaper than checking another (a restore reads
        # hundreds of blocks); `is int` keeps JSON's true from passing for 1.
        named = key_fields(expected)
        if type(fields.get("token_count")) is not int or any(fields.get(f) != named[f] for f in named):
            raise CorruptSnapshot("file belongs to another key")
        if expected.token_count > MAX_TOKENS:
            raise CorruptSnapshot(f"header field 'token_count' = {expected.token_count} is too large")
        return expected
    token_count = SNAPSHOT.bounded(fields, "token_count", MAX_TOKENS)
    try:
        return SnapshotKey(
            SNAPSHOT.field(fields, "model_fingerprint", str),
            SNAPSHOT.field(fields, "scope", str),
            token_count,
            SNAPSHOT.field(fields, "prefix_hash", str),
        )
    except ValueError as exc:
        raise CorruptSnapshot(f"header key is invalid: {exc}") from None


def key_fields(key: SnapshotKey) -> dict[str, Any]:
    """How a header names `key`."""
    return {
        "model_fingerprint": key.model_fingerprint,
        "scope": key.scope,
        "token_count": key.token_count,
        "prefix_hash": key.prefix_hash,
    }


def logits_count(header: dict[str, Any]) -> int:
    """How many logits the file holds after its tokens (0: none), checked against the limit."""
    shape = header.get("logits_shape")
    if shape is None:
        return 0
    if header.get("logits_dtype") != "<f4":
        raise CorruptSnapshot("unsupported logits dtype")
    # What put accepts: one non-empty row of floats.
    if (
        not isinstance(shape, list)
        or len(shape) != 1
        or not isinstance(shape[0], int)
        or isinstance(shape[0], bool)
        or shape[0] < 1
    ):
        raise CorruptSnapshot("malformed logits shape")
    count: int = shape[0]
    if count > MAX_LOGITS:
        raise CorruptSnapshot(f"{count} logits exceed the limit of {MAX_LOGITS}")
    return count
