"""Random operation sequences: budgets always hold and lookup agrees with a brute-force search."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapcache import key as key_module
from snapcache.key import SnapshotKey, as_token_array, rolling_hash, rolling_prefix_hashes
from snapcache.store import SnapshotStore
from snapcache.store.prefix_index import PrefixIndex, iter_prefix_matches

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
        st.tuples(st.integers(0, len(DOCS) - 1), st.integers(1, 48), st.integers(0, 1)),
        max_size=60,
    ),
    queries=st.lists(st.tuples(st.integers(0, len(DOCS) - 1), st.integers(0, 48)), min_size=1, max_size=10),
)
def test_index_matches_come_longest_first_once_each(
    stored: list[tuple[int, int, int]], queries: list[tuple[int, int]]
) -> None:
    indexes = [PrefixIndex(), PrefixIndex()]
    known: dict[SnapshotKey, np.ndarray] = {}
    for doc, n, which in stored:
        tokens = as_token_array(DOCS[doc][:n])
        key = SnapshotKey.for_tokens(FP, "s", tokens)
        known[key] = tokens
        indexes[which].add(key, rolling_hash(tokens))
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


class _NumpyWithHooks:
    """numpy as snapcache.key sees it, with cumprod and zeros able to pause the calling thread."""

    def __init__(self, hooks: dict[str, Callable[[], None]]) -> None:
        self._hooks = hooks

    def __getattr__(self, name: str) -> object:
        real = getattr(np, name)
        hook = self._hooks.get(name)
        if hook is None:
            return real

        def hooked(*args: object, **kwargs: object) -> object:
            hook()
            return real(*args, **kwargs)

        return hooked


def test_rolling_hashes_survive_a_thread_installing_a_smaller_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread growing the shared powers table from a stale small one must not break a long hash."""
    long_query = as_token_array(DOCS[0][:48])
    expected = rolling_prefix_hashes(long_query)
    monkeypatch.setattr(key_module, "_rolling_powers", np.ones(1, dtype=np.uint64))
    small_in_cumprod, small_may_go = threading.Event(), threading.Event()
    small_thread: list[threading.Thread] = []

    def on_cumprod() -> None:
        if threading.current_thread() is small_thread[0]:
            small_in_cumprod.set()
            assert small_may_go.wait(30)

    def on_zeros() -> None:
        if threading.current_thread().name == "long":
            small_may_go.set()  # the small table lands between the long hash's check and its use
            small_thread[0].join(30)

    monkeypatch.setattr(key_module, "np", _NumpyWithHooks({"cumprod": on_cumprod, "zeros": on_zeros}))
    results: dict[str, object] = {}

    def hash_into(name: str, tokens: np.ndarray) -> None:
        try:
            results[name] = rolling_prefix_hashes(tokens)
        except Exception as exc:
            results[name] = exc

    small_thread.append(threading.Thread(target=hash_into, args=("small", long_query[:3])))
    small_thread[0].start()
    assert small_in_cumprod.wait(30)  # it saw the 1-entry table and is building a small one
    rolling_prefix_hashes(long_query)  # meanwhile the table grows big enough for the long query
    long_thread = threading.Thread(target=hash_into, args=("long", long_query), name="long")
    long_thread.start()
    long_thread.join(30)
    small_thread[0].join(30)
    assert not isinstance(results["long"], Exception), results["long"]
    assert np.array_equal(results["long"], expected)  # type: ignore[arg-type]
    assert np.array_equal(results["small"], expected[:4])  # type: ignore[arg-type]
