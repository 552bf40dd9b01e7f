"""The disk tier's SQLite index: one row per stored snapshot; a committed row is a stored snapshot.

A row names the file that holds it: a snapshot file of its own, or a pack file shared with the other
blocks one save wrote. A row's bytes are its share of its file, so that the rows' bytes always sum to
the files' bytes: a row deleted while others of its file remain hands its share to one of them, and
the file goes (the transaction reports it freed) with its last row. Eviction frees whole files.

One connection per DiskIndex, shared by threads under a lock; WAL mode lets several processes read
while one writes. Budget accounting and the choice of victims happen inside one BEGIN IMMEDIATE
transaction, so processes sharing a directory cannot overshoot the budget together.

The catalog generation (a one-row table) grows whenever rows are added, replaced or removed, by any
process: triggers bump it inside the writing transaction, so even a writer that does not know of it
keeps it true. Recording a use (last_used_at) leaves it alone, so readers of the catalog re-read it
only when it really changed.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey
from snapcache.tier import EVICTION_ORDER, CatalogRow

_T = TypeVar("_T")

SCHEMA_VERSION = 2
_BUSY_TIMEOUT_S = 30.0
# Recording a use is best effort: it gives up quickly rather than make a hit wait for a writer.
_TOUCH_BUSY_TIMEOUT_MS = 50
# SQLite's primary result codes for a file that is not, or no longer, a sound database.
_WAL_CHECKPOINT_PAGES = 64
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_UINT64 = 1 << 64
_INT64_MAX = (1 << 63) - 1
# Keys one query asks for at most (SQLite's oldest builds allow 999 bound parameters).
_KEYS_PER_QUERY = 500
_COLUMNS = (
    "key_id, fingerprint, scope, token_count, prefix_hash, rolling_hash, priority,"
    " file_name, file_bytes, state_bytes, created_at, last_used_at"
)
_INSERT = f"INSERT OR REPLACE INTO entries ({_COLUMNS}) VALUES ({', '.join('?' * 12)})"
_CHANGED_COLUMNS = (
    "key_id, fingerprint, scope, token_count, prefix_hash, rolling_hash, priority,"
    " file_name, file_bytes, state_bytes, created_at"
)
_ENTRIES_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
        key_id TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        scope TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        prefix_hash TEXT NOT NULL,
        rolling_hash INTEGER NOT NULL,
        priority INTEGER NOT NULL,
        file_name TEXT NOT NULL,
        file_bytes INTEGER NOT NULL,
        state_bytes INTEGER NOT NULL,
        created_at REAL NOT NULL,
        last_used_at REAL NOT NULL
    )"""
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    _ENTRIES_TABLE.format(name="entries"),
    "CREATE INDEX IF NOT EXISTS entries_by_eviction ON entries (priority, last_used_at)",
    "CREATE INDEX IF NOT EXISTS entries_by_scope ON entries (fingerprint, scope)",
    "CREATE INDEX IF NOT EXISTS entries_by_file ON entries (file_name)",
    "CREATE TABLE IF NOT EXISTS generation (id INTEGER PRIMARY KEY CHECK (id = 0), value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO generation VALUES (0, 0)",
    # Per row: INSERT OR REPLACE fires the insert trigger; evicting five rows bumps it five times.
    """CREATE TRIGGER IF NOT EXISTS entries_inserted AFTER INSERT ON entries
        BEGIN UPDATE generation SET value = value + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS entries_deleted AFTER DELETE ON entries
        BEGIN UPDATE generation SET value = value + 1; END""",
    f"""CREATE TRIGGER IF NOT EXISTS entries_changed AFTER UPDATE OF {_CHANGED_COLUMNS} ON entries
        BEGIN UPDATE generation SET value = value + 1; END""",
)
_GENERATION = "SELECT value FROM generation"
_BY_EVICTION = ", ".join(f"{column} ASC" for column in EVICTION_ORDER)
_CATALOG = "SELECT token_count, prefix_hash, rolling_hash FROM entries WHERE fingerprint = ? AND scope = ?"


