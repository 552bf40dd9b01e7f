"""What the disk tier lists: its entries as rows for a caller, and a scope's catalog for lookups."""

from __future__ import annotations

from dataclasses import dataclass

from snapcache.disk.index import DiskIndex
from snapcache.errors import InvalidArgument
from snapcache.tier_contract import CatalogRow, EntryInfo

__all__ = ["Catalog", "entries"]


@dataclass(frozen=True, slots=True)
class Catalog:
    """The lookup fields of one fingerprint and scope, and the generation they were read at."""

    generation: int
    rows: list[CatalogRow]  # (token_count, prefix_hash, rolling_hash)


def entries(index: DiskIndex, model_fingerprint: str | None, scope: str | None) -> list[EntryInfo]:
    """The committed entries of `index`, optionally only those of one fingerprint and/or scope."""
    result = []
    for row in index.rows(model_fingerprint, scope):
        try:
            key = row.key()
        except InvalidArgument:
            continue
        result.append(
            EntryInfo(
                key=key,
                tier="disk",
                priority=row.priority,
                nbytes=row.file_bytes,
                state_bytes=row.state_bytes,
                created_at=row.created_at,
                last_used_at=row.last_used_at,
                rolling_hash=row.rolling_hash,
            )
        )
    return result
