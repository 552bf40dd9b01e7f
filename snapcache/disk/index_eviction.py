"""Budget and eviction inside one write transaction of the index: what a put must evict to fit, the
victims chosen in eviction order (whole files, never one of higher priority), and rows deleted with
their bytes handed to the rows of their file that remain.

Every function here runs inside a transaction the caller holds (`DiskIndex`), so that processes
sharing a directory cannot overshoot the budget together.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from snapcache.disk.index_schema import COLUMNS, GENERATION, INSERT, IndexRow, row_of
from snapcache.tier_contract import EVICTION_ORDER

# Keys one query asks for at most (SQLite's oldest builds allow 999 bound parameters).
KEYS_PER_QUERY = 500
_BY_EVICTION = ", ".join(f"{column} ASC" for column in EVICTION_ORDER)


@dataclass(frozen=True, slots=True)
class Change:
    """One committed transaction of ours: the catalog generation before and after it, and its rows."""

    before: int
    after: int
    added: tuple[IndexRow, ...]  # the rows of one new file
    removed: tuple[IndexRow, ...]  # deleted or evicted rows, and the rows `added` replaced
    freed: tuple[str, ...] = ()  # files no row names any more: to delete once committed


def catalog_generation(conn: sqlite3.Connection) -> int:
    """The catalog generation (see index_schema)."""
    return int(conn.execute(GENERATION).fetchone()[0])


def excess(
    conn: sqlite3.Connection, key_ids: Sequence[str], priority: int, file_bytes: int, budget_bytes: int
) -> int | None:
    """Bytes to evict for a file of `priority` and `file_bytes` holding `key_ids` to fit (files
    holding only rows it replaces go anyway); None if that would take evicting a higher priority."""
    marks = ", ".join("?" * len(key_ids))
    others, evictable = conn.execute(
        "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(CASE WHEN top <= ? THEN bytes ELSE 0 END), 0)"
        " FROM (SELECT SUM(file_bytes) AS bytes,"
        f" MAX(CASE WHEN key_id IN ({marks}) THEN NULL ELSE priority END) AS top"
        " FROM entries GROUP BY file_name) WHERE top IS NOT NULL",
        (priority, *key_ids),
    ).fetchone()
    needed = int(others) + file_bytes - budget_bytes
    return None if needed > int(evictable) else needed


def put_rows(conn: sqlite3.Connection, rows: Sequence[IndexRow], budget_bytes: int) -> Change | None:
    """Insert the rows of one new file, replacing their keys' rows and evicting to fit; None (nothing
    changed) when that would take evicting a higher priority."""
    before = catalog_generation(conn)
    key_ids = [row.key_id for row in rows]
    needed = excess(conn, key_ids, rows[0].priority, sum(row.file_bytes for row in rows), budget_bytes)
    if needed is None:
        return None  # the rest is of higher priority: these rows stay out
    removed, freed = delete_rows(conn, rows_of(conn, key_ids))
    evicted, evicted_files = evict(conn, needed, up_to_priority=rows[0].priority)
    conn.executemany(INSERT, [row.params() for row in rows])
    after = catalog_generation(conn)
    return Change(before, after, tuple(rows), (*removed, *evicted), (*freed, *evicted_files))


def rows_of(conn: sqlite3.Connection, key_ids: Sequence[str]) -> list[IndexRow]:
    """The rows of those of `key_ids` the index holds: one query per KEYS_PER_QUERY keys."""
    found: list[IndexRow] = []
    for start in range(0, len(key_ids), KEYS_PER_QUERY):
        chunk = list(key_ids[start : start + KEYS_PER_QUERY])
        marks = ", ".join("?" * len(chunk))
        cursor = conn.execute(f"SELECT {COLUMNS} FROM entries WHERE key_id IN ({marks})", chunk)
        found.extend(row_of(values) for values in cursor.fetchall())
    return found


def delete_rows(conn: sqlite3.Connection, rows: Sequence[IndexRow]) -> tuple[list[IndexRow], list[str]]:
    """Delete `rows`; each one's bytes go to a row of its file that remains. The rows deleted, and
    the files they leave without rows."""
    execute = conn.execute
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


def delete_files(conn: sqlite3.Connection, file_names: Sequence[str]) -> list[IndexRow]:
    """Delete every row of `file_names`; the rows deleted."""
    removed: list[IndexRow] = []
    for name in file_names:
        cursor = conn.execute(f"SELECT {COLUMNS} FROM entries WHERE file_name = ?", (name,))
        removed.extend(row_of(values) for values in cursor.fetchall())
    conn.executemany("DELETE FROM entries WHERE file_name = ?", [(name,) for name in file_names])
    return removed


def evict(
    conn: sqlite3.Connection, needed: int, up_to_priority: int | None = None
) -> tuple[list[IndexRow], list[str]]:
    """Delete files (all their rows) in the eviction order of their rows until they total `needed`
    bytes, sparing files that hold a row above `up_to_priority`; the rows and files deleted."""
    if needed <= 0:
        return [], []
    cursor = conn.execute(f"SELECT file_name FROM entries ORDER BY {_BY_EVICTION}")
    victims: list[str] = []
    chosen: set[str] = set()
    while needed > 0:
        found = cursor.fetchone()
        if found is None:  # cannot happen: the rows sum to more than the excess
            break
        name = str(found[0])
        if name in chosen:
            continue
        chosen.add(name)
        size, top = conn.execute(
            "SELECT SUM(file_bytes), MAX(priority) FROM entries WHERE file_name = ?", (name,)
        ).fetchone()
        if up_to_priority is not None and int(top) > up_to_priority:
            continue
        victims.append(name)
        needed -= int(size)
    cursor.close()
    return delete_files(conn, victims), victims
