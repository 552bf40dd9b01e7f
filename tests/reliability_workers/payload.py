"""Deterministic snapshots for the reliability suite: the state bytes follow from the tokens alone.

Any process can therefore verify any snapshot it is served, whoever wrote it.
"""

from __future__ import annotations

import hashlib

import numpy as np

FINGERPRINT = "reliability-fingerprint"
SCOPE = "reliability"
FAMILIES = 4
BASE_LENGTH = 400
MIN_STATE = 1_000
MAX_STATE = 6_000


def _base(family: int) -> np.ndarray:
    rng = np.random.default_rng(10_000 + family)
    return rng.integers(0, 32_000, size=BASE_LENGTH, dtype=np.int32)


_BASES = [_base(f) for f in range(FAMILIES)]


def tokens_for(index: int) -> np.ndarray:
    """Tokens of snapshot number `index`: a prefix of one of a few long sequences (so prefixes nest)."""
    family = index % FAMILIES
    length = 4 + (index * 37) % (BASE_LENGTH - 100)
    return _BASES[family][:length].copy()


def query_for(index: int, extra: int) -> np.ndarray:
    """A prompt that extends snapshot `index` by `extra` tokens of the same sequence."""
    family = index % FAMILIES
    length = min(BASE_LENGTH, len(tokens_for(index)) + extra)
    return _BASES[family][:length].copy()


def state_for(tokens: np.ndarray | list[int]) -> bytes:
    """The one right state for `tokens`: its size and bytes derive from the token ids."""
    array = np.asarray(tokens, dtype="<i4")
    seed = int.from_bytes(hashlib.blake2b(array.tobytes(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    size = int(rng.integers(MIN_STATE, MAX_STATE + 1))
    return rng.bytes(size)


def problem_with(snapshot: object, query: np.ndarray | None = None) -> str | None:
    """None when `snapshot` is right (and a prefix of `query` if given), else what is wrong with it."""
    tokens = np.asarray(snapshot.tokens)  # type: ignore[attr-defined]
    key = snapshot.key  # type: ignore[attr-defined]
    if not key.matches(np.ascontiguousarray(tokens, dtype="<i4")):
        return f"tokens do not hash to key {key.id[:12]}"
    if bytes(snapshot.state) != state_for(tokens):  # type: ignore[attr-defined]
        return f"wrong state bytes for key {key.id[:12]} ({len(tokens)} tokens)"
    if query is not None and (len(tokens) > len(query) or not np.array_equal(tokens, query[: len(tokens)])):
        return f"lookup served {key.id[:12]}, which is not a prefix of the query"
    return None


def large_state_for(tokens: np.ndarray | list[int], size: int) -> bytes:
    """Incompressible state bytes of exactly `size` bytes, derived from the token ids."""
    array = np.asarray(tokens, dtype="<i4")
    seed = int.from_bytes(hashlib.blake2b(array.tobytes(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).bytes(size)
