"""The disk tier's SQLite index: one row per stored snapshot; a committed row is a stored snapshot.

A row names the file that holds it: a snapshot file of its own, or a pack file shared with the other
blocks one save wrote. A row's bytes are its share of its file, so that the rows' bytes always sum to
the files' bytes: a row deleted while others of its file remain hands its share to one of them, and
the file goes (the transaction reports it freed) with its last row. Eviction frees whole files.

One connection per DiskIndex, shared by threads under a lock; WAL mode lets several processes read
while one writes. Budget accounting and the choice of victims happen inside one BEGIN IMMEDIATE
transaction (disk.index_eviction), so processes sharing a directory cannot overshoot the budget
together. The tables, their triggers and opening the file are in disk.index_schema.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from snapcache.disk.index_eviction import (
    KEYS_PER_QUERY,
    Change,
    catalog_generation,
    delete_files,
    delete_rows,
    evict,
    excess,
    put_rows,
)
from snapcache.disk.index_schema import (
    BUSY_TIMEOUT_S,
    COLUMNS,
    INSERT,
    SCHEMA_VERSION,
    UINT64,
    IndexDamaged,
    IndexRow,
    meta,
    open_index,
    row_of,
    sqlite_errors,
    to_signed64,
    transaction,
)
from snapcache.tier_contract import CatalogRow

__all__ = ["SCHEMA_VERSION", "Change", "DiskIndex", "IndexDamaged", "IndexRow", "to_signed64"]

_T = TypeVar("_T")

# Recording a use is best effort: it gives up quickly rather than make a hit wait for a writer.
_TOUCH_BUSY_TIMEOUT_MS = 50
_CATALOG = "SELECT token_count, prefix_hash, rolling_hash FROM entries WHERE fingerprint = ? AND scope = ?"
_BUDGET_META = "budget_bytes"


class DiskIndex:
    """The SQLite file beside the snapshots.

    Raises IndexDamaged when the file is not a sound database, StoreUnavailable for other failures.
    `created` tells whether this open created the tables (a new or emptied index).
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        opened = open_index(path)
        self._conn = opened.conn
        self.created = opened.created
        self.store_id = opened.store_id

    def get(self, key_id: str) -> IndexRow | None:
        with self._lock, sqlite_errors("read"):
            values = self._conn.execute(
                f"SELECT {COLUMNS} FROM entries WHERE key_id = ?", (key_id,)
            ).fetchone()
        return None if values is None else row_of(values)

    def get_many(self, key_ids: Sequence[str]) -> dict[str, IndexRow]:
        """The rows of those of `key_ids` the index holds, by key id: one query per 500 keys."""
        found: dict[str, IndexRow] = {}
        with self._lock, sqlite_errors("read"):
            for start in range(0, len(key_ids), KEYS_PER_QUERY):
                chunk = list(key_ids[start : start + KEYS_PER_QUERY])
                marks = ", ".join("?" * len(chunk))
                cursor = self._conn.execute(f"SELECT {COLUMNS} FROM entries WHERE key_id IN ({marks})", chunk)
                for values in cursor.fetchall():
                    row = row_of(values)
                    found[row.key_id] = row
        return found

    def rows(self, fingerprint: str | None = None, scope: str | None = None) -> list[IndexRow]:
        clauses, params = [], []
        if fingerprint is not None:
            clauses.append("fingerprint = ?")
            params.append(fingerprint)
        if scope is not None:
            clauses.append("scope = ?")
            params.append(scope)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock, sqlite_errors("read"):
            cursor = self._conn.execute(f"SELECT {COLUMNS} FROM entries{where}", params)
            return [row_of(values) for values in cursor.fetchall()]

    def catalog(self, fingerprint: str, scope: str) -> tuple[int, list[CatalogRow]]:
        """The generation and the lookup fields of one fingerprint and scope, read as one snapshot."""
        with self._lock, sqlite_errors("read"):
            self._conn.execute("BEGIN")  # one read snapshot: the generation matches the rows
            try:
                generation = catalog_generation(self._conn)
                rows = self._conn.execute(_CATALOG, (fingerprint, scope)).fetchall()
            finally:
                self._conn.execute("COMMIT")
        return generation, [(count, prefix, rolling % UINT64) for count, prefix, rolling in rows]

    def file_names(self) -> set[str]:
        """The file name of every row."""
        with self._lock, sqlite_errors("read"):
            return {str(name) for (name,) in self._conn.execute("SELECT file_name FROM entries")}

    def count(self) -> int:
        with self._lock, sqlite_errors("read"):
            return int(self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def used_bytes(self) -> int:
        with self._lock, sqlite_errors("read"):
            row = self._conn.execute("SELECT COALESCE(SUM(file_bytes), 0) FROM entries").fetchone()
            return int(row[0])

    def generation(self) -> int:
        """Grows whenever rows were added, replaced or removed, by this or any other process."""
        with self._lock, sqlite_errors("read"):
            return catalog_generation(self._conn)

    def put(self, row: IndexRow, budget_bytes: int) -> Change | None:
        """Commit `row`, evicting lowest priority then least recently used files until it fits.

        None (nothing changed) when the file alone exceeds the budget, or when room for it would
        take evicting a row of higher priority than `row.priority` (`tier.may_evict`). A row it
        replaces takes the other rows of its file with it.
        """
        return self.put_file([row], budget_bytes)

    def put_file(self, rows: Sequence[IndexRow], budget_bytes: int) -> Change | None:
        """Commit the rows of one new file (one priority), all or none: see `put`."""
        if sum(row.file_bytes for row in rows) > budget_bytes:
            return None
        return self._write("write", lambda: put_rows(self._conn, rows, budget_bytes))

    def admits(self, key_ids: Sequence[str], priority: int, file_bytes: int, budget_bytes: int) -> bool:
        """Whether a put would find room now: a read-only check before writing the file."""
        with self._lock, sqlite_errors("read"):
            return excess(self._conn, key_ids, priority, file_bytes, budget_bytes) is not None

    def recorded_budget(self) -> int | None:
        """The disk budget recorded for this directory by the last store given one, if any."""
        with self._lock, sqlite_errors("read"):
            text = meta(self._conn, _BUDGET_META)
        return int(text) if text.isdigit() else None

    def record_budget(self, budget_bytes: int) -> Change | None:
        """Record `budget_bytes` for this directory and evict down to it; the change, if any rows went."""

        def body() -> Change | None:
            execute = self._conn.execute
            if meta(self._conn, _BUDGET_META) != str(budget_bytes):
                execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (_BUDGET_META, str(budget_bytes)))
            used = int(execute("SELECT COALESCE(SUM(file_bytes), 0) FROM entries").fetchone()[0])
            if used <= budget_bytes:
                return None
            before = catalog_generation(self._conn)
            evicted, freed = evict(self._conn, used - budget_bytes)
            return Change(before, catalog_generation(self._conn), (), tuple(evicted), tuple(freed))

        if self.recorded_budget() == budget_bytes and self.used_bytes() <= budget_bytes:
            return None  # the common case: no write transaction at every open
        return self._write("record the budget", body)

    def touch(self, key_id: str, file_name: str, when: float) -> None:
        """Record a use; gives up after a short wait for another writer (StoreUnavailable)."""
        with self._lock, sqlite_errors("record a use"):
            self._conn.execute(f"PRAGMA busy_timeout = {_TOUCH_BUSY_TIMEOUT_MS}")
            try:
                # One statement in autocommit mode: a failure leaves no transaction open.
                self._conn.execute(
                    "UPDATE entries SET last_used_at = ? WHERE key_id = ? AND file_name = ?",
                    (when, key_id, file_name),
                )
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def touch_many(self, uses: list[tuple[str, str, float]]) -> None:
        """Record several uses (key id, file name, when) in one transaction; like `touch` otherwise."""
        with self._lock, sqlite_errors("record uses"):
            self._conn.execute(f"PRAGMA busy_timeout = {_TOUCH_BUSY_TIMEOUT_MS}")
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(
                        "UPDATE entries SET last_used_at = ? WHERE key_id = ? AND file_name = ?",
                        [(when, key_id, file_name) for key_id, file_name, when in uses],
                    )
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def delete(self, key_id: str, file_name: str | None = None) -> Change | None:
        """Remove the row of `key_id` (only if it still names `file_name`, when given)."""

        def body() -> Change | None:
            values = self._conn.execute(
                f"SELECT {COLUMNS} FROM entries WHERE key_id = ?", (key_id,)
            ).fetchone()
            if values is None:
                return None
            row = row_of(values)
            if file_name is not None and row.file_name != file_name:
                return None
            before = catalog_generation(self._conn)
            removed, freed = delete_rows(self._conn, [row])
            return Change(before, catalog_generation(self._conn), (), tuple(removed), tuple(freed))

        return self._write("write", body)

    def delete_file(self, file_name: str) -> Change | None:
        """Remove every row naming `file_name` (a file that is gone)."""

        def body() -> Change | None:
            before = catalog_generation(self._conn)
            removed = delete_files(self._conn, [file_name])
            if not removed:
                return None
            return Change(before, catalog_generation(self._conn), (), tuple(removed), (file_name,))

        return self._write("write", body)

    def set_priority(self, key_id: str, file_name: str, priority: int) -> bool:
        """Give the row of `key_id` `priority` in place, if it still names `file_name`."""

        def body() -> bool:
            cursor = self._conn.execute(
                "UPDATE entries SET priority = ? WHERE key_id = ? AND file_name = ?",
                (priority, key_id, file_name),
            )
            return cursor.rowcount > 0

        return self._write("write", body)

    def rebuild(self, rows: list[IndexRow], store_id: str) -> None:
        """Fill an empty index with `rows` (recovered from the files) written by store `store_id`."""

        def body() -> None:
            self._conn.execute("UPDATE meta SET value = ? WHERE name = 'store_id'", (store_id,))
            self._conn.executemany(INSERT, [row.params() for row in rows])

        self._write("rebuild", body)
        self.store_id = store_id

    def _write(self, action: str, body: Callable[[], _T]) -> _T:
        """Run `body` in one write transaction, under the lock, with SQLite errors translated."""
        with self._lock, sqlite_errors(action), transaction(self._conn):
            return body()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
