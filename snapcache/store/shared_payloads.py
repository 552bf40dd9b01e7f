"""A put compressed once for the disk and the remote tier: the first writer compresses, the other reuses.

The disk file and the Redis value of a snapshot differ in their envelope (each names its own store),
not in the compressed state they carry, which is most of the work of writing either. The store
announces each put that both tiers will write (`expect`); each tier's writer, on its own thread and
in its own time, asks for the payload (`__call__`): the first compresses it, the other finds it here.
A payload is dropped once both took it; what a writer never asks for (Redis held the key already,
the snapshot was dropped from a backlog) is dropped when newer puts need the room, and the bounds
only cost a second compression, never a wrong byte.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from snapcache.formats.codec import StateCodec
from snapcache.key import SnapshotKey
from snapcache.snapshot import Buffer, Snapshot

if TYPE_CHECKING:
    from snapcache.disk import DiskTier
    from snapcache.remote import RemoteTier

# What waits for its second writer, at most: the remote backlog may lag the disk by this much before
# a payload is compressed again.
MAX_BYTES = 256 << 20
MAX_ENTRIES = 4096

# A put's identity without holding its state: its key, when it was made, and its size.
_PutId = tuple[SnapshotKey, float, int]


@dataclass(slots=True)
class _Entry:
    writers: int  # writers that have yet to take the payload
    payloads: dict[StateCodec, Buffer] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while one writer compresses


class SharedPayloads:
    """The compressed states of recent puts, for the writers of several tiers. Thread-safe."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> None:
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._entries: OrderedDict[_PutId, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def expect(self, snapshot: Snapshot, writers: int) -> None:
        """`writers` tiers will ask for the payload of `snapshot`."""
        with self._lock:
            old = self._entries.pop(_put_id(snapshot), None)
            if old is not None:
                self._bytes -= _size(old)
            self._entries[_put_id(snapshot)] = _Entry(writers)
            self._trim()

    def __call__(self, snapshot: Snapshot, state_codec: StateCodec) -> Buffer:
        """The state of `snapshot` encoded with `state_codec`: compressed now, or by the writer that
        asked before (this one waits for that compression rather than doing its own). A raw
        payload is the state itself: nothing is kept, the writer is only counted."""
        put_id = _put_id(snapshot)
        with self._lock:
            entry = self._entries.get(put_id)
        if entry is None or state_codec.raw:
            payload = state_codec.encode(snapshot.state)
        else:
            with entry.lock:
                payload = self._shared(put_id, entry, snapshot, state_codec)
        if entry is None:
            return payload
        with self._lock:
            entry.writers -= 1
            if entry.writers <= 0 and self._entries.get(put_id) is entry:
                del self._entries[put_id]
                self._bytes -= _size(entry)
            self._trim()
        return payload

    def _shared(self, put_id: _PutId, entry: _Entry, snapshot: Snapshot, state_codec: StateCodec) -> Buffer:
        """The payload `entry` holds for `state_codec`, compressed now if none does (entry.lock held)."""
        payload = entry.payloads.get(state_codec)
        if payload is None:
            payload = state_codec.encode(snapshot.state)
            with self._lock:  # with the count, so that a trim meanwhile subtracts what was added
                entry.payloads[state_codec] = payload
                if self._entries.get(put_id) is entry:
                    self._bytes += memoryview(payload).nbytes
        return payload

    @property
    def held_bytes(self) -> int:
        """The bytes of the payloads waiting for a writer."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _trim(self) -> None:
        """Drop the oldest entries while over either bound (the lock held)."""
        while self._entries and (len(self._entries) > self._max_entries or self._bytes > self._max_bytes):
            _, entry = self._entries.popitem(last=False)
            self._bytes -= _size(entry)


def share_payloads(disk: DiskTier | None, remote: RemoteTier | None) -> SharedPayloads | None:
    """One SharedPayloads for the writers of `disk` and `remote` when the store has both (None
    otherwise: nothing to share)."""
    if disk is None or remote is None:
        return None
    shared = SharedPayloads()
    disk.payloads = shared
    remote.payloads = shared
    return shared


def _put_id(snapshot: Snapshot) -> _PutId:
    return (snapshot.key, snapshot.created_at, memoryview(snapshot.state).nbytes)


def _size(entry: _Entry) -> int:
    return sum(memoryview(payload).nbytes for payload in entry.payloads.values())
