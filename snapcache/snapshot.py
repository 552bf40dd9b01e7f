"""The value a store holds: one sequence's llama.cpp state and the tokens it covers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from snapcache.key import MAX_PRIORITY as MAX_PRIORITY  # re-exported: callers import it from here
from snapcache.key import SnapshotKey, TokenArray

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """A stored state. `tokens` is a read-only int32 array; `logits` is float32 or None."""

    key: SnapshotKey
    tokens: TokenArray
    state: Buffer
    logits: npt.NDArray[np.float32] | None = None
    priority: int = 0
    created_at: float = field(default_factory=time.time)

    @property
    def nbytes(self) -> int:
        """What this snapshot costs a RAM budget: state, logits and token bytes."""
        logits_bytes = 0 if self.logits is None else int(self.logits.nbytes)
        return memoryview(self.state).nbytes + logits_bytes + int(self.tokens.nbytes)
