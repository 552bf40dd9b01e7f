"""The store's copy of the disk's lookup catalogs, one per (fingerprint, scope), kept current cheaply.

A catalog is re-read only when the disk's catalog generation moved (another process wrote, say);
changes of this store's own making are applied in place as the disk tier reports them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING

from snapcache.errors import InvalidArgument, StoreUnavailable
from snapcache.key import SnapshotKey
from snapcache.store.prefix_index import PrefixIndex

if TYPE_CHECKING:
    from snapcache.disk import Change, DiskTier

log = logging.getLogger("snapcache")

GroupId = tuple[str, str]  # (model fingerprint, scope)


class DiskCatalogs:
    """Per (fingerprint, scope): the disk's entries as a PrefixIndex, and the generation it is at.

    Guarded by the store's lock; reads of the disk happen outside it.
    """

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._disk: DiskTier | None = None
        self._by_group: dict[GroupId, tuple[int, PrefixIndex]] = {}

    def attach(self, disk: DiskTier) -> None:
        """The disk tier to read (it reports its changes to `apply`, so it is made after this)."""
        self._disk = disk

    def cached(self, model_fingerprint: str, scope: str) -> tuple[int, PrefixIndex] | None:
        """The catalog held now and its generation, without asking the disk."""
        with self._lock:
            return self._by_group.get((model_fingerprint, scope))

    def get(self, model_fingerprint: str, scope: str) -> PrefixIndex:
        """The disk's entries of one fingerprint and scope, re-read when the disk's catalog changed.

        A re-read reuses the keys of the catalog it replaces. An unreadable disk gives the catalog
        held (or an empty one) with a logged warning.
        """
        disk = self._disk
        assert disk is not None
        group = (model_fingerprint, scope)
        with self._lock:
            cached = self._by_group.get(group)
        try:
            if cached is not None and cached[0] == disk.data_version():
                return cached[1]
            fresh = disk.catalog(model_fingerprint, scope)
        except (StoreUnavailable, OSError) as exc:
            log.warning("snapcache: disk catalog failed: %s", exc)
            return PrefixIndex() if cached is None else cached[1]
        # Built outside the lock: of_group only looks keys up in the old catalog, never iterates its
        # maps, so a concurrent `apply` to it is harmless.
        catalog = PrefixIndex.of_group(
            model_fingerprint, scope, fresh.rows, None if cached is None else cached[1]
        )
        with self._lock:
            current = self._by_group.get(group)
            if current is None or current[0] <= fresh.generation:
                self._by_group[group] = (fresh.generation, catalog)
        return catalog

    def apply(self, change: Change) -> None:
        """Apply one committed disk transaction of this store to the catalogs current just before it.

        The disk tier reports the catalog generation read inside the transaction, before and after
        its writes, so a catalog at `before` is exactly current at `after` once the change is applied,
        whatever the step between them. A catalog at any other generation is left stale: the next
        lookup re-reads it.
        """
        with self._lock:
            for group, (version, catalog) in list(self._by_group.items()):
                if version != change.before:
                    continue
                for row in change.removed:
                    if (row.fingerprint, row.scope) == group:
                        with contextlib.suppress(InvalidArgument):  # a row no put could have written
                            catalog.remove(row.key())
                for added in change.added:
                    if (added.fingerprint, added.scope) == group:
                        catalog.add(added.key(), added.rolling_hash)
                self._by_group[group] = (change.after, catalog)

    def forget(self, key: SnapshotKey) -> None:
        """Drop `key`: the disk no longer serves it to this store."""
        with self._lock:
            cached = self._by_group.get((key.model_fingerprint, key.scope))
            if cached is not None:
                cached[1].remove(key)
