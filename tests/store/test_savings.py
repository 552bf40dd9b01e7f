"""The savings ledger: per-scope totals that survive restarts, and the seconds they are worth."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from snapcache.store.savings import MIN_TIMED_TOKENS, SavingsLedger


def test_totals_add_up_across_ledgers_on_one_directory(tmp_path: Path) -> None:
    first = SavingsLedger(tmp_path)
    first.record("fp", "agent-a", prompt_tokens=1000, cached_tokens=0, read_tokens=1000, read_seconds=2.0)
    first.close()
    second = SavingsLedger(tmp_path)  # as after a restart
    second.record("fp", "agent-a", prompt_tokens=1010, cached_tokens=960, read_tokens=50, read_seconds=0.5)
    second.record("fp", "agent-b", prompt_tokens=500, cached_tokens=448, read_tokens=52, read_seconds=0.4)
    rows = {row.scope: row for row in second.totals()}
    assert rows["agent-a"].requests == 2
    assert rows["agent-a"].prompt_tokens == 2010
    assert rows["agent-a"].cached_tokens == 960
    # Only the 1,000-token read was long enough to time: 2 ms a token, for every scope of the model.
    assert rows["agent-a"].seconds_saved == pytest.approx(960 * 0.002)
    assert rows["agent-b"].seconds_saved == pytest.approx(448 * 0.002)
    assert [row.scope for row in second.totals()] == ["agent-a", "agent-b"]  # most tokens saved first


def test_no_timed_read_means_no_seconds_yet(tmp_path: Path) -> None:
    ledger = SavingsLedger(tmp_path)
    ledger.record(
        "fp", "s", prompt_tokens=100, cached_tokens=64, read_tokens=MIN_TIMED_TOKENS - 1, read_seconds=1.0
    )
    (row,) = ledger.totals()
    assert row.cached_tokens == 64
    assert row.seconds_saved is None


def test_a_damaged_ledger_is_logged_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "savings.sqlite").write_bytes(b"this is not a database" * 100)
    ledger = SavingsLedger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        ledger.record("fp", "s", prompt_tokens=10, cached_tokens=5, read_tokens=5, read_seconds=0.1)
        assert ledger.totals() == []
    assert "savings ledger" in caplog.text
    assert SavingsLedger(tmp_path / "missing").totals() == []


def test_the_ledger_file_is_private(tmp_path: Path) -> None:
    ledger = SavingsLedger(tmp_path)
    ledger.record("fp", "s", prompt_tokens=10, cached_tokens=5, read_tokens=5, read_seconds=None)
    assert (ledger.path.stat().st_mode & 0o777) == 0o600
