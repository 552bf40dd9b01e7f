"""The contract both storage tiers honour, and the row they describe their entries with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

TierName = Literal["ram", "disk"]


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
        """Store `snapshot`, evicting others as needed; False (nothing evicted) if it can never fit."""
        ...

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot under `key`, marked as just used; None on a miss."""
        ...

    def remove(self, key: SnapshotKey) -> bool: ...

    def entries(self) -> list[EntryInfo]: ...

    def close(self) -> None: ...
