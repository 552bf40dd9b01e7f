"""Bad arguments to the public API raise InvalidArgument (a SnapcacheError and a ValueError), clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reliability_workers.payload import FINGERPRINT, SCOPE, state_for, tokens_for

from snapcache import InvalidArgument, SnapcacheError, SnapshotKey, SnapshotStore
from snapcache.snapshot import MAX_PRIORITY

TOKENS = tokens_for(3)
KEY = SnapshotKey.for_tokens(FINGERPRINT, SCOPE, TOKENS)
STATE = state_for(TOKENS)


@pytest.fixture
def store(tmp_path: Path):
    with SnapshotStore(tmp_path / "cache", ram_bytes=1 << 20, disk_bytes=1 << 20) as s:
        yield s


def assert_invalid(exc_info: pytest.ExceptionInfo[BaseException], *words: str) -> None:
    exc = exc_info.value
    assert isinstance(exc, InvalidArgument)
    assert isinstance(exc, SnapcacheError)
    assert isinstance(exc, ValueError)
    message = str(exc).lower()
    assert all(word.lower() in message for word in words), message


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"ram_bytes": -1}, "ram_bytes"),
        ({"disk_bytes": -1}, "disk_bytes"),
        ({"ram_bytes": -(1 << 40)}, "ram_bytes"),
        ({"ram_bytes": 1.5}, "ram_bytes"),
        ({"ram_bytes": "512M"}, "ram_bytes"),
        ({"disk_bytes": "8G"}, "disk_bytes"),  # None is valid: the recorded budget
        ({"ram_bytes": True}, "ram_bytes"),
    ],
)
def test_bad_budgets_are_refused(tmp_path: Path, kwargs: dict, word: str) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        SnapshotStore(tmp_path / "cache", **kwargs)
    assert_invalid(exc_info, word)


def test_a_store_with_no_tier_at_all_is_refused() -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        SnapshotStore(None, ram_bytes=0)
    assert_invalid(exc_info, "ram_bytes")


def test_a_directory_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        SnapshotStore(42)  # type: ignore[arg-type]
    assert_invalid(exc_info, "directory")


@pytest.mark.parametrize("scope", ["", None, 7, "a\x00b", "x" * 10_000])
def test_bad_scopes_are_refused(store: SnapshotStore, scope: object) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        SnapshotKey.for_tokens(FINGERPRINT, scope, TOKENS)  # type: ignore[arg-type]
    assert_invalid(exc_info, "scope")
    with pytest.raises(InvalidArgument) as exc_info:
        store.lookup(FINGERPRINT, scope, TOKENS)  # type: ignore[arg-type]
    assert_invalid(exc_info, "scope")


@pytest.mark.parametrize("fingerprint", ["", None, 3, "é" * 10, "f" * 500])
def test_bad_fingerprints_are_refused(store: SnapshotStore, fingerprint: object) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        store.lookup(fingerprint, SCOPE, TOKENS)  # type: ignore[arg-type]
    assert_invalid(exc_info)
    with pytest.raises(InvalidArgument):
        SnapshotKey.for_tokens(fingerprint, SCOPE, TOKENS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tokens",
    [
        [1.5, 2.0],
        ["a", "b"],
        [1, None],
        [-1, 2],
        [2**31, 1],
        [2**70],
        np.array([[1, 2], [3, 4]]),
        np.array([1.0, 2.0]),
        "hello",
        object(),
    ],
    ids=lambda t: type(t).__name__ + ":" + repr(t)[:20],
)
def test_non_integer_tokens_are_refused(store: SnapshotStore, tokens: object) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        store.lookup(FINGERPRINT, SCOPE, tokens)  # type: ignore[arg-type]
    assert_invalid(exc_info, "token")
    with pytest.raises(InvalidArgument):
        SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        store.put(KEY, tokens, STATE)  # type: ignore[arg-type]


def test_tokens_that_do_not_match_the_key_are_refused(store: SnapshotStore) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        store.put(KEY, tokens_for(4), STATE)
    assert_invalid(exc_info)
    assert store.get(KEY) is None


@pytest.mark.parametrize(
    "priority",
    [MAX_PRIORITY + 1, -MAX_PRIORITY - 1, 10**100, -(10**100), 1.5, "high", None, float("inf"), float("nan")],
    ids=repr,
)
def test_bad_priorities_are_refused(store: SnapshotStore, priority: object) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        store.put(KEY, TOKENS, STATE, priority=priority)  # type: ignore[arg-type]
    assert_invalid(exc_info, "priority")
    assert store.get(KEY) is None


def test_extreme_valid_priorities_are_kept(store: SnapshotStore) -> None:
    for priority in (MAX_PRIORITY, -MAX_PRIORITY):
        assert store.put(KEY, TOKENS, STATE, priority=priority) is not None
        snap = store.get(KEY)
        assert snap is not None
        assert snap.priority == priority
        assert bytes(snap.state) == STATE


@pytest.mark.parametrize(
    "state",
    ["a string", 12345, None, [1, 2, 3], {"a": 1}, 3.5, b"", bytearray(), object()],
    ids=lambda s: type(s).__name__ + ":" + repr(s)[:12],
)
def test_bad_states_are_refused(store: SnapshotStore, state: object) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        store.put(KEY, TOKENS, state)  # type: ignore[arg-type]
    assert_invalid(exc_info, "state")
    assert store.get(KEY) is None


@pytest.mark.parametrize(
    "state",
    [bytearray(STATE), memoryview(STATE), np.frombuffer(STATE, dtype=np.uint8)],
    ids=["bytearray", "memoryview", "numpy"],
)
def test_every_bytes_like_state_is_accepted_and_copied(store: SnapshotStore, state: object) -> None:
    assert store.put(KEY, TOKENS, state) is not None  # type: ignore[arg-type]
    if isinstance(state, bytearray):
        state[:] = b"\x00" * len(state)  # the caller reuses its buffer; the store kept its own copy
    snap = store.get(KEY)
    assert snap is not None
    assert bytes(snap.state) == STATE


@pytest.mark.parametrize(
    "logits",
    ["text", [[1.0], [2.0]], [], ["a", "b"], np.zeros((2, 3), dtype=np.float32)],
    ids=lambda s: type(s).__name__ + ":" + repr(s)[:12],
)
def test_bad_logits_are_refused(store: SnapshotStore, logits: object) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        store.put(KEY, TOKENS, STATE, logits=logits)  # type: ignore[arg-type]
    assert_invalid(exc_info, "logits")


@pytest.mark.parametrize("key", ["a" * 64, None, 5, ("fp", "scope", 3, "00" * 16)], ids=repr)
def test_a_key_of_the_wrong_type_is_refused(store: SnapshotStore, key: object) -> None:
    for call in (store.get, store.remove):
        with pytest.raises(InvalidArgument) as exc_info:
            call(key)  # type: ignore[arg-type]
        assert_invalid(exc_info, "key")
    with pytest.raises(InvalidArgument):
        store.put(key, TOKENS, STATE)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ((FINGERPRINT, SCOPE, 0, "0" * 32), "token_count"),
        ((FINGERPRINT, SCOPE, -5, "0" * 32), "token_count"),
        ((FINGERPRINT, SCOPE, 2.0, "0" * 32), "token_count"),
        ((FINGERPRINT, SCOPE, 3, "XYZ"), "prefix_hash"),
        ((FINGERPRINT, SCOPE, 3, "../../etc/passwd"), "prefix_hash"),
        (("x" * 500, SCOPE, 3, "0" * 32), "model_fingerprint"),
    ],
)
def test_bad_key_fields_are_refused(fields: tuple, word: str) -> None:
    with pytest.raises(InvalidArgument) as exc_info:
        SnapshotKey(*fields)
    assert_invalid(exc_info, word)


def test_empty_query_is_a_miss_not_an_error(store: SnapshotStore) -> None:
    store.put(KEY, TOKENS, STATE)
    assert store.lookup(FINGERPRINT, SCOPE, []) is None
