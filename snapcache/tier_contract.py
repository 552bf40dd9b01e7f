"""The contract the storage tiers honour: the row they describe entries with, and who gets evicted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

TierName = Literal["ram", "disk", "remote"]
# The tiers from the fastest to the slowest, the order the store walks them in.
TIER_ORDER: tuple[TierName, ...] = ("ram", "disk", "remote")


def slowest(tiers: Iterable[TierName], default: TierName) -> TierName:
    """The slowest of `tiers` (what a restore served by all of them waited for); `default` if none."""
    found = [TIER_ORDER.index(tier) for tier in tiers]
    return TIER_ORDER[max(found)] if found else default


# token_count, prefix_hash, rolling_hash (unsigned): a row of a tier's lookup catalog, what a
# longest-prefix lookup needs of an entry
CatalogRow = tuple[int, str, int]


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What a tier knows of one entry without loading it."""

    key: SnapshotKey
    tier: TierName
    priority: int
    nbytes: int  # RAM: snapshot.nbytes; disk: size of the file
    state_bytes: int  # uncompressed state size
    created_at: float
    last_used_at: float
    rolling_hash: int  # key.rolling_hash(tokens); candidates for longest-prefix lookup


# The eviction order, one definition for every tier (and for `snapcache prune`): ascending by these
# EntryInfo fields, the first entry goes first. The disk index sorts by the same names as columns.
EVICTION_ORDER = ("priority", "last_used_at", "created_at")


def eviction_rank(entry: EntryInfo) -> tuple[int, float, float]:
    """Where `entry` stands in the eviction order: lowest priority, then least recently used, first."""
    return (entry.priority, entry.last_used_at, entry.created_at)


_E = TypeVar("_E", bound="EntryInfo")


def in_eviction_order(entries: Iterable[_E]) -> list[_E]:
    """`entries` sorted in the order a tier would evict them: the first goes first."""
    return sorted(entries, key=eviction_rank)


def may_evict(incoming_priority: int, victim_priority: int) -> bool:
    """The admission rule: a put of priority p may evict only entries of priority p or lower.

    A put that cannot fit without evicting a higher priority is kept out of the tier (the tier's put
    returns False and evicts nothing), so a stream of low-priority puts never pushes out what a caller
    marked as more valuable.
    """
    return victim_priority <= incoming_priority


class Tier(Protocol):
    """A bounded map from SnapshotKey to Snapshot with priority-then-LRU eviction."""

    name: TierName

    @property
    def budget_bytes(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...

    @property
    def evictions(self) -> int: ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def put(self, snapshot: Snapshot) -> bool:
        """Store `snapshot`, evicting others as needed; False (nothing evicted) if it does not fit.

        It does not fit when it is larger than the whole budget, or when making room would evict an
        entry of higher priority than its own (`may_evict`).
        """
        ...

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot under `key`, marked as just used; None on a miss."""
        ...

    def remove(self, key: SnapshotKey) -> bool: ...

    def entries(self) -> list[EntryInfo]: ...

    def close(self) -> None: ...
