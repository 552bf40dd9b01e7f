"""The SQLite index's layout and how it is opened: the tables, triggers and indexes (schema 2, and the
migration from schema 1), the row type, and SQLite's errors translated into snapcache's.

The catalog generation (a one-row table) grows whenever rows are added, replaced or removed, by any
process: triggers bump it inside the writing transaction, so even a writer that does not know of it
keeps it true. Recording a use (last_used_at) leaves it alone, so readers of the catalog re-read it
only when it really changed.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapcache.errors import StoreUnavailable
from snapcache.key import SnapshotKey

SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 30.0
_WAL_CHECKPOINT_PAGES = 64
# SQLite's primary result codes for a file that is not, or no longer, a sound database.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
UINT64 = 1 << 64
_INT64_MAX = (1 << 63) - 1
COLUMNS = (
    "key_id, fingerprint, scope, token_count, prefix_hash, rolling_hash, priority,"
    " file_name, file_bytes, state_bytes, created_at, last_used_at"
)
INSERT = f"INSERT OR REPLACE INTO entries ({COLUMNS}) VALUES ({', '.join('?' * 12)})"
_CHANGED_COLUMNS = (
    "key_id, fingerprint, scope, token_count, prefix_hash, rolling_hash, priority,"
    " file_name, file_bytes, state_bytes, created_at"
)
ENTRIES_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
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
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ENTRIES_TABLE.format(name="entries"),
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
GENERATION = "SELECT value FROM generation"


def to_signed64(value: int) -> int:
    """A uint64 in SQLite's signed INTEGER form."""
    return value - UINT64 if value > _INT64_MAX else value


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


def row_of(values: Any) -> IndexRow:
    """The row a `SELECT {COLUMNS}` returned."""
    fields = list(values)
    fields[5] = int(fields[5]) % UINT64  # rolling_hash back to unsigned
    return IndexRow(*fields)


@contextmanager
def sqlite_errors(action: str) -> Iterator[None]:
    """SQLite's errors as IndexDamaged (the file is not a sound database) or StoreUnavailable."""
    try:
        yield
    except sqlite3.Error as exc:
        kind = IndexDamaged if _is_damage(exc) else StoreUnavailable
        raise kind(f"snapshot index: cannot {action}: {exc}") from None


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (BEGIN IMMEDIATE), rolled back on any failure."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a failed COMMIT (a full disk) leaves it open
            conn.execute("ROLLBACK")
        raise


def meta(conn: sqlite3.Connection, name: str) -> str:
    """A value of the meta table ("" when absent)."""
    row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    return "" if row is None else str(row[0])


@dataclass(frozen=True, slots=True)
class OpenedIndex:
    """A connection to a checked index of the current schema."""

    conn: sqlite3.Connection
    created: bool  # whether this open created the tables (a new or emptied index)
    store_id: str


def open_index(path: Path) -> OpenedIndex:
    """Open (creating or migrating it) the index at `path`: WAL mode, schema, integrity check.

    Raises IndexDamaged when the file is not a sound database, StoreUnavailable for other failures.
    """
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open the index {path}: {exc}") from None
    try:
        with sqlite_errors("open"):
            return _set_up(conn)
    except BaseException:
        conn.close()
        raise


def _set_up(conn: sqlite3.Connection) -> OpenedIndex:
    # Switching to WAL needs a moment alone with the file; another process may be doing it.
    for attempt in range(50):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 49:
                raise
            time.sleep(0.05)
    # NORMAL in WAL mode survives a process crash; a power cut may drop the last commits,
    # which leaves orphan files for check(), never a row without its file.
    conn.execute("PRAGMA synchronous=NORMAL")
    # A small log: checkpoints come while there is room, and later writes reuse the log's
    # space instead of growing it, so deletes still work on a disk that filled up.
    conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_CHECKPOINT_PAGES}")
    with transaction(conn):
        created = (
            conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone()
            is None
        )
        for statement in SCHEMA:
            conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (secrets.token_hex(16),))
        if meta(conn, "schema_version") == "1":
            _migrate_from_v1(conn)
    version = meta(conn, "schema_version")
    if version != str(SCHEMA_VERSION):
        raise StoreUnavailable(f"index schema version {version} is not supported")
    # Damage in pages the statements above did not read shows here, not in the middle of a get.
    verdict = conn.execute("PRAGMA quick_check(1)").fetchone()
    if verdict is None or verdict[0] != "ok":
        raise IndexDamaged(f"snapshot index failed its integrity check: {verdict}")
    return OpenedIndex(conn, created, meta(conn, "store_id"))


def _migrate_from_v1(conn: sqlite3.Connection) -> None:
    """Schema 1 named one file per row (file_name UNIQUE): copy its rows into schema 2's table.
    Inside the opening transaction; the rows, and so the catalog generation, stay as they were."""
    execute = conn.execute
    execute(ENTRIES_TABLE.format(name="entries_v2"))
    execute(f"INSERT INTO entries_v2 ({COLUMNS}) SELECT {COLUMNS} FROM entries")
    execute("DROP TABLE entries")  # its indexes and triggers go with it
    execute("ALTER TABLE entries_v2 RENAME TO entries")
    for statement in SCHEMA:
        execute(statement)
    execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),))


def _is_damage(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
