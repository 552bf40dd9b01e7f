"""The remote tier's write-behind queue: a bounded backlog of snapshots and the one thread that sends them.

A completion must never wait for Redis: `submit` only queues. The backlog is bounded by count and
by bytes; when it is full the oldest waiting snapshot is dropped (and counted), since a remote copy
is an optimisation the local tiers do not depend on. A snapshot queued again before it was sent
replaces the waiting one.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

log = logging.getLogger("snapcache")


class RemoteWrites:
    """Snapshots waiting to be sent by `send` (which must not raise) on a background thread."""

    def __init__(self, send: Callable[[Snapshot], object], *, max_items: int, max_bytes: int) -> None:
        self._send = send
        self._max_items = max(1, max_items)
        self._max_bytes = max_bytes
        self._waiting: OrderedDict[SnapshotKey, Snapshot] = OrderedDict()
        self._bytes = 0
        self._busy = False
        self._stopping = False
        self._dropped = 0
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None  # started by the first submit

    @property
    def dropped(self) -> int:
        """Snapshots dropped unsent because the backlog was full."""
        with self._condition:
            return self._dropped

    @property
    def pending(self) -> int:
        """Snapshots waiting, and the one being sent."""
        with self._condition:
            return len(self._waiting) + self._busy

    def submit(self, snapshot: Snapshot) -> None:
        """Queue `snapshot`, dropping the oldest waiting ones while the backlog is over its bounds."""
        with self._condition:
            if self._stopping:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="snapcache-remote-writer", daemon=True
                )
                self._thread.start()
            old = self._waiting.pop(snapshot.key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._waiting[snapshot.key] = snapshot
            self._bytes += snapshot.nbytes
            dropped = 0
            while len(self._waiting) > 1 and (
                len(self._waiting) > self._max_items or self._bytes > self._max_bytes
            ):
                _, oldest = self._waiting.popitem(last=False)
                self._bytes -= oldest.nbytes
                dropped += 1
            if dropped:
                if not self._dropped:
                    log.warning("snapcache: the remote tier's write backlog is full; dropping the oldest")
                self._dropped += dropped
            self._condition.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing waits or is being sent; False if `timeout` passed first."""
        with self._condition:
            return self._condition.wait_for(lambda: not self._waiting and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what waits, then end the thread (waiting at most `timeout` for it)."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: bool(self._waiting) or self._stopping)
                if not self._waiting:
                    return  # stopping, and everything was sent
                _, snapshot = self._waiting.popitem(last=False)
                self._bytes -= snapshot.nbytes
                self._busy = True
            try:
                self._send(snapshot)
            except Exception:  # the writer must outlive anything one snapshot does to it
                log.exception("snapcache: remote write failed")
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()
