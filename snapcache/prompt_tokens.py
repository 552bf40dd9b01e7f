"""Tokens validated once at the public boundary, carrying what lower layers compute from them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from snapcache.errors import InvalidArgument
from snapcache.key import (
    BLOCK_TOKENS,
    SnapshotKey,
    TokenArray,
    Tokens,
    as_token_array,
    block_scope,
    chain_hashes,
    is_frozen_token_array,
    prefix_hash_of_array,
)

__all__ = ["PromptTokens"]


class PromptTokens:
    """Validated tokens and what lower layers compute from them, each computed once and remembered:
    the strong hash and key of any prefix, the chain hashes and keys of its 64-token blocks, and the
    slices those keys were made from (a put checks a key against its very slice, without a hash).

    Takes only a frozen array (see `as_token_array`), so nothing can change the tokens under their
    hashes. `head` and `extended` share what was computed with tokens that start the same way.
    """

    __slots__ = ("_array", "_memo")

    def __init__(self, tokens: TokenArray) -> None:
        if not isinstance(tokens, np.ndarray) or not is_frozen_token_array(tokens):
            raise InvalidArgument("PromptTokens takes a read-only token array made by as_token_array")
        self._array = as_token_array(tokens)  # checks the ids; never copies a frozen array
        self._memo = _Memo(self._array)

    @classmethod
    def of(cls, tokens: PromptTokens | Tokens | Iterable[int]) -> PromptTokens:
        """`tokens` as they are if already PromptTokens, else validated (see `as_token_array`)."""
        if isinstance(tokens, PromptTokens):
            return tokens
        return cls._sharing(as_token_array(tokens), None)

    @classmethod
    def _sharing(cls, array: TokenArray, memo: _Memo | None) -> PromptTokens:
        made = cls.__new__(cls)
        made._array = array
        made._memo = _Memo(array) if memo is None else memo
        return made

    @property
    def array(self) -> TokenArray:
        """The tokens: a read-only array nothing can change."""
        return self._array

    def __len__(self) -> int:
        return len(self.array)

    def __repr__(self) -> str:
        return f"PromptTokens({len(self.array)} tokens)"

    def head(self, length: int) -> PromptTokens:
        """The first `length` tokens, sharing what was and will be computed with these."""
        return self if length == len(self.array) else PromptTokens._sharing(self.prefix(length), self._memo)

    def extended(self, tokens: TokenArray) -> PromptTokens:
        """PromptTokens of `tokens` (validated): when they start with these (compared, not hashed),
        what either computes about these is computed once for both; on their own otherwise."""
        n = len(self.array)
        if tokens is self.array or (len(tokens) == n and np.array_equal(tokens, self.array)):
            return self
        if len(tokens) > n and np.array_equal(tokens[:n], self.array):
            return PromptTokens._sharing(tokens, _Memo(tokens, self._memo, n))
        return PromptTokens.of(tokens)

    def prefix(self, length: int) -> TokenArray:
        """tokens[:length], the same array each time."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= len(self.array):
            raise InvalidArgument(f"a prefix of {len(self.array)} tokens, not {length!r}")
        prefixes = self._memo.owner(length).prefixes
        found = prefixes.get(length)
        if found is None:
            found = prefixes.setdefault(length, self.array[:length])
        return found

    def prefix_hash(self, length: int) -> str:
        """prefix_hash(tokens[:length]), computed once."""
        prefix = self.prefix(length)
        hashes = self._memo.owner(length).hashes
        found = hashes.get(length)
        if found is None:
            found = hashes.setdefault(length, prefix_hash_of_array(prefix, length))
        return found

    def learn(self, key: SnapshotKey, tokens: TokenArray) -> None:
        """Take the prefix hash of `key`, the key of `tokens` (a store checked them against it), for
        the prefix of these of its length when `tokens` are that prefix (compared, not hashed)."""
        n = key.token_count
        if n <= len(self.array) and len(tokens) == n and np.array_equal(tokens, self.prefix(n)):
            self._memo.owner(n).hashes.setdefault(n, key.prefix_hash)

    def key(self, model_fingerprint: str, scope: str, length: int | None = None) -> SnapshotKey:
        """SnapshotKey.for_tokens(model_fingerprint, scope, tokens[:length]) (all of them: None)."""
        n = len(self.array) if length is None else length
        keys = self._memo.owner(n).keys
        found = keys.get((model_fingerprint, scope, n))
        if found is None:
            found = SnapshotKey.for_hashed(model_fingerprint, scope, self.prefix(n), self.prefix_hash(n))
            found = keys.setdefault((model_fingerprint, scope, n), found)
        return found

    def block(self, index: int) -> TokenArray:
        """The tokens of block `index`, the same array each time."""
        self._check_blocks(index + 1)
        blocks = self._memo.owner((index + 1) * BLOCK_TOKENS).blocks
        found = blocks.get(index)
        if found is None:
            found = blocks.setdefault(index, self.array[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS])
        return found

    def chain_hashes(self, n_blocks: int) -> list[str]:
        """chain_hashes(tokens, n_blocks), each chain hash computed once."""
        self._check_blocks(n_blocks)
        chains: list[str] = []
        for i in range(n_blocks):
            known = self._memo.owner(i * BLOCK_TOKENS).chains
            found = known.get(i)
            if found is None:
                found = known.setdefault(i, chain_hashes(self.array, i + 1, chains)[-1])
            chains.append(found)
        return chains

    def block_keys(self, model_fingerprint: str, scope: str, n_blocks: int) -> list[SnapshotKey]:
        """block_keys(model_fingerprint, scope, tokens, n_blocks), each key computed once."""
        keys: list[SnapshotKey] = []
        chains: list[str] | None = None
        for i in range(n_blocks):
            known = self._memo.owner((i + 1) * BLOCK_TOKENS).block_keys
            found = known.get((model_fingerprint, scope, i))
            if found is None:
                chains = chains or self.chain_hashes(n_blocks)
                block = self.block(i)
                block_hash = prefix_hash_of_array(block, BLOCK_TOKENS)
                found = SnapshotKey.for_hashed(
                    model_fingerprint, block_scope(scope, chains[i]), block, block_hash
                )
                found = known.setdefault((model_fingerprint, scope, i), found)
            keys.append(found)
        return keys

    def _check_blocks(self, n_blocks: int) -> None:
        if n_blocks * BLOCK_TOKENS > len(self.array):
            raise InvalidArgument(f"{len(self.array)} tokens do not fill {n_blocks} blocks")


class _Memo:
    """What PromptTokens computed, keyed by prefix length or block: valid for every PromptTokens that
    starts with the longest tokens sharing it. An extension's memo passes what depends only on the
    first `limit` tokens to the memo of the tokens it extends (`parent`)."""

    __slots__ = ("block_keys", "blocks", "chains", "hashes", "keys", "limit", "parent", "prefixes")

    def __init__(self, array: TokenArray, parent: _Memo | None = None, limit: int = 0) -> None:
        self.parent = parent
        self.limit = limit
        self.prefixes: dict[int, TokenArray] = {len(array): array}
        self.hashes: dict[int, str] = {}
        self.keys: dict[tuple[str, str, int], SnapshotKey] = {}
        self.chains: dict[int, str] = {}
        self.blocks: dict[int, TokenArray] = {}
        self.block_keys: dict[tuple[str, str, int], SnapshotKey] = {}

    def owner(self, covers: int) -> _Memo:
        """The memo that keeps what depends on the first `covers` tokens."""
        memo = self
        while memo.parent is not None and covers <= memo.limit:
            memo = memo.parent
        return memo