_BUDGET_META = "budget_bytes"


def to_signed64(value: int) -> int:
    """A uint64 in SQLite's signed INTEGER form."""
    return value - _UINT64 if value > _INT64_MAX else value


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One committed snapshot file."""

    key_id: str
    fingerprint: str
    scope: str
    token_count: int
    prefix_hash: str
    rolling_hash: int  # unsigned 64-bit
    priority: int
    file_name: str
    file_bytes: int
    state_bytes: int
    created_at: float
    last_used_at: float

    @classmethod
    def of(
        cls,
        key: SnapshotKey,
        *,
        rolling_hash: int,
        priority: int,
        file_name: str,
        file_bytes: int,
        state_bytes: int,
        created_at: float,
        last_used_at: float,
    ) -> IndexRow:
        """The row of a snapshot file holding `key`."""
        return cls(
            key.id,
            key.model_fingerprint,
            key.scope,
            key.token_count,
            key.prefix_hash,
            rolling_hash,
            priority,
            file_name,
            file_bytes,
            state_bytes,
            created_at,
            last_used_at,
        )

    def key(self) -> SnapshotKey:
        return SnapshotKey(self.fingerprint, self.scope, self.token_count, self.prefix_hash)

    def params(self) -> tuple[object, ...]:
        return (
            self.key_id,
            self.fingerprint,
            self.scope,
            self.token_count,
            self.prefix_hash,
            to_signed64(self.rolling_hash),
            self.priority,
            self.file_name,
            self.file_bytes,
            self.state_bytes,
            self.created_at,
            self.last_used_at,
        )



class IndexDamaged(StoreUnavailable):
    """The index file is not a sound SQLite database (garbage, truncation)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One committed transaction of ours: the catalog generation before and after it, and its rows."""

    before: int
    after: int
    added: tuple[IndexRow, ...]  # the rows of one new file
    removed: tuple[IndexRow, ...]  # deleted or evicted rows, and the rows `added` replaced
    freed: tuple[str, ...] = ()  # files no row names any more: to delete once committed


def _row(values: Any) -> IndexRow:
    fields = list(values)
    fields[5] = int(fields[5]) % _UINT64  # rolling_hash back to unsigned
    return IndexRow(*fields)


def _is_damage(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


class DiskIndex:
    """The SQLite file beside the snapshots.

    Raises IndexDamaged when the file is not a sound database, StoreUnavailable for other failures.
    `created` tells whether this open created the tables (a new or emptied index).
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        self.created = False
        try:
            self._conn = sqlite3.connect(
                path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the index {path}: {exc}") from None
        try:
            self._setup()
        except BaseException:
            self._conn.close()
            raise

    def _setup(self) -> None:
        with self._errors("open"):
            # Switching to WAL needs a moment alone with the file; another process may be doing it.
            for attempt in range(50):
                try:
                    self._conn.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or attempt == 49:
                        raise
                    time.sleep(0.05)
            # NORMAL in WAL mode survives a process crash; a power cut may drop the last commits,
            # which leaves orphan files for check(), never a row without its file.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # A small log: checkpoints come while there is room, and later writes reuse the log's
            # space instead of growing it, so deletes still work on a disk that filled up.
            self._conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_CHECKPOINT_PAGES}")
            with self._transaction():
                self.created = (
                    self._conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'"
                    ).fetchone()
                    is None
                )
                for statement in _SCHEMA:
                    self._conn.execute(statement)
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (secrets.token_hex(16),)
                )
                if self._meta("schema_version") == "1":
                    self._migrate_from_v1()
            version = self._meta("schema_version")
            if version != str(SCHEMA_VERSION):
                raise StoreUnavailable(f"index schema version {version} is not supported")
            # Damage in pages the statements above did not read shows here, not in the middle of a get.
            verdict = self._conn.execute("PRAGMA quick_check(1)").fetchone()
            if verdict is None or verdict[0] != "ok":
                raise IndexDamaged(f"snapshot index failed its integrity check: {verdict}")
            self.store_id = self._meta("store_id")

    def _migrate_from_v1(self) -> None:
        """Schema 1 named one file per row (file_name UNIQUE): copy its rows into schema 2's table.
        Inside the opening transaction; the rows, and so the catalog generation, stay as they were."""
        execute = self._conn.execute
        execute(_ENTRIES_TABLE.format(name="entries_v2"))
        execute(f"INSERT INTO entries_v2 ({_COLUMNS}) SELECT {_COLUMNS} FROM entries")
        execute("DROP TABLE entries")  # its indexes and triggers go with it
        execute("ALTER TABLE entries_v2 RENAME TO entries")
        for statement in _SCHEMA:
            execute(statement)
        execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),))

    def _meta(self, name: str) -> str:
        row = self._conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return "" if row is None else str(row[0])

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            kind = IndexDamaged if _is_damage(exc) else StoreUnavailable
            raise kind(f"snapshot index: cannot {action}: {exc}") from None

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:  # a failed COMMIT (a full disk) leaves it open
                self._conn.execute("ROLLBACK")
            raise

    def _generation(self) -> int:
        return int(self._conn.execute(_GENERATION).fetchone()[0])

    def get(self, key_id: str) -> IndexRow | None:
        with self._lock, self._errors("read"):
            values = self._conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE key_id = ?", (key_id,)
            ).fetchone()
        return None if values is None else _row(values)

    def get_many(self, key_ids: Sequence[str]) -> dict[str, IndexRow]:
        """The rows of those of `key_ids` the index holds, by key id: one query per 500 keys."""
        found: dict[str, IndexRow] = {}
        with self._lock, self._errors("read"):
            for start in range(0, len(key_ids), _KEYS_PER_QUERY):
                chunk = list(key_ids[start : start + _KEYS_PER_QUERY])
                marks = ", ".join("?" * len(chunk))
                cursor = self._conn.execute(
                    f"SELECT {_COLUMNS} FROM entries WHERE key_id IN ({marks})", chunk
                )
                for values in cursor.fetchall():
                    row = _row(values)
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
        with self._lock, self._errors("read"):
            cursor = self._conn.execute(f"SELECT {_COLUMNS} FROM entries{where}", params)
            return [_row(values) for values in cursor.fetchall()]

    def catalog(self, fingerprint: str, scope: str) -> tuple[int, list[CatalogRow]]:
        """The generation and the lookup fields of one fingerprint and scope, read as one snapshot."""
        with self._lock, self._errors("read"):
            self._conn.execute("BEGIN")  # one read snapshot: the generation matches the rows
            try:
                generation = self._generation()
                rows = self._conn.execute(_CATALOG, (fingerprint, scope)).fetchall()
            finally:
                self._conn.execute("COMMIT")
        return generation, [(count, prefix, rolling % _UINT64) for count, prefix, rolling in rows]

    def file_names(self) -> set[str]:
        """The file name of every row."""
        with self._lock, self._errors("read"):
            return {str(name) for (name,) in self._conn.execute("SELECT file_name FROM entries")}

    def count(self) -> int:
        with self._lock, self._errors("read"):
            return int(self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def used_bytes(self) -> int:
        with self._lock, self._errors("read"):
            row = self._conn.execute("SELECT COALESCE(SUM(file_bytes), 0) FROM entries").fetchone()
            return int(row[0])

    def generation(self) -> int:
        """Grows whenever rows were added, replaced or removed, by this or any other process."""
        with self._lock, self._errors("read"):
            return self._generation()

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
        return self._write("write", lambda: self._put(rows, budget_bytes))

    def admits(self, key_ids: Sequence[str], priority: int, file_bytes: int, budget_bytes: int) -> bool:
        """Whether a put would find room now: a read-only check before writing the file."""
        with self._lock, self._errors("read"):
            return self._excess(key_ids, priority, file_bytes, budget_bytes) is not None

    def _excess(
        self, key_ids: Sequence[str], priority: int, file_bytes: int, budget_bytes: int
    ) -> int | None:
        """Bytes to evict for a file of `priority` and `file_bytes` holding `key_ids` to fit (files
        holding only rows it replaces go anyway); None if that would take evicting a higher priority."""
        marks = ", ".join("?" * len(key_ids))
        others, evictable = self._conn.execute(
            "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(CASE WHEN top <= ? THEN bytes ELSE 0 END), 0)"
            " FROM (SELECT SUM(file_bytes) AS bytes,"
            f" MAX(CASE WHEN key_id IN ({marks}) THEN NULL ELSE priority END) AS top"
            " FROM entries GROUP BY file_name) WHERE top IS NOT NULL",
            (priority, *key_ids),
        ).fetchone()
        excess = int(others) + file_bytes - budget_bytes
        return None if excess > int(evictable) else excess

    def _put(self, rows: Sequence[IndexRow], budget_bytes: int) -> Change | None:
        before = self._generation()
        key_ids = [row.key_id for row in rows]
        excess = self._excess(key_ids, rows[0].priority, sum(row.file_bytes for row in rows), budget_bytes)
        if excess is None:
            return None  # the rest is of higher priority: these rows stay out
        removed, freed = self._delete_rows(self._rows_of(key_ids))
        evicted, evicted_files = self._evict(excess, up_to_priority=rows[0].priority)
        self._conn.executemany(_INSERT, [row.params() for row in rows])
        return Change(before, self._generation(), tuple(rows), (*removed, *evicted), (*freed, *evicted_files))

    def _rows_of(self, key_ids: Sequence[str]) -> list[IndexRow]:
        found: list[IndexRow] = []
        for start in range(0, len(key_ids), _KEYS_PER_QUERY):
            chunk = list(key_ids[start : start + _KEYS_PER_QUERY])
            marks = ", ".join("?" * len(chunk))
            cursor = self._conn.execute(f"SELECT {_COLUMNS} FROM entries WHERE key_id IN ({marks})", chunk)
            found.extend(_row(values) for values in cursor.fetchall())
        return found

    def _delete_rows(self, rows: Sequence[IndexRow]) -> tuple[list[IndexRow], list[str]]:
        """Delete `rows`; each one's bytes go to a row of its file that remains. The rows deleted, and
        the files they leave without rows."""
        execute = self._conn.execute
        freed: list[str] = []
        for row in rows:
            execute("DELETE FROM entries WHERE key_id = ?", (row.key_id,))
            heir = execute(
                "SELECT key_id FROM entries WHERE file_name = ? ORDER BY key_id LIMIT 1", (row.file_name,)
            ).fetchone()
            if heir is None:
                freed.append(row.file_name)
            else:
                execute(
                    "UPDATE entries SET file_bytes = file_bytes + ? WHERE key_id = ?",
                    (row.file_bytes, heir[0]),
                )
        return list(rows), freed

    def _delete_files(self, file_names: Sequence[str]) -> list[IndexRow]:
        """Delete every row of `file_names`; the rows deleted."""
        removed: list[IndexRow] = []
        for name in file_names:
            cursor = self._conn.execute(f"SELECT {_COLUMNS} FROM entries WHERE file_name = ?", (name,))
            removed.extend(_row(values) for values in cursor.fetchall())
        self._conn.executemany("DELETE FROM entries WHERE file_name = ?", [(name,) for name in file_names])
        return removed

    def _evict(self, excess: int, up_to_priority: int | None = None) -> tuple[list[IndexRow], list[str]]:
        """Delete files (all their rows) in the eviction order of their rows until they total `excess`
        bytes, sparing files that hold a row above `up_to_priority`; the rows and files deleted."""
        if excess <= 0:
            return [], []
        cursor = self._conn.execute(f"SELECT file_name FROM entries ORDER BY {_BY_EVICTION}")
        victims: list[str] = []
        chosen: set[str] = set()
        while excess > 0:
            found = cursor.fetchone()
            if found is None:  # cannot happen: the rows sum to more than the excess
                break
            name = str(found[0])
            if name in chosen:
                continue
            chosen.add(name)
            size, top = self._conn.execute(
                "SELECT SUM(file_bytes), MAX(priority) FROM entries WHERE file_name = ?", (name,)
            ).fetchone()
            if up_to_priority is not None and int(top) > up_to_priority:
                continue
            victims.append(name)
            excess -= int(size)
        cursor.close()
        return self._delete_files(victims), victims

    def recorded_budget(self) -> int | None:
        """The disk budget recorded for this directory by the last store given one, if any."""
        with self._lock, self._errors("read"):
            text = self._meta(_BUDGET_META)
        return int(text) if text.isdigit() else None

    def record_budget(self, budget_bytes: int) -> Change | None:
        """Record `budget_bytes` for this directory and evict down to it; the change, if any rows went."""

        def body() -> Change | None:
            execute = self._conn.execute
            if self._meta(_BUDGET_META) != str(budget_bytes):
                execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (_BUDGET_META, str(budget_bytes)))
            used = int(execute("SELECT COALESCE(SUM(file_bytes), 0) FROM entries").fetchone()[0])
            if used <= budget_bytes:
                return None
            before = self._generation()
            evicted, freed = self._evict(used - budget_bytes)
            return Change(before, self._generation(), (), tuple(evicted), tuple(freed))

        if self.recorded_budget() == budget_bytes and self.used_bytes() <= budget_bytes:
            return None  # the common case: no write transaction at every open
        return self._write("record the budget", body)

    def touch(self, key_id: str, file_name: str, when: float) -> None:
        """Record a use; gives up after a short wait for another writer (StoreUnavailable)."""
        with self._lock, self._errors("record a use"):
            self._conn.execute(f"PRAGMA busy_timeout = {_TOUCH_BUSY_TIMEOUT_MS}")
            try:
                # One statement in autocommit mode: a failure leaves no transaction open.
                self._conn.execute(
                    "UPDATE entries SET last_used_at = ? WHERE key_id = ? AND file_name = ?",
                    (when, key_id, file_name),
                )
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")

    def touch_many(self, uses: list[tuple[str, str, float]]) -> None:
        """Record several uses (key id, file name, when) in one transaction; like `touch` otherwise."""
        with self._lock, self._errors("record uses"):
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
                self._conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")

    def delete(self, key_id: str, file_name: str | None = None) -> Change | None:
        """Remove the row of `key_id` (only if it still names `file_name`, when given)."""

        def body() -> Change | None:
            values = self._conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE key_id = ?", (key_id,)
            ).fetchone()
            if values is None:
                return None
            row = _row(values)
            if file_name is not None and row.file_name != file_name:
                return None
            before = self._generation()
            removed, freed = self._delete_rows([row])
            return Change(before, self._generation(), (), tuple(removed), tuple(freed))

        return self._write("write", body)

    def delete_file(self, file_name: str) -> Change | None:
        """Remove every row naming `file_name` (a file that is gone)."""

        def body() -> Change | None:
            before = self._generation()
            removed = self._delete_files([file_name])
            if not removed:
                return None
            return Change(before, self._generation(), (), tuple(removed), (file_name,))

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
            self._conn.executemany(_INSERT, [row.params() for row in rows])

        self._write("rebuild", body)
        self.store_id = store_id

    def _write(self, action: str, body: Callable[[], _T]) -> _T:
        """Run `body` in one write transaction, under the lock, with SQLite errors translated."""
        with self._lock, self._errors(action), self._transaction():
            return body()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
