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
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey, TokenArray, prefix_hash_of_array, rolling_prefix_hashes

GroupId = tuple[str, str]  # (model fingerprint, scope)
PrefixHashes = npt.NDArray[np.uint64]
# token_count, prefix_hash, rolling_hash, priority, last_used_at: a row of the disk tier's catalog
CatalogRow = tuple[int, str, int, int, float]
_NO_BUCKETS: dict[int, list[SnapshotKey]] = {}


@dataclass(slots=True)
class _Record:
    rolling_hash: int
    priority: int
    last_used_at: float


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
    """Keys with their rolling hashes, priorities and last use, grouped by (fingerprint, scope).

    Not thread-safe: the store serializes access.
    """

    def __init__(self) -> None:
        self._records: dict[SnapshotKey, _Record] = {}
        self._groups: dict[GroupId, _Group] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: object) -> bool:
        return key in self._records

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
        records = index._records
        group = _Group()
        by_length = group.by_length
        for token_count, prefix_hash, rolling, priority, last_used_at in rows:
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
            record = _Record(rolling, priority, last_used_at)
            if records.setdefault(key, record) is not record:
                continue
            buckets = by_length.get(token_count)
            if buckets is None:
                buckets = by_length[token_count] = {}
            keys = buckets.get(rolling)
            if keys is None:
                buckets[rolling] = [key]
            else:
                keys.append(key)
        if by_length:
            group.lengths = sorted(by_length)
            index._groups[group_id] = group
        return index

    def add(self, key: SnapshotKey, rolling_hash: int, priority: int, last_used_at: float) -> None:
        """Index `key` (replacing any earlier record of it)."""
        old = self._records.get(key)
        if old is not None and old.rolling_hash == rolling_hash:
            old.priority = priority
            old.last_used_at = last_used_at
            return
        if old is not None:
            self.remove(key)
        self._records[key] = _Record(rolling_hash, priority, last_used_at)
        group_id = (key.model_fingerprint, key.scope)
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = _Group()
        group.add(key, rolling_hash)

    def remove(self, key: SnapshotKey) -> bool:
        record = self._records.pop(key, None)
        if record is None:
            return False
        group_id = (key.model_fingerprint, key.scope)
        group = self._groups[group_id]
        group.discard(key, record.rolling_hash)
        if not group.lengths:
            del self._groups[group_id]
        return True

    def touch(self, key: SnapshotKey, last_used_at: float) -> None:
        """Record a use of `key` (a tie-break between equally long matches)."""
        record = self._records.get(key)
        if record is not None and last_used_at > record.last_used_at:
            record.last_used_at = last_used_at

    def keys(self) -> list[SnapshotKey]:
        return list(self._records)

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
    """Keys across `indexes` whose tokens are a prefix of `query`, best first.

    Best is longest; equally long ones go by higher priority, then more recent use. A key held by
    several indexes appears once. `hashes` may pass in `rolling_prefix_hashes(query)` already made.
    """
    group_id = (model_fingerprint, scope)
    limit = len(query)
    holders = [(index, index._groups[group_id]) for index in indexes if group_id in index._groups]
    if not holders or limit == 0:
        return
    usable = [group.lengths_array() for _, group in holders]
    usable = [lengths[: int(np.searchsorted(lengths, limit, side="right"))] for lengths in usable]
    lengths = usable[0] if len(usable) == 1 else np.unique(np.concatenate(usable))
    if len(lengths) == 0:
        return
    if hashes is None:
        hashes = rolling_prefix_hashes(query)
    # The query's rolling hash at a length is the same for every group: hash each length once.
    for length, rolling in zip(reversed(lengths.tolist()), reversed(hashes[lengths].tolist()), strict=True):
        found: dict[SnapshotKey, tuple[int, float]] = {}
        for index, group in holders:
            buckets = group.by_length.get(length)
            keys = None if buckets is None else buckets.get(rolling)
            if not keys:
                continue
            records = index._records
            for key in keys:
                record = records[key]
                rank = found.get(key)
                if rank is None or record.last_used_at > rank[1]:
                    found[key] = (record.priority, record.last_used_at)
        if not found:
            continue
        strong = prefix_hash_of_array(query, length)
        matches = [(rank, key) for key, rank in found.items() if key.prefix_hash == strong]
        matches.sort(key=lambda item: item[0], reverse=True)
        for _, key in matches:
            yield key
