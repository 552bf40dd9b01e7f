"""What the cache has saved, per model and scope, kept on disk across restarts.

Every completion adds its prompt tokens, the tokens it did not read (restored from a snapshot or
reused from the context) and, when it read a part of its prompt worth timing, how long llama.cpp
took for how many tokens. Seconds saved are derived, not stored: the tokens not read, at the rate
this model read prompts on this machine (all scopes together). A rate that grows with the prompt
(attention costs more late in a long context) makes this an estimate; it is labelled one.

The ledger is a small SQLite file (`savings.sqlite`) beside the snapshots. Recording is best effort:
a failure is logged once and never reaches the completion that triggered it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LEDGER_FILE_NAME", "MIN_TIMED_TOKENS", "SavingsLedger", "ScopeSavings"]

_log = logging.getLogger("snapcache")

LEDGER_FILE_NAME = "savings.sqlite"
# Reads shorter than this say more about per-call overhead (and attention over a long restored
# context) than about how fast the model reads a prompt.
MIN_TIMED_TOKENS = 128
_BUSY_TIMEOUT_S = 5.0
_SCHEMA = """CREATE TABLE IF NOT EXISTS savings (
    fingerprint TEXT NOT NULL,
    scope TEXT NOT NULL,
    requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    timed_tokens INTEGER NOT NULL,
    timed_seconds REAL NOT NULL,
    PRIMARY KEY (fingerprint, scope)
)"""
_ADD = """INSERT INTO savings VALUES (?, ?, 1, ?, ?, ?, ?)
    ON CONFLICT (fingerprint, scope) DO UPDATE SET
        requests = requests + 1,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        cached_tokens = cached_tokens + excluded.cached_tokens,
        timed_tokens = timed_tokens + excluded.timed_tokens,
        timed_seconds = timed_seconds + excluded.timed_seconds"""
_ROWS = (
    "SELECT fingerprint, scope, requests, prompt_tokens, cached_tokens, timed_tokens, timed_seconds"
    " FROM savings"
)


@dataclass(frozen=True, slots=True)
class ScopeSavings:
    """The totals of one model fingerprint and scope; `seconds_saved` is None until a read was timed."""

    model_fingerprint: str
    scope: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    seconds_saved: float | None


class SavingsLedger:
    """Totals of tokens not read per (model fingerprint, scope), in `directory/savings.sqlite`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._path = Path(directory) / LEDGER_FILE_NAME
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._failed = False

    @property
    def path(self) -> Path:
        return self._path

    def record(
        self,
        model_fingerprint: str,
        scope: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        read_tokens: int,
        read_seconds: float | None,
    ) -> None:
        """Add one completion; its read counts towards the rate only when long enough to time."""
        timed = read_seconds is not None and read_tokens >= MIN_TIMED_TOKENS
        row = (
            model_fingerprint,
            scope,
            prompt_tokens,
            cached_tokens,
            read_tokens if timed else 0,
            read_seconds if timed and read_seconds is not None else 0.0,
        )
        with self._lock:
            try:
                connection = self._connect()
                with connection:
                    connection.execute(_ADD, row)
            except (sqlite3.Error, OSError) as exc:
                self._report_failure(exc)

    def totals(self) -> list[ScopeSavings]:
        """Every (fingerprint, scope) with its totals, most tokens saved first; [] if there is no ledger."""
        if not self._path.exists():
            return []
        with self._lock:
            try:
                rows = self._connect().execute(_ROWS).fetchall()
            except (sqlite3.Error, OSError) as exc:
                self._report_failure(exc)
                return []
        rates: dict[str, tuple[int, float]] = {}
        for fingerprint, _scope, _requests, _prompt, _cached, timed_tokens, timed_seconds in rows:
            tokens, seconds = rates.get(fingerprint, (0, 0.0))
            rates[fingerprint] = (tokens + int(timed_tokens), seconds + float(timed_seconds))
        result = []
        for fingerprint, scope, requests, prompt, cached, _timed_tokens, _timed_seconds in rows:
            tokens, seconds = rates[fingerprint]
            saved = int(cached) * seconds / tokens if tokens else None
            result.append(ScopeSavings(fingerprint, scope, int(requests), int(prompt), int(cached), saved))
        result.sort(key=lambda s: (-s.cached_tokens, s.scope))
        return result

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            if not self._path.exists():
                # Created private before SQLite opens it; the cache directory is private already.
                os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
            connection = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT_S, check_same_thread=False)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(_SCHEMA)
            except sqlite3.Error:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    def _report_failure(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            _log.warning("could not update the savings ledger %s: %s", self._path, exc)
