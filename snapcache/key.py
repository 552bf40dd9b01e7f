"""Snapshot keys: which model, which scope, how many tokens, and a strong hash of those tokens."""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument

TokenArray = npt.NDArray[np.int32]
Tokens = Sequence[int] | TokenArray

DEFAULT_SCOPE = "default"
MAX_PRIORITY = 1_000_000
MAX_SCOPE_LENGTH = 200
MAX_FINGERPRINT_LENGTH = 128
# Token ids from here on key the positions of an image (`snapcache.llama.media`), far above any
# vocabulary: llama.cpp never reads them, and only a prompt that holds them restores them.
IMAGE_KEY_BASE = 1 << 30
_PREFIX_HASH_PERSON = b"snapcache.tok1"
_HEX32 = re.compile(r"[0-9a-f]{32}")
_TOKEN_MAX = np.iinfo(np.int32).max
_TOKEN_DTYPE = np.dtype("<i4")

# Odd multiplier of the rolling hash; odd makes it invertible modulo 2**64.
_ROLLING_BASE = np.uint64(0x9E3779B97F4A7C15)
_rolling_powers = np.ones(1, dtype=np.uint64)


def as_token_array(tokens: Tokens | Iterable[int]) -> TokenArray:
    """Return `tokens` as a read-only little-endian int32 array, or raise InvalidArgument.

    An array that is already one (1-D, C-contiguous, read-only, and read-only down its whole `base`
    chain to an ndarray or bytes) comes back unchanged: it is checked only for negative ids, never
    copied again, so each layer may call this on what the layer above validated. A read-only view of
    writable memory (a caller's buffer, `bytearray`, mmap) is copied: the caller could still change
    the tokens after their hashes were taken.
    """
    if isinstance(tokens, np.ndarray):
        if is_frozen_token_array(tokens):
            if tokens.size and int(tokens.min()) < 0:
                raise InvalidArgument("token ids must lie between 0 and 2**31 - 1")
            return tokens
        array = tokens
    else:
        try:
            array = np.asarray(list(tokens))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"tokens must be a sequence of integers: {exc}") from None
    if array.ndim != 1:
        raise InvalidArgument(f"tokens must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise InvalidArgument(f"tokens must be integers, got {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) > _TOKEN_MAX):
        raise InvalidArgument("token ids must lie between 0 and 2**31 - 1")
    return _frozen_copy(array)


def is_frozen_token_array(array: npt.NDArray[np.generic]) -> bool:
    """Whether `array` is 1-D '<i4', C-contiguous, and nothing can write its memory: every array
    down its base chain is read-only and the chain ends in an array that owns its data or in bytes."""
    if array.ndim != 1 or array.dtype != _TOKEN_DTYPE or not array.flags.c_contiguous:
        return False
    base: object = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return base is None or isinstance(base, bytes)


def _frozen_copy(array: npt.NDArray[np.generic]) -> TokenArray:
    """A read-only C-contiguous '<i4' copy of `array` (the one place tokens are copied)."""
    result: TokenArray = np.array(array, dtype=_TOKEN_DTYPE, order="C", copy=True)
    result.flags.writeable = False
    return result


def prefix_hash(tokens: Tokens) -> str:
    """128-bit BLAKE2b of the token ids as little-endian int32, in hex."""
    return hashlib.blake2b(
        as_token_array(tokens).tobytes(), digest_size=16, person=_PREFIX_HASH_PERSON
    ).hexdigest()


def prefix_hash_of_array(tokens: TokenArray, length: int) -> str:
    """prefix_hash(tokens[:length]) for an array already validated by as_token_array."""
    view = tokens.data[:length]
    return hashlib.blake2b(view.cast("B"), digest_size=16, person=_PREFIX_HASH_PERSON).hexdigest()


