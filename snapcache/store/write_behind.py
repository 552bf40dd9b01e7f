"""The write-behind queue: snapshots waiting for their disk write, and the one thread that writes them.

The queue shares the store's lock (a Condition over it): the store decides what to queue while it
holds the lock, and the writer writes without it. Methods documented "lock held" expect the caller
to hold it; the others take it themselves.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

log = logging.getLogger("snapcache")

# The writer takes up to this many queued snapshots at a time (two packs of blocks).
BATCH = 128


@dataclass(slots=True)
class PendingWrite:
    """One snapshot waiting for its disk write."""

    snapshot: Snapshot
    spill: bool  # evicted from RAM before reaching the disk: its write counts as a spill


class WriteBehind:
    """Snapshots on their way to disk, written in order by a background thread or by `drain`.

    `write(snapshots)` stores several on disk (the blocks of one save go into one file together) and
    says whether the disk kept each (never raises for a disk failure): the writer hands it whatever
    is queued, up to BATCH snapshots. `settle(job, stored, current)` runs with the lock held once a
    job is done; `current` is False when a newer job for the same key replaced it meanwhile.
    `undo(key)` runs without the lock when `discard` removed a key mid-write: the disk may hold what
    was just written.
    `held_in_ram(job)` tells whether RAM holds the job's snapshot, for the back-pressure limit,
    which counts only the bytes nothing else holds.
    """

    def __init__(
        self,
        condition: threading.Condition,
        *,
        write: Callable[[list[Snapshot]], list[bool]],
        settle: Callable[[PendingWrite, bool, bool], None],
        undo: Callable[[SnapshotKey], None],
        held_in_ram: Callable[[PendingWrite], bool],
        limit_bytes: int,
        background: bool,
    ) -> None:
        self._condition = condition
        self._write = write
        self._settle = settle
        self._undo = undo
        self._held_in_ram = held_in_ram
        self._limit = limit_bytes
        self._jobs: dict[SnapshotKey, PendingWrite] = {}
        self._bytes = 0  # all of them, those RAM holds too
        # Keys queued together (a save's blocks) stay together: the writer never splits an item.
        self._queue: queue.Queue[tuple[SnapshotKey, ...] | None] = queue.Queue()
        # One thread at a time writes queued snapshots: _writing names the keys it is writing.
        self._write_lock = threading.Lock()
        self._writing: set[SnapshotKey] = set()
        self._discarded_while_writing: set[SnapshotKey] = set()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._loop, name="snapcache-writer", daemon=True)
            self._thread.start()

    @property
    def background(self) -> bool:
        """True when a background thread writes; else the store calls `drain` itself."""
        return self._thread is not None

    def __contains__(self, key: object) -> bool:
        """Lock held."""
        return key in self._jobs

    def get(self, key: SnapshotKey) -> Snapshot | None:
        """The snapshot waiting under `key`, or None. Lock held."""
        job = self._jobs.get(key)
        return None if job is None else job.snapshot

    def snapshots(self) -> Iterator[Snapshot]:
        """Every snapshot waiting. Lock held."""
        return (job.snapshot for job in self._jobs.values())

    def add(self, snapshot: Snapshot, *, spill: bool, queue_now: bool = True) -> None:
        """Queue `snapshot`, replacing any job waiting under its key. Lock held.

        `queue_now=False` leaves queuing its key to a later `queue_together`."""
        old = self._jobs.get(snapshot.key)
        if old is not None:
            self._bytes -= old.snapshot.nbytes
        self._jobs[snapshot.key] = PendingWrite(snapshot, spill)
        self._bytes += snapshot.nbytes
        # Always queue: a job for this key may be mid-write with the older snapshot.
        if queue_now:
            self._queue.put((snapshot.key,))

    def queue_together(self, keys: list[SnapshotKey]) -> None:
        """Queue the jobs of `keys` (added with `queue_now=False`) as one item: the writer takes
        them in one batch, so that the blocks of one save share a file. Lock held."""
        if keys:
            self._queue.put(tuple(keys))

    def mark_spill(self, key: SnapshotKey) -> bool:
        """RAM evicted `key` while its write waits: that write is now the spill. Lock held."""
        job = self._jobs.get(key)
        if job is None:
            return False
        job.spill = True
        return True

    def discard(self, key: SnapshotKey) -> bool:
        """Forget the job of `key`; True if there was one. Lock held."""
        job = self._jobs.pop(key, None)
        if job is not None:
            self._bytes -= job.snapshot.nbytes
            self._condition.notify_all()
        if key in self._writing:
            self._discarded_while_writing.add(key)
        return job is not None

    def outside_ram_bytes(self) -> int:
        """Bytes of waiting snapshots that RAM does not hold. Lock held."""
        return sum(job.snapshot.nbytes for job in self._jobs.values() if not self._held_in_ram(job))

    def wait_for_room(self, nbytes: int, closed: Callable[[], bool]) -> None:
        """Back-pressure: wait while the writer is behind by more than the limit. Lock held.

        A snapshot larger than the limit waits only until nothing else is outside RAM.
        """
        if self._thread is None:
            return  # the caller drains after its put
        while not closed() and self._bytes + nbytes > self._limit:
            outside = self.outside_ram_bytes()
            if not outside or outside + nbytes <= self._limit:
                return
            self._condition.wait()

    def flush(self) -> None:
        """Wait until every write queued so far is done (with a background thread)."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.join()

    def stop(self) -> None:
        """Write what is queued and end the writer thread. Queue nothing afterwards."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        self.drain()

    def drain(self) -> None:
        """Write everything queued, on this thread."""
        with self._write_lock:
            while True:
                items = self._take(block=False)
                if not items:
                    return
                try:
                    self._write_jobs(_keys_of(items))
                finally:
                    for _ in items:
                        self._queue.task_done()

    def _loop(self) -> None:
        while True:
            items = self._take(block=True)
            try:
                with self._write_lock:
                    self._write_jobs(_keys_of(items))
            except Exception:  # the writer must survive anything one snapshot does to it
                log.exception("snapcache: background write failed")
            finally:
                for _ in items:
                    self._queue.task_done()
            if None in items:
                return

    def _take(self, *, block: bool) -> list[tuple[SnapshotKey, ...] | None]:
        """The next queued items, up to BATCH keys (or one larger item) and up to the stop mark
        (None) if any; [] when none wait and not `block`."""
        taken: list[tuple[SnapshotKey, ...] | None] = []
        count = 0
        try:
            while not taken or (taken[-1] is not None and count < BATCH):
                item = self._queue.get(block=block and not taken)
                taken.append(item)
                count += 0 if item is None else len(item)
        except queue.Empty:
            pass
        return taken

    def _write_jobs(self, keys: list[SnapshotKey]) -> None:
        with self._condition:
            jobs = [(key, self._jobs[key]) for key in dict.fromkeys(keys) if key in self._jobs]
            if not jobs:
                return  # discarded, or written by earlier jobs
            self._writing = {key for key, _ in jobs}
            self._discarded_while_writing = set()
        stored = [False] * len(jobs)
        try:
            stored = self._write([job.snapshot for _, job in jobs])
        finally:
            with self._condition:
                self._writing = set()
                discarded = self._discarded_while_writing
                for (key, job), kept in zip(jobs, stored, strict=True):
                    current = self._jobs.get(key) is job
                    if current:
                        del self._jobs[key]
                        self._bytes -= job.snapshot.nbytes
                    self._settle(job, kept, current)
                self._condition.notify_all()
        for key in discarded:
            self._undo(key)


def _keys_of(items: list[tuple[SnapshotKey, ...] | None]) -> list[SnapshotKey]:
    """The keys of queue items taken together, in order (the stop mark has none)."""
    return [key for item in items if item is not None for key in item]
