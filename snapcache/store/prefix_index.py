"""Longest-prefix lookup: which stored snapshot covers the most leading tokens of a query.

Per (fingerprint, scope) the index keeps the distinct stored token counts and, per count, a map from
the cheap rolling hash of the stored tokens to their keys. A lookup hashes every prefix of the query
once (one numpy pass), walks the stored counts from the longest down, and confirms each rolling-hash
candidate with the strong prefix hash. Its cost grows with the query length and the number of
distinct stored lengths, not with the number of entries.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey, TokenArray, prefix_hash_of_array, rolling_prefix_hashes
from snapcache.tier_contract import CatalogRow

GroupId = tuple[str, str]  # (model fingerprint, scope)
PrefixHashes = npt.NDArray[np.uint64]
_NO_BUCKETS: dict[int, list[SnapshotKey]] = {}


class _Group:
    """The entries of one (fingerprint, scope)."""

    __slots__ = ("_lengths_array", "by_length", "lengths")

    def __init__(self) -> None:
        self.by_length: dict[int, dict[int, list[SnapshotKey]]] = {}
        self.lengths: list[int] = []  # sorted distinct token counts
        self._lengths_array: npt.NDArray[np.intp] | None = None

    def add(self, key: SnapshotKey, rolling: int) -> None:
        buckets = self.by_length.get(key.token_count)
        if buckets is None:
            buckets = self.by_length[key.token_count] = {}
            bisect.insort(self.lengths, key.token_count)
            self._lengths_array = None
        buckets.setdefault(rolling, []).append(key)

    def discard(self, key: SnapshotKey, rolling: int) -> None:
        buckets = self.by_length[key.token_count]
        keys = buckets[rolling]
        keys.remove(key)
        if not keys:
            del buckets[rolling]
        if not buckets:
            del self.by_length[key.token_count]
            del self.lengths[bisect.bisect_left(self.lengths, key.token_count)]
            self._lengths_array = None

    def lengths_array(self) -> npt.NDArray[np.intp]:
        if self._lengths_array is None:
            self._lengths_array = np.asarray(self.lengths, dtype=np.intp)
        return self._lengths_array


class PrefixIndex:
    """Keys with their rolling hashes, grouped by (fingerprint, scope).

    Not thread-safe: the store serializes access.
    """

    def __init__(self) -> None:
        self._rolling: dict[SnapshotKey, int] = {}
        self._groups: dict[GroupId, _Group] = {}

    def __len__(self) -> int:
        return len(self._rolling)

    def __contains__(self, key: object) -> bool:
        return key in self._rolling

    @classmethod
    def of_group(
        cls,
        model_fingerprint: str,
        scope: str,
        rows: Iterable[CatalogRow],
        previous: PrefixIndex | None = None,
    ) -> PrefixIndex:
        """An index of one (fingerprint, scope) built from raw rows in one pass.

        Keys `previous` already holds are reused rather than built and validated again, which makes
        re-reading a catalog after a few changes cheap. Rows that make no valid key are left out.
        """
        index = cls()
        group_id = (model_fingerprint, scope)
        old = None if previous is None else previous._groups.get(group_id)
        old_lengths = {} if old is None else old.by_length
        rolling_of = index._rolling
        group = _Group()
        by_length = group.by_length
        for token_count, prefix_hash, rolling in rows:
            key = None
            for known in old_lengths.get(token_count, _NO_BUCKETS).get(rolling, ()):
                if known.prefix_hash == prefix_hash:
                    key = known
                    break
            if key is None:
                try:
                    key = SnapshotKey(model_fingerprint, scope, token_count, prefix_hash)
                except InvalidArgument:
                    continue  # a row no put could have written
            if key in rolling_of:
                continue  # a duplicate row
            rolling_of[key] = rolling
            by_length.setdefault(token_count, {}).setdefault(rolling, []).append(key)
        if by_length:
            group.lengths = sorted(by_length)
            index._groups[group_id] = group
        return index

    def add(self, key: SnapshotKey, rolling_hash: int) -> None:
        """Index `key` (replacing any earlier record of it)."""
        old = self._rolling.get(key)
        if old == rolling_hash:
            return
        if old is not None:
            self.remove(key)
        self._rolling[key] = rolling_hash
        group_id = (key.model_fingerprint, key.scope)
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = _Group()
        group.add(key, rolling_hash)

    def remove(self, key: SnapshotKey) -> bool:
        rolling = self._rolling.pop(key, None)
        if rolling is None:
            return False
        group_id = (key.model_fingerprint, key.scope)
        group = self._groups[group_id]
        group.discard(key, rolling)
        if not group.lengths:
            del self._groups[group_id]
        return True

    def keys(self) -> list[SnapshotKey]:
        return list(self._rolling)

    def lookup(self, model_fingerprint: str, scope: str, query: TokenArray) -> SnapshotKey | None:
        """The key of the longest stored prefix of `query` (validated tokens), or None."""
        return next(iter_prefix_matches((self,), model_fingerprint, scope, query), None)


def iter_prefix_matches(
    indexes: Sequence[PrefixIndex],
    model_fingerprint: str,
    scope: str,
    query: TokenArray,
    hashes: PrefixHashes | None = None,
) -> Iterator[SnapshotKey]:
    """Keys across `indexes` whose tokens are a prefix of `query`, longest first.

    At most one key per length: a stored prefix of `query` of a given length has exactly the
    query's first tokens, so fingerprint, scope, length and prefix hash, the whole key, coincide.
    `hashes` may pass in `rolling_prefix_hashes(query)` already made.
    """
    group_id = (model_fingerprint, scope)
    limit = len(query)
    groups = [index._groups[group_id] for index in indexes if group_id in index._groups]
    if not groups or limit == 0:
        return
    usable = [group.lengths_array() for group in groups]
    usable = [lengths[: int(np.searchsorted(lengths, limit, side="right"))] for lengths in usable]
    lengths = usable[0] if len(usable) == 1 else np.unique(np.concatenate(usable))
    if len(lengths) == 0:
        return
    if hashes is None:
        hashes = rolling_prefix_hashes(query)
    # The query's rolling hash at a length is the same for every group: hash each length once.
    for length, rolling in zip(reversed(lengths.tolist()), reversed(hashes[lengths].tolist()), strict=True):
        strong: str | None = None  # the strong hash only once some rolling hash matches
        match = None
        for group in groups:
            buckets = group.by_length.get(length)
            for key in () if buckets is None else buckets.get(rolling, ()):
                if strong is None:
                    strong = prefix_hash_of_array(query, length)
                if key.prefix_hash == strong:
                    match = key
                    break
            if match is not None:
                break
        if match is not None:
            yield match
