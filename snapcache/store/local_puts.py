"""The store's puts: admitting snapshots into RAM and queueing their disk writes, sending them to the
remote tier (compressed once for both), and the put arguments checked and copied into snapshots."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy.typing as npt

from snapcache.errors import InvalidArgument, KeyMismatch, StoreUnavailable
from snapcache.formats.pack_file import PACK_MEMBERS, PACK_STATE_BYTES
from snapcache.key import SnapshotKey, Tokens, as_token_array, validate_priority
from snapcache.snapshot import Buffer, Snapshot
from snapcache.store.inputs import copy_logits, copy_state
from snapcache.store.memory import StoreMemory
from snapcache.store.read_tiers import disk_call
from snapcache.store.report import Counters
from snapcache.store.write_behind import WriteBehind

if TYPE_CHECKING:
    from snapcache.disk import DiskTier
    from snapcache.remote import RemoteTier
    from snapcache.store.shared_payloads import SharedPayloads

log = logging.getLogger("snapcache")


class LocalPuts:
    """Puts into the local tiers: RAM now, the disk through the write-behind queue (if any)."""

    def __init__(
        self,
        lock: threading.Condition,
        memory: StoreMemory,
        counters: Counters,
        disk: DiskTier | None,
        writes: WriteBehind | None,
        closed: Callable[[], bool],
    ) -> None:
        self._lock = lock
        self._memory = memory
        self._counters = counters
        self._disk = disk
        self._writes = writes
        self._closed = closed

    def put(self, snapshot: Snapshot) -> bool:
        """Admit `snapshot` into RAM and queue its disk write; whether a local tier keeps it."""
        return self.put_many([snapshot])[0]

    def put_many(self, snapshots: list[Snapshot]) -> list[bool]:
        """Admit `snapshots` into RAM and queue their disk writes at once; whether a local tier keeps
        each."""
        ram, writes = self._memory.ram, self._writes
        with self._lock:
            if writes is not None:
                writes.wait_for_room(sum(s.nbytes for s in snapshots), self._closed)
            if self._closed():  # closed while this put waited, or just before it took the lock
                raise StoreUnavailable("the store is closed")
            in_ram = [self._memory.admit(snapshot, queue_write=False) for snapshot in snapshots]
            if writes is not None:
                writes.queue_together([snapshot.key for snapshot in snapshots])
        if writes is None:
            for snapshot, kept in zip(snapshots, in_ram, strict=True):
                if not kept:
                    self.drop(snapshot, self._memory.refusal(snapshot))
            return in_ram
        if not writes.background:
            writes.drain()
            disk = self._disk
            assert disk is not None
            with self._lock:
                in_memory = [ram is not None and s.key in ram for s in snapshots]
            return [
                held or disk_call("contains", disk.__contains__, s.key, default=False)
                for s, held in zip(snapshots, in_memory, strict=True)
            ]
        return [True] * len(snapshots)

    def copy_in(self, snapshot: Snapshot) -> None:
        """A remote hit, kept in the local tiers (and not sent back to the remote one)."""
        with contextlib.suppress(StoreUnavailable):  # closed meanwhile: the hit is served all the same
            self.put(snapshot)

    def drop(self, snapshot: Snapshot, why: str) -> None:
        """Log and count a snapshot no tier keeps."""
        log.warning(
            "snapcache: dropped snapshot %s (%d bytes): %s", snapshot.key.id[:16], snapshot.nbytes, why
        )
        with self._lock:
            self._counters.dropped += 1


def put_everywhere(
    puts: LocalPuts, snapshots: list[Snapshot], remote: RemoteTier | None, payloads: SharedPayloads | None
) -> list[Snapshot | None]:
    """`snapshots` put into the local tiers a pack's run at a time and sent to the remote tier (each
    compressed once for the disk and Redis, by `payloads`); each one a local tier keeps, else None."""
    if payloads is not None:
        for snapshot in snapshots:
            payloads.expect(snapshot, 2)
    kept: list[Snapshot | None] = []
    for batch in packs_of(snapshots):
        for snapshot, held in zip(batch, puts.put_many(batch), strict=True):
            kept.append(snapshot if held else None)
            if remote is not None:
                remote.put(snapshot)
    return kept


def snapshot_to_put(
    key: SnapshotKey,
    tokens: Tokens,
    state_bytes: Buffer,
    priority: int,
    logits: npt.ArrayLike | None,
    created_at: float,
    *,
    owned: bool = False,
) -> Snapshot:
    """A put's arguments checked and copied into the snapshot to store (the state kept as it is
    when `owned`: see `copy_state`)."""
    if not isinstance(key, SnapshotKey):
        raise InvalidArgument(f"key must be a SnapshotKey, got {type(key).__name__}")
    priority = validate_priority(priority)
    array = as_token_array(tokens)
    if not key.matches(array):
        raise KeyMismatch(f"the {len(array)} tokens given do not hash to the key")
    state = copy_state(state_bytes, owned=owned)
    return Snapshot(key, array, state, copy_logits(logits), priority, created_at)


def packs_of(snapshots: list[Snapshot]) -> Iterator[list[Snapshot]]:
    """`snapshots` in runs the disk tier packs into one file each: queued a run at a time, so that a
    store without RAM holds at most one run waiting for the disk."""
    run: list[Snapshot] = []
    run_bytes = 0
    for snapshot in snapshots:
        if run and (len(run) == PACK_MEMBERS or run_bytes + snapshot.nbytes > PACK_STATE_BYTES):
            yield run
            run, run_bytes = [], 0
        run.append(snapshot)
        run_bytes += snapshot.nbytes
    if run:
        yield run
