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
# The crash writers' snapshot numbers: tokens_for gives KEYS distinct token sequences. Those below
# PROTECTED are put at PROTECTED_PRIORITY, the rest at lower priorities, so that a budget holding
# every protected snapshot only ever evicts the others.
KEYS = 300
PROTECTED = 16
PROTECTED_PRIORITY = 2
LARGE_SCALE = 65  # state_for(tokens, scale=LARGE_SCALE): 65 to 390 KB


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


def state_for(tokens: np.ndarray | list[int], scale: int = 1) -> bytes:
    """The one right state for `tokens`: its size (`scale` times 1 to 6 KB) and bytes derive from the
    token ids."""
    array = np.asarray(tokens, dtype="<i4")
    seed = int.from_bytes(hashlib.blake2b(array.tobytes(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    size = int(rng.integers(MIN_STATE * scale, MAX_STATE * scale + 1))
    return rng.bytes(size)


def problem_with(snapshot: object, query: np.ndarray | None = None, scale: int = 1) -> str | None:
    """None when `snapshot` is right (and a prefix of `query` if given), else what is wrong with it."""
    tokens = np.asarray(snapshot.tokens)  # type: ignore[attr-defined]
    key = snapshot.key  # type: ignore[attr-defined]
    if not key.matches(np.ascontiguousarray(tokens, dtype="<i4")):
        return f"tokens do not hash to key {key.id[:12]}"
    if bytes(snapshot.state) != state_for(tokens, scale):  # type: ignore[attr-defined]
        return f"wrong state bytes for key {key.id[:12]} ({len(tokens)} tokens)"
    if query is not None and (len(tokens) > len(query) or not np.array_equal(tokens, query[: len(tokens)])):
        return f"lookup served {key.id[:12]}, which is not a prefix of the query"
    return None


def large_state_for(tokens: np.ndarray | list[int], size: int) -> bytes:
    """Incompressible state bytes of exactly `size` bytes, derived from the token ids."""
    array = np.asarray(tokens, dtype="<i4")
    seed = int.from_bytes(hashlib.blake2b(array.tobytes(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).bytes(size)