def rolling_prefix_hashes(tokens: TokenArray) -> npt.NDArray[np.uint64]:
    """Cheap 64-bit polynomial hashes of every prefix: result[n] covers tokens[:n], result[0] == 0.

    Used only to find candidates for a longest-prefix lookup in one vectorized pass; a candidate is
    confirmed with the strong prefix hash before it is served.
    """
    global _rolling_powers
    n = len(tokens)
    # Read the shared table once: another thread may replace it (even with a smaller one) meanwhile.
    powers = _rolling_powers
    if len(powers) < n:
        bases = np.full(max(n, 2 * len(powers)), _ROLLING_BASE, dtype=np.uint64)
        bases[0] = 1
        with np.errstate(over="ignore"):
            powers = np.cumprod(bases, dtype=np.uint64)
        if len(powers) > len(_rolling_powers):  # never shrink what another thread just grew
            _rolling_powers = powers
    out = np.zeros(n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        terms = (tokens.astype(np.uint64) + np.uint64(1)) * powers[:n]
        np.cumsum(terms, dtype=np.uint64, out=out[1:])
    return out


def rolling_hash(tokens: TokenArray) -> int:
    """rolling_prefix_hashes(tokens)[-1] as a Python int (0 for no tokens)."""
    return int(rolling_prefix_hashes(tokens)[-1])


def validate_fingerprint(fingerprint: object) -> str:
    """`fingerprint` if a key could carry it (1 to 128 ASCII characters), else InvalidArgument."""
    if (
        not isinstance(fingerprint, str)
        or not fingerprint
        or len(fingerprint) > MAX_FINGERPRINT_LENGTH
        or not fingerprint.isascii()
    ):
        raise InvalidArgument(
            f"model_fingerprint must be 1 to {MAX_FINGERPRINT_LENGTH} ASCII characters, got {fingerprint!r}"
        )
    return fingerprint


def validate_priority(priority: object) -> int:
    """`priority` as an int if it is an integer (numpy's too, never bool) within ±MAX_PRIORITY."""
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
        raise InvalidArgument(f"priority must be an int, got {priority!r}")
    value = int(priority)
    if abs(value) > MAX_PRIORITY:
        raise InvalidArgument(f"priority must lie within ±{MAX_PRIORITY}, got {value}")
    return value


def validate_budget(name: str, budget: object) -> int:
    """`budget` as an int if it is a non-negative integer (numpy's too, never bool)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise InvalidArgument(f"{name} must be a non-negative int, got {budget!r}")
    return int(budget)


def validate_scope(scope: object) -> str:
    """`scope` if a user may name it: 1 to 200 characters, no NUL, line break or unit separator."""
    if not isinstance(scope, str) or not scope:
        raise InvalidArgument(f"scope must be a non-empty string, got {scope!r}")
    if len(scope) > MAX_SCOPE_LENGTH or any(ch in scope for ch in "\x00\n\r" + _BLOCK_MARK):
        raise InvalidArgument(
            f"scope must be at most {MAX_SCOPE_LENGTH} characters without NUL, line breaks or \\x1f"
        )
    return scope


# -- shared blocks ------------------------------------------------------------------------------------
#
# A block holds the state of 64 consecutive tokens of a prompt. Its key is the block's own tokens
# (token count 64, their prefix hash) under a block scope: the user's scope, the unit separator and
# the chain hash of every token before the block. Two prompts that start alike share the keys, and
# so the stored bytes, of their common blocks.

BLOCK_TOKENS = 64
_BLOCK_MARK = "\x1f"
_CHAIN_PERSON = b"snapcache.chn1"
_CHAIN_START = "0" * 32


def block_scope(scope: str, chain: str) -> str:
    """The scope of a block in `scope` that follows the tokens whose chain hash is `chain`."""
    return f"{scope}{_BLOCK_MARK}{chain}"


def is_block_scope(scope: str) -> bool:
    return _BLOCK_MARK in scope


def user_scope(scope: str) -> str:
    """The scope a user named: `scope` itself, or the scope of a block scope."""
    return scope.partition(_BLOCK_MARK)[0]


def chain_hashes(tokens: TokenArray, n_blocks: int, known: Sequence[str] = ()) -> list[str]:
    """The chain hash before each of the first `n_blocks` blocks of `tokens` (the first is fixed):
    each is BLAKE2b of the one before and the previous block's tokens. `known`: the first chain
    hashes of these tokens, computed before."""
    if n_blocks < 1:
        return []
    chains = list(known[:n_blocks]) or [_CHAIN_START]
    data = tokens.data.cast("B")
    step = BLOCK_TOKENS * 4
    for i in range(len(chains), n_blocks):
        digest = hashlib.blake2b(chains[-1].encode(), digest_size=16, person=_CHAIN_PERSON)
        digest.update(data[(i - 1) * step : i * step])
        chains.append(digest.hexdigest())
    return chains


def block_keys(model_fingerprint: str, scope: str, tokens: TokenArray, n_blocks: int) -> list[SnapshotKey]:
    """The keys of the first `n_blocks` blocks of `tokens` (validated) in `scope`."""
    if n_blocks * BLOCK_TOKENS > len(tokens):
        raise InvalidArgument(f"{len(tokens)} tokens do not fill {n_blocks} blocks")
    return [
        SnapshotKey(
            model_fingerprint,
            block_scope(scope, chain),
            BLOCK_TOKENS,
            prefix_hash_of_array(tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS], BLOCK_TOKENS),
        )
        for i, chain in enumerate(chain_hashes(tokens, n_blocks))
    ]


@dataclass(frozen=True, slots=True)
class SnapshotKey:
    """Identifies one snapshot: (model fingerprint, scope, token count, prefix hash)."""

    model_fingerprint: str
    scope: str
    token_count: int
    prefix_hash: str
    _id: str = field(init=False, repr=False, compare=False)  # see `id`: computed once
    # The frozen token array this key was made from or last matched (weakly): `matches` on that
    # very array needs no hash, so a put checks the key of tokens hashed a layer above for free.
    _tokens: weakref.ref[TokenArray] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_fingerprint(self.model_fingerprint)
        user_scope, mark, chain = (
            self.scope.partition(_BLOCK_MARK) if isinstance(self.scope, str) else ("", "", "")
        )
        validate_scope(user_scope if mark else self.scope)
        if mark and not _HEX32.fullmatch(chain):
            raise InvalidArgument("a block scope ends in a chain hash of 32 lowercase hex digits")
        if isinstance(self.token_count, bool) or not isinstance(self.token_count, int):
            raise InvalidArgument(f"token_count must be an int, got {self.token_count!r}")
        if self.token_count < 1:
            raise InvalidArgument(f"token_count must be at least 1, got {self.token_count}")
        if not isinstance(self.prefix_hash, str) or not _HEX32.fullmatch(self.prefix_hash):
            raise InvalidArgument("prefix_hash must be 32 lowercase hex digits")
        text = "\x00".join((self.model_fingerprint, self.scope, str(self.token_count), self.prefix_hash))
        key_id = hashlib.blake2b(text.encode(), digest_size=32, person=b"snapcache.key1").hexdigest()
        object.__setattr__(self, "_id", key_id)
        object.__setattr__(self, "_tokens", None)

    def __reduce__(self) -> tuple[type[SnapshotKey], tuple[str, str, int, str]]:
        # A weak reference does not pickle; the remembered tokens are a cache, not part of the key.
        return type(self), (self.model_fingerprint, self.scope, self.token_count, self.prefix_hash)

    def _remember(self, tokens: TokenArray) -> None:
        if is_frozen_token_array(tokens):  # nothing can change these tokens while they live
            object.__setattr__(self, "_tokens", weakref.ref(tokens))

    @classmethod
    def for_hashed(
        cls, model_fingerprint: str, scope: str, tokens: TokenArray, prefix_hash: str
    ) -> SnapshotKey:
        """The key of `tokens` (validated) whose `prefix_hash` the caller computed already with
        `prefix_hash_of_array`: for_tokens without hashing them again."""
        key = cls(model_fingerprint, scope, len(tokens), prefix_hash)
        key._remember(tokens)
        return key

    @classmethod
    def for_tokens(cls, model_fingerprint: str, scope: str, tokens: Tokens) -> SnapshotKey:
        array = as_token_array(tokens)
        key = cls(model_fingerprint, scope, len(array), prefix_hash_of_array(array, len(array)))
        key._remember(array)
        return key

    @property
    def id(self) -> str:
        """A stable 64-hex-digit name for this key: file names and the CLI use it."""
        return self._id

    @property
    def is_block(self) -> bool:
        """Whether this key names one shared block rather than a snapshot."""
        return _BLOCK_MARK in self.scope

    @property
    def user_scope(self) -> str:
        """The scope a user named: `scope`, or for a block the scope of the prompts that share it."""
        return user_scope(self.scope)

    def matches(self, tokens: TokenArray) -> bool:
        """True when `tokens` (validated) are exactly the tokens this key was made from."""
        remembered = self._tokens
        if remembered is not None and remembered() is tokens:
            return True
        if len(tokens) != self.token_count or prefix_hash_of_array(tokens, len(tokens)) != self.prefix_hash:
            return False
        self._remember(tokens)
        return True
