"""Tokens are validated and hashed once per layer that needs them, not once per layer they pass."""

from __future__ import annotations

import collections
import hashlib
import pickle
from typing import Any

import numpy as np
import pytest
from chat_support import DOCUMENT

import snapcache.key as key_module
from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey, as_token_array


def test_a_validated_array_comes_back_unchanged():
    tokens = as_token_array([1, 2, 3])
    assert as_token_array(tokens) is tokens
    assert as_token_array(tokens[1:]).base is tokens  # a slice is still frozen: no copy
    from_bytes = np.frombuffer(np.array([4, 5], dtype="<i4").tobytes(), dtype="<i4")
    assert as_token_array(from_bytes) is from_bytes


def test_arrays_someone_can_still_write_are_copied():
    mine = np.array([1, 2, 3], dtype="<i4")
    view = mine.view()
    view.flags.writeable = False  # read-only, but `mine` can still change it
    for tokens in (mine, view, np.frombuffer(bytearray(8), dtype="<i4"), as_token_array([1, 2, 3, 4])[::2]):
        result = as_token_array(tokens)
        assert result is not tokens
        assert not result.flags.writeable
        assert result.flags.owndata
    mine[0] = 9
    assert as_token_array(view)[0] == 9
    assert as_token_array(mine.copy())[0] == 9


def test_a_frozen_array_with_a_negative_id_is_refused():
    negative = np.array([3, -1], dtype="<i4")
    negative.flags.writeable = False
    with pytest.raises(InvalidArgument):
        as_token_array(negative)


def test_a_key_remembers_its_tokens_without_changing_what_it_is():
    tokens = as_token_array(range(10))
    key = SnapshotKey.for_tokens("fp", "s", tokens)
    assert key.matches(tokens)
    assert not key.matches(as_token_array(range(1, 11)))
    again = pickle.loads(pickle.dumps(key))
    assert again == key
    assert hash(again) == hash(key)
    assert again.matches(as_token_array(range(10)))


@pytest.mark.model
def test_warm_copies_the_tokens_once_and_hashes_each_prefix_at_most_twice(cached, monkeypatch):
    copies: list[int] = []
    real_copy = key_module._frozen_copy

    def counting_copy(array: Any) -> Any:
        copies.append(len(array))
        return real_copy(array)

    hashed: collections.Counter[bytes] = collections.Counter()
    real_blake2b = hashlib.blake2b

    class CountingHashlib:
        def blake2b(self, data: Any = b"", **kwargs: Any) -> Any:
            if kwargs.get("person") == b"snapcache.tok1":
                hashed[bytes(data)] += 1
            return real_blake2b(data, **kwargs)

    warmer = cached()
    tokens = warmer.llm.tokenize(DOCUMENT.encode())
    monkeypatch.setattr(key_module, "_frozen_copy", counting_copy)
    monkeypatch.setattr(key_module, "hashlib", CountingHashlib())
    warmed = warmer.warm(tokens)
    warmer.store.flush()

    assert warmed.token_count == len(tokens) > 10 * key_module.BLOCK_TOKENS
    # The caller's list, then the context's own input ids once evaluated: every layer between them
    # and after takes the validated array as it is.
    assert copies == [len(tokens), len(tokens)]
    # Once to look the prompt and its blocks up, once to key what was computed; the puts in RAM and
    # on disk check those keys against the very arrays they were made from, without a hash.
    whole = np.asarray(tokens, dtype="<i4").tobytes()
    assert hashed[whole] == 2
    assert len(hashed) == 1 + len(tokens) // key_module.BLOCK_TOKENS
    assert set(hashed.values()) == {2}
