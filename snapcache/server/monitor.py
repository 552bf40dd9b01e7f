"""What the server's completions reused: per-scope totals, Prometheus metrics and the savings ledger.

`ServeMonitor` is the model engine's listener (each request's own record hears first, see
`model_engine`). It counts tokens per scope since the server started, records every
completion in the on-disk savings ledger (so `snapcache stats` can say what was saved across
restarts), and exposes both, with the store's own counters, to `/snapcache/stats` and `/metrics`.

Seconds saved are an estimate: tokens not read, at the rate this model read prompts here (this
run's timed reads, else the ledger's history for the same model).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from snapcache.llama.exactness.choice import ExactnessChoice
from snapcache.llama.state.host_memory import pinned_report
from snapcache.llama.stored.reports import CompletionReport, RestoreInfo
from snapcache.store import MIN_TIMED_TOKENS, SavingsLedger, ScopeSavings, SnapshotStore

__all__ = ["ScopeTotals", "ServeMonitor"]


@dataclass(slots=True)
class ScopeTotals:
    """One scope's completions since the server started."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    restored_from_ram: int = 0
    restored_from_disk: int = 0
    restored_from_remote: int = 0
    reused_context: int = 0
    misses: int = 0
    restore_seconds: float = 0.0  # finding prefixes and handing them to llama.cpp, misses included


class ServeMonitor:
    """The listener of the server's model engine; thread-safe."""

    def __init__(
        self,
        store: SnapshotStore,
        model_fingerprint: str,
        ledger: SavingsLedger | None,
        exactness: ExactnessChoice | None = None,
    ) -> None:
        self._store = store
        self._fingerprint = model_fingerprint
        self._exactness = exactness
        self._ledger = ledger
        self._lock = threading.Lock()
        self._scopes: dict[str, ScopeTotals] = {}
        self._timed_tokens = 0
        self._timed_seconds = 0.0
        self._history_rate = self._ledger_rate()
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "snapcache_requests",
            "Completions served, by scope and where their prefix came from.",
            ["scope", "source"],
            registry=self.registry,
        )
        self._prompt_tokens = Counter(
            "snapcache_prompt_tokens",
            "Prompt tokens of completions, by scope.",
            ["scope"],
            registry=self.registry,
        )
        self._cached_tokens = Counter(
            "snapcache_cached_tokens",
            "Prompt tokens not read by llama.cpp (restored or reused), by scope.",
            ["scope"],
            registry=self.registry,
        )
        self._seconds_saved = Counter(
            "snapcache_prefill_seconds_saved",
            "Estimated prefill seconds saved, by scope.",
            ["scope"],
            registry=self.registry,
        )
        self._restore_seconds = Histogram(
            "snapcache_restore_seconds",
            "Seconds a completion spent finding its prefix and handing it to llama.cpp (on a miss, "
            "the lookup), by where the prefix came from.",
            ["source"],
            buckets=_RESTORE_BUCKETS,
            registry=self.registry,
        )
        self._phase_seconds = Histogram(
            "snapcache_first_token_phase_seconds",
            "Where the time to a batched completion's first token went, by phase (see "
            "FirstTokenPhases: queue, restore, read, others_restore, others_read, save, generate).",
            ["phase"],
            buckets=_RESTORE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(store))
        if exactness is not None:
            chosen = Info(
                "snapcache_exactness",
                "Whether restores are exact, what was asked for (auto: this build's choice), and why.",
                registry=self.registry,
            )
            chosen.info(
                {"mode": exactness.mode, "asked": str(exactness.asked).lower(), "reason": exactness.reason}
            )

    # -- the engine's listener ----------------------------------------------------------------------

    def restored(self, scope: str, info: RestoreInfo) -> None:
        """Nothing to count before the completion ends (the request's record holds it already)."""

    def finished(self, report: CompletionReport) -> None:
        restore = report.restore
        read_tokens = restore.evaluated_tokens
        with self._lock:
            if report.read_seconds is not None and read_tokens >= MIN_TIMED_TOKENS:
                self._timed_tokens += read_tokens
                self._timed_seconds += report.read_seconds
            rate = self._rate()
            saved = restore.cached_tokens * rate if rate is not None else 0.0
            totals = self._scopes.setdefault(report.scope, ScopeTotals())
            totals.requests += 1
            totals.prompt_tokens += restore.prompt_tokens
            totals.cached_tokens += restore.cached_tokens
            totals.restore_seconds += restore.restore_seconds
            if restore.source == "ram":
                totals.restored_from_ram += 1
            elif restore.source == "disk":
                totals.restored_from_disk += 1
            elif restore.source == "remote":
                totals.restored_from_remote += 1
            elif restore.source == "context":
                totals.reused_context += 1
            else:
                totals.misses += 1
        self._requests.labels(report.scope, restore.source or "none").inc()
        self._prompt_tokens.labels(report.scope).inc(restore.prompt_tokens)
        self._cached_tokens.labels(report.scope).inc(restore.cached_tokens)
        self._seconds_saved.labels(report.scope).inc(saved)
        self._restore_seconds.labels(restore.source or "none").observe(restore.restore_seconds)
        if restore.phases is not None:
            for phase, seconds in restore.phases.as_dict().items():
                if phase != "first_token":
                    self._phase_seconds.labels(phase).observe(seconds)
        if self._ledger is not None:
            self._ledger.record(
                self._fingerprint,
                report.scope,
                prompt_tokens=restore.prompt_tokens,
                cached_tokens=restore.cached_tokens,
                read_tokens=read_tokens,
                read_seconds=report.read_seconds,
            )

    # -- what the routes show -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The JSON of `/snapcache/stats`."""
        all_time = self._ledger.totals() if self._ledger is not None else None
        with self._lock:
            scopes = {name: dataclasses.asdict(totals) for name, totals in sorted(self._scopes.items())}
            # One rate for every figure: the ledger's (this run's reads are in it), else this run's.
            rate = _rate_of(all_time, self._fingerprint) if all_time else None
            rate = rate if rate is not None else self._rate()
        for totals in scopes.values():
            totals["seconds_saved"] = totals["cached_tokens"] * rate if rate is not None else None
        since_start = {
            "requests": sum(s["requests"] for s in scopes.values()),
            "prompt_tokens": sum(s["prompt_tokens"] for s in scopes.values()),
            "cached_tokens": sum(s["cached_tokens"] for s in scopes.values()),
            "seconds_saved": sum(s["cached_tokens"] for s in scopes.values()) * rate
            if rate is not None
            else None,
        }
        result: dict[str, Any] = {
            "model_fingerprint": self._fingerprint,
            "exactness": None if self._exactness is None else self._exactness.as_dict(),
            "since_start": since_start,
            "scopes": scopes,
            "prefill_seconds_per_token": rate,
            "store": dataclasses.asdict(self._store.stats()),
            "pinned_memory": pinned_report(),
        }
        if all_time is not None:
            result["all_time"] = [dataclasses.asdict(row) for row in all_time]
        return result

    def _rate(self) -> float | None:
        if self._timed_tokens:
            return self._timed_seconds / self._timed_tokens
        return self._history_rate

    def _ledger_rate(self) -> float | None:
        return _rate_of(self._ledger.totals(), self._fingerprint) if self._ledger is not None else None


