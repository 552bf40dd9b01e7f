"""The disk tier's SQLite index: one row per snapshot file; a committed row is a stored snapshot.

One connection per DiskIndex, shared by threads under a lock; WAL mode lets several processes read
while one writes. Budget accounting and the choice of victims happen inside one BEGIN IMMEDIATE
transaction, so processes sharing a directory cannot overshoot the budget together.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey

SCHEMA_VERSION = 1
_BUSY_TIMEOUT_S = 30.0
_UINT64 = 1 << 64
_INT64_MAX = (1 << 63) - 1
_COLUMNS = (
    "key_id, fingerprint, scope, token_count, prefix_hash, rolling_hash, priority,"
    " file_name, file_bytes, state_bytes, created_at, last_used_at"
)
_INSERT = f"INSERT OR REPLACE INTO entries ({_COLUMNS}) VALUES ({', '.join('?' * 12)})"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    scope TEXT NOT NULL,
    token_count INTEGER NOT NULL,
    prefix_hash TEXT NOT NULL,
    rolling_hash INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    file_name TEXT NOT NULL UNIQUE,
    file_bytes INTEGER NOT NULL,
    state_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_by_eviction ON entries (priority, last_used_at);
CREATE INDEX IF NOT EXISTS entries_by_scope ON entries (fingerprint, scope);
"""


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


@dataclass(frozen=True, slots=True)
class PutOutcome:
    """What committing a row displaced: the key's previous row and the evicted rows."""

    replaced: IndexRow | None
    evicted: tuple[IndexRow, ...]


def _row(values: Any) -> IndexRow:
    fields = list(values)
    fields[5] = int(fields[5]) % _UINT64  # rolling_hash back to unsigned
    return IndexRow(*fields)


class DiskIndex:
    """The SQLite file beside the snapshots."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        self._local_changes = 0
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
            with self._transaction():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (secrets.token_hex(16),)
                )
            version = self._meta("schema_version")
            if version != str(SCHEMA_VERSION):
                raise StoreUnavailable(f"index schema version {version} is not supported")
            self.store_id = self._meta("store_id")

    def _meta(self, name: str) -> str:
        row = self._conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return "" if row is None else str(row[0])

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"snapshot index: cannot {action}: {exc}") from None

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        self._local_changes += 1

    def get(self, key_id: str) -> IndexRow | None:
        with self._lock, self._errors("read"):
            values = self._conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE key_id = ?", (key_id,)
            ).fetchone()
        return None if values is None else _row(values)

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

    def count(self) -> int:
        with self._lock, self._errors("read"):
            return int(self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def used_bytes(self) -> int:
        with self._lock, self._errors("read"):
            row = self._conn.execute("SELECT COALESCE(SUM(file_bytes), 0) FROM entries").fetchone()
            return int(row[0])

    def data_version(self) -> int:
        """Changes whenever the index changed: by this object, or by any other connection."""
        with self._lock, self._errors("read"):
            external = int(self._conn.execute("PRAGMA data_version").fetchone()[0])
            return external + self._local_changes

    def put(self, row: IndexRow, budget_bytes: int) -> PutOutcome | None:
        """Commit `row`, evicting lowest priority then least recently used rows until it fits.

        None (nothing changed) when the file alone exceeds the budget.
        """
        if row.file_bytes > budget_bytes:
            return None
        with self._lock, self._errors("write"), self._transaction():
            execute = self._conn.execute
            previous = execute(f"SELECT {_COLUMNS} FROM entries WHERE key_id = ?", (row.key_id,)).fetchone()
            others = int(
                execute(
                    "SELECT COALESCE(SUM(file_bytes), 0) FROM entries WHERE key_id != ?",
                    (row.key_id,),
                ).fetchone()[0]
            )
            excess = others + row.file_bytes - budget_bytes
            evicted: list[IndexRow] = []
            if excess > 0:
                cursor = execute(
                    f"SELECT {_COLUMNS} FROM entries WHERE key_id != ?"
                    " ORDER BY priority ASC, last_used_at ASC, created_at ASC",
                    (row.key_id,),
                )
                while excess > 0:
                    values = cursor.fetchone()
                    if values is None:  # cannot happen: row.file_bytes <= budget_bytes
                        break
                    victim = _row(values)
                    evicted.append(victim)
                    excess -= victim.file_bytes
                cursor.close()
                self._conn.executemany("DELETE FROM entries WHERE key_id = ?", [(v.key_id,) for v in evicted])
            execute(_INSERT, row.params())
        return PutOutcome(replaced=None if previous is None else _row(previous), evicted=tuple(evicted))

    def touch(self, key_id: str, file_name: str, when: float) -> None:
        with self._lock, self._errors("write"), self._transaction():
            self._conn.execute(
                "UPDATE entries SET last_used_at = ? WHERE key_id = ? AND file_name = ?",
                (when, key_id, file_name),
            )

    def delete(self, key_id: str, file_name: str | None = None) -> IndexRow | None:
        """Remove the row of `key_id` (only if it still names `file_name`, when given)."""
        with self._lock, self._errors("write"), self._transaction():
            values = self._conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE key_id = ?", (key_id,)
            ).fetchone()
            if values is None:
                return None
            row = _row(values)
            if file_name is not None and row.file_name != file_name:
                return None
            self._conn.execute("DELETE FROM entries WHERE key_id = ?", (key_id,))
            return row

    def close(self) -> None:
        with self._lock:
            self._conn.close()
