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
from snapcache.key import BLOCK_TOKENS, SnapshotKey, as_token_array, block_keys, chain_hashes
from snapcache.prompt_tokens import PromptTokens


class _CountingHashlib:
    """`hashlib` for key.py that counts the token prefixes it hashes (by their bytes) in `hashed`."""

    def __init__(self, hashed: collections.Counter[bytes]) -> None:
        self._hashed = hashed

    def blake2b(self, data: Any = b"", **kwargs: Any) -> Any:
        if kwargs.get("person") == b"snapcache.tok1":
            self._hashed[bytes(data)] += 1
        return hashlib.blake2b(data, **kwargs)


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


def test_prompt_tokens_hash_each_prefix_and_block_once():
    tokens = as_token_array(range(3 * BLOCK_TOKENS + 5))
    prompt = PromptTokens(tokens)
    assert PromptTokens.of(prompt) is prompt
    key = prompt.key("fp", "s", 100)
    assert key == SnapshotKey.for_tokens("fp", "s", tokens[:100])
    assert prompt.key("fp", "s", 100) is key
    assert prompt.key("fp", "s") == SnapshotKey.for_tokens("fp", "s", tokens)
    assert prompt.prefix(100) is prompt.prefix(100)
    assert key.matches(prompt.prefix(100))
    assert prompt.block_keys("fp", "s", 3) == block_keys("fp", "s", tokens, 3)
    assert prompt.block_keys("fp", "s", 2) == block_keys("fp", "s", tokens, 2)
    assert prompt.chain_hashes(3) == chain_hashes(tokens, 3)
    with pytest.raises(InvalidArgument):
        prompt.block_keys("fp", "s", 4)  # 197 tokens fill three blocks

    # A head and an extension share what was hashed; the extension checks it starts the same way.
    longer = prompt.extended(as_token_array([*tokens.tolist(), 7]))
    assert longer.key("fp", "s", 100) is key
    assert longer.block_keys("fp", "s", 3)[2] is prompt.block_keys("fp", "s", 3)[2]
    assert longer.key("fp", "s", 150) is prompt.key("fp", "s", 150)  # shared both ways
    assert longer.key("fp", "s") == SnapshotKey.for_tokens("fp", "s", [*tokens.tolist(), 7])
    # A head extended otherwise than the tokens it came from shares only what they have in common.
    fork = prompt.head(100).extended(as_token_array([*tokens.tolist()[:100], 5, 5, 5]))
    assert fork.key("fp", "s", 100) is key
    assert fork.key("fp", "s", 102) != prompt.key("fp", "s", 102)
    assert prompt.key("fp", "s", 102) == SnapshotKey.for_tokens("fp", "s", tokens[:102])
    other = prompt.extended(as_token_array([9, *tokens.tolist()]))
    assert other.key("fp", "s", 100) != key
    assert other.key("fp", "s", 100) == SnapshotKey.for_tokens("fp", "s", [9, *tokens.tolist()[:99]])
    assert prompt.head(100).key("fp", "s") is key


def test_prompt_tokens_refuse_an_array_someone_can_still_write():
    mine = np.arange(5, dtype="<i4")
    view = mine.view()
    view.flags.writeable = False
    for writable in (mine, view, [1, 2, 3]):
        with pytest.raises(InvalidArgument):
            PromptTokens(writable)
    assert PromptTokens.of(mine).array is not mine  # `of` validates: a copy, frozen
    assert not PromptTokens.of(mine).array.flags.writeable


def test_prompt_tokens_hash_once(monkeypatch):
    hashed: collections.Counter[bytes] = collections.Counter()

    monkeypatch.setattr(key_module, "hashlib", _CountingHashlib(hashed))
    prompt = PromptTokens(as_token_array(range(2 * BLOCK_TOKENS)))
    for _ in range(3):
        prompt.key("fp", "s")
        prompt.key("fp", "other", 2 * BLOCK_TOKENS)
        prompt.head(BLOCK_TOKENS).key("fp", "s")
        prompt.block_keys("fp", "s", 2)
    assert sum(hashed.values()) == 4  # two prefixes, two blocks

    # A hash the store already checked is taken when its tokens are the prefix, never otherwise.
    known = SnapshotKey.for_tokens("fp", "s", range(100))
    other = SnapshotKey.for_tokens("fp", "s", range(1, 101))
    hashed.clear()
    fresh = PromptTokens(as_token_array(range(2 * BLOCK_TOKENS)))
    fresh.learn(known, as_token_array(range(100)))
    fresh.learn(other, as_token_array(range(1, 101)))
    assert fresh.key("fp", "s", 100) == known
    assert sum(hashed.values()) == 0
    fresh.learn(other, as_token_array(range(1, 102)))
    assert fresh.key("fp", "s", 101) == SnapshotKey.for_tokens("fp", "s", range(101))


@pytest.mark.model
def test_warm_copies_the_tokens_once_and_hashes_each_prefix_once(cached, monkeypatch):
    copies: list[int] = []
    real_copy = key_module._frozen_copy

    def counting_copy(array: Any) -> Any:
        copies.append(len(array))
        return real_copy(array)

    hashed: collections.Counter[bytes] = collections.Counter()

    warmer = cached()
    tokens = warmer.llm.tokenize(DOCUMENT.encode())
    monkeypatch.setattr(key_module, "_frozen_copy", counting_copy)
    monkeypatch.setattr(key_module, "hashlib", _CountingHashlib(hashed))
    warmed = warmer.warm(tokens)
    warmer.store.flush()

    assert warmed.token_count == len(tokens) > 10 * key_module.BLOCK_TOKENS
    # The caller's list only: the capture is keyed by that validated array, once compared with the
    # context's own input ids.
    assert copies == [len(tokens)]
    # The prompt's PromptTokens keys the lookups and the save alike; the puts in RAM and on disk
    # check those keys against the very arrays they were made from, without a hash.
    whole = np.asarray(tokens, dtype="<i4").tobytes()
    assert hashed[whole] == 1
    assert len(hashed) == 1 + len(tokens) // key_module.BLOCK_TOKENS
    assert set(hashed.values()) == {1}

    # The same keys as before: the stored entries are found under SnapshotKey.for_tokens.
    fingerprint = warmed.key.model_fingerprint
    assert warmed.key == SnapshotKey.for_tokens(fingerprint, "default", tokens)
    stored = {row.key for row in warmer.store.entries(blocks=True)}
    n_blocks = len(tokens) // key_module.BLOCK_TOKENS
    assert set(block_keys(fingerprint, "default", as_token_array(tokens), n_blocks)) <= stored
    assert warmed.key in stored


@pytest.mark.model
def test_a_completion_hashes_each_prefix_once(cached, monkeypatch):
    hashed: collections.Counter[bytes] = collections.Counter()

    llm = cached()
    llm.warm(llm.llm.tokenize(DOCUMENT.encode()))
    llm.store.flush()
    monkeypatch.setattr(key_module, "hashlib", _CountingHashlib(hashed))
    # Restores the warmed prefix, then saves the prompt's end and its new blocks.
    llm.create_completion(DOCUMENT * 2 + " And more.", max_tokens=4, temperature=0.0)
    llm.store.flush()
    assert hashed
    assert set(hashed.values()) == {1}
    assert llm.explain().restored_tokens > 0