def _rate_of(rows: list[ScopeSavings], fingerprint: str) -> float | None:
    """Prefill seconds per token of one model, as the ledger's totals imply it."""
    for row in rows:
        if row.model_fingerprint == fingerprint and row.seconds_saved is not None and row.cached_tokens:
            return row.seconds_saved / row.cached_tokens
    return None


class _StoreCollector(Collector):
    """The store's counters and sizes, read when Prometheus scrapes."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Any]:
        stats = dataclasses.asdict(self._store.stats())
        lookups = CounterMetricFamily(
            "snapcache_store_lookups", "Store lookups by tier and result.", labels=["tier", "result"]
        )
        for tier in _LOOKUP_TIERS:
            lookups.add_metric([tier, "hit"], stats[f"{tier}_hits"])
            lookups.add_metric([tier, "miss"], stats[f"{tier}_misses"])
        yield lookups
        for family, name, text, field in _PER_TIER:
            metric = family(name, text, labels=["tier"])
            for tier in _TIERS:
                metric.add_metric([tier], stats[field.format(tier=tier)])
            yield metric


# From a context reused (well under a millisecond) to a long prompt restored from disk (seconds).
_RESTORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TIERS = ("ram", "disk")
# Lookups are counted for the remote tier too (its sizes are in `snapcache stats --remote`).
_LOOKUP_TIERS = (*_TIERS, "remote")
# (family, metric name, help, the StoreStats field of each tier)
_PER_TIER: tuple[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str, str], ...] = (
    (GaugeMetricFamily, "snapcache_store_bytes", "Bytes held per tier.", "{tier}_used_bytes"),
    (GaugeMetricFamily, "snapcache_store_budget_bytes", "Byte budget per tier.", "{tier}_budget_bytes"),
    (GaugeMetricFamily, "snapcache_store_entries", "Snapshots held per tier.", "{tier}_entries"),
    (CounterMetricFamily, "snapcache_store_evictions", "Evictions per tier.", "{tier}_evictions"),
)
