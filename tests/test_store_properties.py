"""Random operation sequences: budgets always hold and lookup agrees with a brute-force search."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapcache.key import SnapshotKey, as_token_array, rolling_hash
from snapcache.prefix_index import PrefixIndex, iter_prefix_matches
from snapcache.store import SnapshotStore

FP = "fp-prop"
_rng = np.random.default_rng(7)
_ROOT = _rng.integers(0, 50, size=48, dtype=np.int32)
# Token sequences that share prefixes of several lengths with each other (small alphabet: many
# rolling-hash buckets per length hold several candidates).
DOCS = [
    _ROOT,
    np.concatenate([_ROOT[:12], _rng.integers(0, 50, size=36, dtype=np.int32)]),
    np.concatenate([_ROOT[:30], _rng.integers(0, 50, size=18, dtype=np.int32)]),
    np.concatenate([_ROOT[:30], _ROOT[31:], _ROOT[:1]]),
    _rng.integers(0, 50, size=48, dtype=np.int32),
]
SCOPES = ["s1", "s2"]
FPS = [FP, "fp-other"]

puts = st.tuples(
    st.just("put"),
    st.integers(0, len(DOCS) - 1),
    st.integers(1, 48),
    st.sampled_from(SCOPES),
    st.integers(-2, 2),  # priority
    st.integers(10, 600),  # state size
    st.sampled_from(FPS),
)
reads = st.tuples(
    st.sampled_from(["get", "lookup", "remove"]),
    st.integers(0, len(DOCS) - 1),
    st.integers(0, 48),
    st.sampled_from(SCOPES),
    st.just(0),
    st.just(0),
    st.sampled_from(FPS),
)
operations = st.lists(st.one_of(puts, reads), min_size=1, max_size=40)


def brute_force_longest(
    known: dict[SnapshotKey, np.ndarray], stored: set[SnapshotKey], fp: str, scope: str, query: np.ndarray
) -> SnapshotKey | None:
    best: SnapshotKey | None = None
    for key in stored:
        tokens = known[key]
        if key.model_fingerprint != fp or key.scope != scope or len(tokens) > len(query):
            continue
        if np.array_equal(tokens, query[: len(tokens)]) and (best is None or len(tokens) > best.token_count):
            best = key
    return best


def run_operations(store: SnapshotStore, ops: list[tuple[str, int, int, str, int, int, str]]) -> None:
    known: dict[SnapshotKey, np.ndarray] = {}
    for op, doc, n, scope, priority, size, fp in ops:
        tokens = DOCS[doc][:n]
        if op == "put":
            key = SnapshotKey.for_tokens(fp, scope, tokens)
            known[key] = tokens
            store.put(key, tokens, bytes([n]) * size, priority=priority)
        elif op == "lookup":
            stored = {row.key for row in store.entries()}
            expected = brute_force_longest(known, stored, fp, scope, tokens)
            found = store.lookup(fp, scope, tokens)
            assert (found.key if found is not None else None) == expected
            if found is not None:
                assert bytes(found.state) == bytes([found.key.token_count]) * len(found.state)
        elif n > 0:
            key = SnapshotKey.for_tokens(fp, scope, tokens)
            if op == "get":
                was_stored = key in {row.key for row in store.entries()}
                assert (store.get(key) is not None) == was_stored
            else:
                store.remove(key)
                assert store.get(key) is None
        stats = store.stats()
        assert stats.ram_used_bytes <= stats.ram_budget_bytes
        assert stats.disk_used_bytes <= stats.disk_budget_bytes
        ram = store._ram
        if ram is not None:
            assert stats.ram_used_bytes == sum(row.nbytes for row in ram.entries())


@settings(max_examples=150, deadline=None)
@given(ops=operations, ram_bytes=st.integers(1, 3_000))
def test_ram_only_store(ops: list[tuple[str, int, int, str, int, int, str]], ram_bytes: int) -> None:
    with SnapshotStore(None, ram_bytes=ram_bytes) as store:
        run_operations(store, ops)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, ram_bytes=st.integers(0, 2_000), disk_bytes=st.integers(1, 5_000))
def test_two_tier_store(
    ops: list[tuple[str, int, int, str, int, int, str]], ram_bytes: int, disk_bytes: int
) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        SnapshotStore(
            Path(tmp) / "c", ram_bytes=ram_bytes, disk_bytes=disk_bytes, background_writes=False
        ) as store,
    ):
        run_operations(store, ops)


@settings(max_examples=200, deadline=None)
@given(
    stored=st.lists(
        st.tuples(st.integers(0, len(DOCS) - 1), st.integers(1, 48), st.integers(-3, 3), st.integers(0, 1)),
        max_size=60,
    ),
    queries=st.lists(st.tuples(st.integers(0, len(DOCS) - 1), st.integers(0, 48)), min_size=1, max_size=10),
)
def test_index_matches_come_longest_first_once_each(
    stored: list[tuple[int, int, int, int]], queries: list[tuple[int, int]]
) -> None:
    indexes = [PrefixIndex(), PrefixIndex()]
    known: dict[SnapshotKey, np.ndarray] = {}
    for when, (doc, n, priority, which) in enumerate(stored):
        tokens = as_token_array(DOCS[doc][:n])
        key = SnapshotKey.for_tokens(FP, "s", tokens)
        known[key] = tokens
        indexes[which].add(key, rolling_hash(tokens), priority, float(when))
    for doc, n in queries:
        query = as_token_array(DOCS[doc][:n])
        got = list(iter_prefix_matches(indexes, FP, "s", query))
        expected = sorted(
            (
                key
                for key, tokens in known.items()
                if np.array_equal(tokens, query[: len(tokens)]) and len(tokens) <= n
            ),
            key=lambda k: k.token_count,
            reverse=True,
        )
        assert got == expected
        assert indexes[0].lookup(FP, "s", query) == next((k for k in expected if k in indexes[0]), None)
