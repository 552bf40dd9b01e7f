"""What a disk tier's puts write: each snapshot checked, a `put_many`'s blocks cut into the runs that
share one pack file, and the index rows of a pack. The writing itself, the budget and the index
transaction are the tier's (`disk.tier.DiskTier`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterator, Sequence

from snapcache.disk.index import IndexRow
from snapcache.errors import InvalidArgument, KeyMismatch
from snapcache.formats.pack_file import PACK_MEMBERS, EncodedPack
from snapcache.key import SnapshotKey, rolling_hash, validate_priority
from snapcache.snapshot import Snapshot

__all__ = ["checked", "pack_rows", "pack_runs"]


def checked(snapshot: Snapshot) -> Snapshot:
    """`snapshot` with its key, priority and time checked for a put (its priority a plain int)."""
    if not snapshot.key.matches(snapshot.tokens):
        raise KeyMismatch("the snapshot's tokens do not hash to its key")
    priority = validate_priority(snapshot.priority)
    if type(snapshot.priority) is not int:  # a numpy integer: the header and index want an int
        snapshot = dataclasses.replace(snapshot, priority=priority)
    if not math.isfinite(snapshot.created_at):
        raise InvalidArgument(f"created_at must be a finite time, got {snapshot.created_at!r}")
    return snapshot


def pack_runs(
    snapshots: Sequence[Snapshot], held: Collection[str], limit_bytes: int
) -> Iterator[list[Snapshot]]:
    """`snapshots` in order, cut into runs for one pack each: blocks without logits that the tier
    does not hold yet (their key ids not in `held`), of one priority and one model, no key twice,
    at most PACK_MEMBERS of them and `limit_bytes` of state. Anything else is a run of its own."""
    run: list[Snapshot] = []
    run_keys: set[SnapshotKey] = set()
    run_bytes = 0
    for snapshot in snapshots:
        packable = snapshot.key.is_block and snapshot.logits is None and snapshot.key.id not in held
        state_bytes = memoryview(snapshot.state).nbytes
        if run and not (
            packable
            and snapshot.priority == run[0].priority
            and snapshot.key.model_fingerprint == run[0].key.model_fingerprint
            and snapshot.key not in run_keys
            and len(run) < PACK_MEMBERS
            and run_bytes + state_bytes <= limit_bytes
        ):
            yield run
            run, run_keys, run_bytes = [], set(), 0
        if packable:
            run.append(snapshot)
            run_keys.add(snapshot.key)
            run_bytes += state_bytes
        else:
            yield [snapshot]
    if run:
        yield run


def pack_rows(
    run: Sequence[Snapshot], encoded: EncodedPack, file_name: str, used_at: Sequence[float]
) -> list[IndexRow]:
    """The index rows of `run`, packed as `encoded` into `file_name`: each row's bytes its share of
    the file, its last use `used_at`, its creation the run's."""
    return [
        IndexRow.of(
            snapshot.key,
            rolling_hash=rolling_hash(snapshot.tokens),
            priority=run[0].priority,
            file_name=file_name,
            file_bytes=share,
            state_bytes=state_bytes,
            created_at=run[0].created_at,
            last_used_at=when,
        )
        for snapshot, share, state_bytes, when in zip(
            run, encoded.shares, encoded.state_bytes, used_at, strict=True
        )
    ]
