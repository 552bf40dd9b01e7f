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

    __slots__ = ("_memo", "array")

    def __init__(self, tokens: TokenArray) -> None:
        if not isinstance(tokens, np.ndarray) or not is_frozen_token_array(tokens):
            raise InvalidArgument("PromptTokens takes a read-only token array made by as_token_array")
        self.array: TokenArray = as_token_array(tokens)  # checks the ids; never copies a frozen array
        self._memo = _Memo(self.array)

    @classmethod
    def of(cls, tokens: PromptTokens | Tokens | Iterable[int]) -> PromptTokens:
        """`tokens` as they are if already PromptTokens, else validated (see `as_token_array`)."""
        if isinstance(tokens, PromptTokens):
            return tokens
        return cls._sharing(as_token_array(tokens), None)

    @classmethod
    def _sharing(cls, array: TokenArray, memo: _Memo | None) -> PromptTokens:
        made = cls.__new__(cls)
        made.array = array
        made._memo = _Memo(array) if memo is None else memo
        return made

    def __len__(self) -> int:
        return len(self.array)

    def __repr__(self) -> str:
        return f"PromptTokens({len(self.array)} tokens)"

    def head(self, length: int) -> PromptTokens:
        """The first `length` tokens, sharing what was and will be computed with these."""
        return self if length == len(self.array) else PromptTokens._sharing(self.prefix(length), self._memo)

    def extended(self, tokens: TokenArray) -> PromptTokens:
        """PromptTokens of `tokens` (validated), sharing what was computed for these when `tokens`
        start with them (compared, not hashed); on their own otherwise."""
        if tokens is self.array:
            return self
        n = len(self.array)
        if len(tokens) >= n and np.array_equal(tokens[:n], self.array):
            return PromptTokens._sharing(tokens, self._memo.upto(n, tokens))
        return PromptTokens.of(tokens)

    def prefix(self, length: int) -> TokenArray:
        """tokens[:length], the same array each time."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= len(self.array):
            raise InvalidArgument(f"a prefix of {len(self.array)} tokens, not {length!r}")
        prefixes = self._memo.prefixes
        found = prefixes.get(length)
        if found is None:
            found = prefixes.setdefault(length, self.array[:length])
        return found

    def prefix_hash(self, length: int) -> str:
        """prefix_hash(tokens[:length]), computed once."""
        hashes = self._memo.hashes
        found = hashes.get(length)
        if found is None:
            found = hashes.setdefault(length, prefix_hash_of_array(self.prefix(length), length))
        return found

    def key(self, model_fingerprint: str, scope: str, length: int | None = None) -> SnapshotKey:
        """SnapshotKey.for_tokens(model_fingerprint, scope, tokens[:length]) (all of them: None)."""
        n = len(self.array) if length is None else length
        keys = self._memo.keys
        found = keys.get((model_fingerprint, scope, n))
        if found is None:
            found = SnapshotKey.for_hashed(model_fingerprint, scope, self.prefix(n), self.prefix_hash(n))
            found = keys.setdefault((model_fingerprint, scope, n), found)
        return found

    def block(self, index: int) -> TokenArray:
        """The tokens of block `index`, the same array each time."""
        blocks = self._memo.blocks
        found = blocks.get(index)
        if found is None:
            self._check_blocks(index + 1)
            found = blocks.setdefault(index, self.array[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS])
        return found

    def chain_hashes(self, n_blocks: int) -> list[str]:
        """chain_hashes(tokens, n_blocks), each chain hash computed once."""
        self._check_blocks(n_blocks)
        memo = self._memo
        if len(memo.chains) < n_blocks:
            memo.chains = chain_hashes(self.array, n_blocks, memo.chains)
        return memo.chains[:n_blocks]

    def block_keys(self, model_fingerprint: str, scope: str, n_blocks: int) -> list[SnapshotKey]:
        """block_keys(model_fingerprint, scope, tokens, n_blocks), each key computed once."""
        memo = self._memo
        keys = memo.block_keys.get((model_fingerprint, scope), [])
        if len(keys) < n_blocks:
            chains = self.chain_hashes(n_blocks)
            more = []
            for i in range(len(keys), n_blocks):
                block = self.block(i)
                block_hash = prefix_hash_of_array(block, BLOCK_TOKENS)
                more.append(
                    SnapshotKey.for_hashed(
                        model_fingerprint, block_scope(scope, chains[i]), block, block_hash
                    )
                )
            keys = keys + more
            memo.block_keys[(model_fingerprint, scope)] = keys
        return keys[:n_blocks]

    def _check_blocks(self, n_blocks: int) -> None:
        if n_blocks * BLOCK_TOKENS > len(self.array):
            raise InvalidArgument(f"{len(self.array)} tokens do not fill {n_blocks} blocks")


class _Memo:
    """What PromptTokens computed, valid for every prefix of the longest tokens that share it: its
    entries are keyed by length or block, never by the whole."""

    __slots__ = ("block_keys", "blocks", "chains", "hashes", "keys", "prefixes")

    def __init__(self, array: TokenArray) -> None:
        self.prefixes: dict[int, TokenArray] = {len(array): array}
        self.hashes: dict[int, str] = {}
        self.keys: dict[tuple[str, str, int], SnapshotKey] = {}
        self.chains: list[str] = []
        self.blocks: dict[int, TokenArray] = {}
        self.block_keys: dict[tuple[str, str], list[SnapshotKey]] = {}

    def upto(self, length: int, array: TokenArray) -> _Memo:
        """A memo for `array`, which starts with the first `length` tokens of these: what was
        computed for them (other tokens may follow them here than in `array`)."""
        memo = _Memo(array)
        memo.prefixes.update((n, a) for n, a in self.prefixes.items() if n <= length)
        memo.hashes = {n: h for n, h in self.hashes.items() if n <= length}
        memo.keys = {k: key for k, key in self.keys.items() if k[2] <= length}
        whole = length // BLOCK_TOKENS
        memo.chains = self.chains[: whole + 1]
        memo.blocks = {i: b for i, b in self.blocks.items() if i < whole}
        memo.block_keys = {k: keys[:whole] for k, keys in self.block_keys.items()}
        return memo
