"""The uses of disk entries recorded in the index: what orders eviction among one priority."""

from __future__ import annotations

import logging
import time

from snapcache.disk.index import DiskIndex
from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey

logger = logging.getLogger("snapcache")

__all__ = ["record_uses"]

# A patient `touch` tries this long, this often, while another process holds the index's write lock.
_PATIENT_TOUCH_S = 2.0
_PATIENT_TOUCH_RETRY_S = 0.05


def record_uses(index: DiskIndex, keys: list[SnapshotKey], *, patient: bool) -> None:
    """Record a use of each of `keys` in one transaction, the first as the most recent; see
    `DiskTier.touch` for `patient`."""
    now = time.time()
    rows = index.get_many([key.id for key in keys])
    uses = []
    for i, key in enumerate(keys):
        row = rows.get(key.id)
        if row is not None:
            uses.append((row.key_id, row.file_name, now - i * 1e-6))
    if not uses:
        return
    # Patient: try again while another process writes, letting go of the index between tries.
    deadline = time.monotonic() + (_PATIENT_TOUCH_S if patient else 0.0)
    while True:
        try:
            index.touch_many(uses)
            return
        except StoreUnavailable as exc:
            if time.monotonic() >= deadline:
                logger.debug("could not record the use of %d blocks: %s", len(uses), exc)
                return
        time.sleep(_PATIENT_TOUCH_RETRY_S)
