"""What a worker asked its store before it was killed, and what the store then owes it.

A worker appends a line before each store call and one after it returns (`Journal.note`), on a file
opened O_APPEND. SIGKILL ends the process, not the kernel: every line written before the kill is in
the page cache and read back by the parent, fsynced or not (only a machine crash would need fsync,
and that is not what these tests do). A line the kill cut short has no newline and is ignored.

Lines, one event each (a key is a snapshot number of payload.py, or a prompt "text:length"):
  put KEY PRIORITY     a put is about to start         kept KEY / refused KEY   it returned
  remove KEY           a remove is about to start      removed KEY              it returned
  flushed              flush() returned: every call journalled before it reached the disk
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


class Journal:
    """The worker's side: an append-only file of events."""

    def __init__(self, path: str | Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def note(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())


def read_journal(path: Path) -> list[list[str]]:
    """The complete lines of a journal, split into fields."""
    lines = path.read_bytes().split(b"\n") if path.exists() else [b""]
    return [line.decode().split() for line in lines[:-1]]  # the last piece: empty, or cut by the kill


@dataclass
class Owed:
    """What a store directory owes its killed writers, from their journals replayed in order.

    A put is owed once it returned kept (writes on the calling thread) or once a flush returned after
    it (write-behind: until then it is a write in flight, which a kill may lose). It stays owed until
    a remove of its key starts, whatever later puts of the same key do: the old file stays until the
    new one is committed. `evictable(priority)` says which puts the budget may evict: those are never
    owed, only checked when served. A remove that returned (and, with write-behind, was flushed)
    leaves its key gone until another put of it starts.
    """

    evictable_below: int  # puts of a lower priority may be evicted; 0: nothing is
    owed: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)  # every key a put ever started for
    gone: set[str] = field(default_factory=set)
    alive: set[str] = field(default_factory=set)  # kept, and no remove started since: owed or evictable
    refused: list[str] = field(default_factory=list)  # owed-priority puts the store turned down
    acknowledged: int = 0  # puts that returned kept, over all journals replayed
    _unflushed: set[str] = field(default_factory=set)
    _removed_unflushed: set[str] = field(default_factory=set)

    def replay(self, events: list[list[str]], *, write_behind: bool) -> int:
        """Apply one worker's journal; returns how many of its puts returned kept."""
        self._unflushed.clear()
        self._removed_unflushed.clear()
        priorities: dict[str, int] = {}
        acknowledged = 0
        for event in events:
            kind, key = event[0], event[1] if len(event) > 1 else ""
            if kind == "put":
                priorities[key] = int(event[2])
                self.written.add(key)
                self.gone.discard(key)
                self._removed_unflushed.discard(key)
            elif kind == "kept":
                acknowledged += 1
                self.alive.add(key)
                if priorities[key] >= self.evictable_below:
                    (self._unflushed if write_behind else self.owed).add(key)
            elif kind == "refused":
                if priorities[key] >= self.evictable_below:
                    self.refused.append(key)
            elif kind == "remove":
                self.alive.discard(key)
                self.owed.discard(key)
                self._unflushed.discard(key)
            elif kind == "removed":
                (self._removed_unflushed if write_behind else self.gone).add(key)
            elif kind == "flushed":
                self.owed |= self._unflushed
                self.gone |= self._removed_unflushed
                self._unflushed.clear()
                self._removed_unflushed.clear()
            else:
                raise ValueError(f"unknown journal event {event}")
        self.acknowledged += acknowledged
        return acknowledged

    def problems(self, served: set[str]) -> list[str]:
        """What is wrong with a directory that serves the keys `served` (each already checked for its
        bytes): an owed key missing, a removed key back, a key never written."""
        found = [f"acknowledged put of {key} lost" for key in sorted(self.owed - served)]
        found += [f"removed {key} served again" for key in sorted(self.gone & served)]
        found += [f"{key} served but never written" for key in sorted(served - self.written)]
        found += [f"put of {key} refused although the budget holds it" for key in self.refused]
        return found
