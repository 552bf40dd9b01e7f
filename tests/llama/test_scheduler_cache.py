"""The scheduler with a store: each request restores into its own sequence, states cross layouts."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from test_scheduler import GREEDY, N_CTX, SYSTEM, _recorded, prompts, solo

from snapcache.key import DEFAULT_SCOPE, SnapshotKey
from snapcache.llama import capture_sequence
from snapcache.llama.batch import SamplingParams, Scheduler
from snapcache.llama.batch._context import SequenceContext
from snapcache.llama.batch._streams import to_one_stream, to_streams
from snapcache.llama.hook.cached import CachedLlama
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model


@pytest.fixture
def llm(make_llama: Any, tiny_model_path: Path) -> llama_cpp.Llama:
    return make_llama(tiny_model_path, n_ctx=N_CTX)


@pytest.fixture
def scheduler(llm: llama_cpp.Llama, store: SnapshotStore) -> Iterator[Any]:
    made: list[Scheduler] = []

    def factory(**kwargs: Any) -> Scheduler:
        made.append(Scheduler(kwargs.pop("llm", llm), kwargs.pop("store", store), **kwargs))
        return made[-1]

    yield factory
    for s in made:
        s.close()


def test_a_later_request_restores_what_an_earlier_one_saved(llm: llama_cpp.Llama, scheduler: Any) -> None:
    first, second = prompts(llm, 2, SYSTEM)
    one = scheduler(n_seq=2, mode="exact").submit(first, GREEDY)
    assert one.result(60) == solo(llm, first)
    assert one.restore is not None
    assert one.restore.restored_tokens == 0
    two = scheduler(n_seq=2, mode="exact").submit(second, GREEDY)  # nothing live: from the store
    assert two.result(60) == solo(llm, second)
    assert two.restore is not None
    assert two.restore.restored_tokens >= 64
    assert two.restore.source == "ram"
    assert two.restore.cached_tokens == two.restore.restored_tokens


def test_a_longer_stored_prefix_beats_a_shorter_live_one(
    llm: llama_cpp.Llama, scheduler: Any, store: SnapshotStore
) -> None:
    first, second = prompts(llm, 2, SYSTEM)
    s = scheduler(n_seq=1, mode="exact")
    assert s.submit(first, GREEDY).result(60)  # its sequence holds the system part of `second`
    CachedLlama(llm, store, DEFAULT_SCOPE).warm(list(second[:-2]))
    two = s.submit(second, GREEDY)
    assert two.result(60) == solo(llm, second)
    assert two.restore is not None
    assert two.restore.source == "ram"
    assert two.restore.restored_tokens >= len(second) - 2 - 64


def test_each_request_restores_into_its_own_sequence(
    llm: llama_cpp.Llama, scheduler: Any, store: SnapshotStore
) -> None:
    """Two scopes with the same system prompt at once: only the warmed scope restores, and each
    answer is the cold one."""
    CachedLlama(llm, store, "agent-a").warm(list(llm.tokenize(SYSTEM.encode())))
    prompt = prompts(llm, 3, SYSTEM)[2]
    s = scheduler(n_seq=4, mode="exact")
    a, b = s.submit(prompt, GREEDY, scope="agent-a"), s.submit(prompt, GREEDY, scope="agent-b")
    expected = solo(llm, prompt)
    assert a.result(60) == expected
    assert b.result(60) == expected
    assert a.restore is not None
    assert b.restore is not None
    assert a.restore.restored_tokens > 0
    assert b.restore.restored_tokens == 0


def test_a_state_warmed_by_cached_llama_serves_a_request(
    llm: llama_cpp.Llama, scheduler: Any, store: SnapshotStore
) -> None:
    system = list(llm.tokenize(SYSTEM.encode()))
    warmed = CachedLlama(llm, store).warm(system)
    prompt = prompts(llm, 2, SYSTEM)[1]
    s = scheduler(n_seq=4)
    assert s.fingerprint == warmed.key.model_fingerprint
    request = s.submit(prompt, GREEDY)
    assert request.result(60) == solo(llm, prompt)
    assert request.restore is not None
    assert request.restore.restored_tokens == len(system)


def test_a_state_the_scheduler_saved_serves_cached_llama(
    llm: llama_cpp.Llama, make_llama: Any, tiny_model_path: Path, scheduler: Any, store: SnapshotStore
) -> None:
    first, second = prompts(llm, 2, SYSTEM)
    scheduler(n_seq=3).submit(first, GREEDY).result(60)
    other = make_llama(tiny_model_path, n_ctx=N_CTX)
    cached = CachedLlama(other, store)
    result = cached.create_completion(second, temperature=0.0, max_tokens=16)
    assert cached.last_restore is not None
    assert cached.last_restore.restored_tokens >= 64
    assert result["choices"][0]["finish_reason"] == "length"
    assert other.input_ids[len(second) : other.n_tokens].tolist() == solo(llm, second)[:-1]


def test_save_false_only_restores(llm: llama_cpp.Llama, scheduler: Any, store: SnapshotStore) -> None:
    scheduler(n_seq=2, save=False).submit(prompts(llm, 1, SYSTEM)[0], GREEDY).result(60)
    assert store.entries() == []


def test_states_convert_between_layouts(llm: llama_cpp.Llama) -> None:
    """A 1-stream state is refused by a context of several streams as it is, and taken converted;
    a state captured there converts back to the bytes of the 1-sequence capture."""
    prompt = prompts(llm, 1, SYSTEM)[0]
    llm.reset()
    llm.eval(prompt)
    single = capture_sequence(llm)
    blob = np.frombuffer(single.state, dtype=np.uint8)
    context = SequenceContext(llm, 4)
    try:
        pointer = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        assert llama_cpp.llama_state_seq_set_data(context.ctx, pointer, blob.nbytes, 2) == 0
        converted = to_streams(blob, 4)
        assert converted.nbytes == blob.nbytes + 3 * 4  # three empty streams
        pointer = converted.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        assert llama_cpp.llama_state_seq_set_data(context.ctx, pointer, converted.nbytes, 2) > 0
        assert context.last_position(2) == len(prompt) - 1
        assert context.last_position(0) == -1
        back = context.capture(2, single.tokens)
        recaptured = np.frombuffer(back.state, dtype=np.uint8)
        # Only the source sequence id in the header and in each cell differ.
        assert recaptured.nbytes == blob.nbytes
        assert np.count_nonzero(recaptured != blob) <= 1 + len(prompt)
        assert np.array_equal(to_one_stream(blob), blob)
    finally:
        context.close()
    with pytest.raises(ValueError, match="1-stream"):
        to_streams(converted, 2)


def test_requests_of_a_scheduler_with_one_sequence_restore_as_well(
    llm: llama_cpp.Llama, scheduler: Any, store: SnapshotStore
) -> None:
    CachedLlama(llm, store).warm(list(llm.tokenize(SYSTEM.encode())))
    prompt = prompts(llm, 1, SYSTEM)[0]
    request = scheduler(n_seq=1).submit(prompt, SamplingParams(temperature=0.0, max_tokens=8))
    assert request.result(60) == solo(llm, prompt, SamplingParams(temperature=0.0, max_tokens=8))
    assert request.restore is not None
    assert request.restore.restored_tokens > 0


@pytest.mark.parametrize("kv_cache", ["q8_0", "q4_0"])
def test_a_quantized_cache_crosses_layouts_and_answers_as_cold(
    make_llama: Any, wide_heads_model_path: Path, store: SnapshotStore, kv_cache: str
) -> None:
    """`load_llama(kv_cache=...)`'s flash attention over a quantized cache: a state warmed on the
    Llama's own context serves a request in a sequence of the scheduler's, and the answer is cold's."""
    from snapcache.llama.setup.loader import KV_CACHE_TYPES

    cache_type, _ = KV_CACHE_TYPES[kv_cache]
    quantized = make_llama(
        wide_heads_model_path, n_ctx=N_CTX, type_k=cache_type, type_v=cache_type, flash_attn=True
    )
    prompt = prompts(quantized, 3, SYSTEM)[2]
    expected = solo(quantized, prompt)
    CachedLlama(quantized, store).warm(list(quantized.tokenize(SYSTEM.encode())))
    with Scheduler(quantized, store, n_seq=2, mode="exact") as s:
        request = s.submit(prompt, GREEDY)
        assert request.result(60) == expected
    assert request.restore is not None
    assert request.restore.source == "ram"
    assert request.restore.restored_tokens >= 64


def test_states_are_stored_after_the_reads_of_a_burst(llm: llama_cpp.Llama, scheduler: Any) -> None:
    """A burst's prompts are all read before the states taken on the way are stored, so that no
    first token waits for another request's save; what is stored then serves the next request."""
    asks = [llm.tokenize(f"Question {i}: {'where is the quick brown fox? ' * 2}".encode()) for i in range(2)]
    s = scheduler(n_seq=2)
    events = _recorded(s)
    cache = s._cache
    real_save = cache.save

    def recording_save(pending: Any) -> int:
        events.append(("save", [len(pending.captured.tokens)]))
        return int(real_save(pending))

    cache.save = recording_save
    with s._cond:  # both wait before the scheduler takes either
        burst = [s.submit(prompt, GREEDY) for prompt in asks]
    for request, prompt in zip(burst, asks, strict=True):
        assert request.result(60) == solo(llm, prompt)
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["read", "read"]
    assert kinds.count("save") == 2
    assert kinds.index("save") == 2
    again = s.submit(asks[0], GREEDY, scope=DEFAULT_SCOPE)
    assert again.result(60) == solo(llm, asks[0])
    assert again.restore is not None
    assert again.restore.restored_tokens >= 64


def test_an_inexact_scheduler_reuses_prompts_at_any_token_under_its_own_fingerprint(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    """`exact=False`: a later request reuses every token it shares with the prompt a sequence holds
    (not cut down to the split alignment), and what it saves is kept apart from exact states."""
    from snapcache.llama.exactness.fingerprint import model_fingerprint

    asks = [llm.tokenize(f"{SYSTEM}Question {i}: where is the fox?".encode()) for i in range(2)]
    shared = next(i for i, (a, b) in enumerate(zip(*asks, strict=False)) if a != b)
    assert shared % 64 != 0
    inexact = scheduler(n_seq=2, exact=False)
    assert inexact.fingerprint == model_fingerprint(llm, exact=False)
    assert inexact.fingerprint != model_fingerprint(llm)
    assert inexact.submit(asks[0], GREEDY, scope="a").result(60)
    later = inexact.submit(asks[1], GREEDY, scope="a")
    assert later.result(60)
    assert later.restore is not None
    assert (later.restore.source, later.restore.restored_tokens) == ("context", shared)
    exact = scheduler(n_seq=1)
    again = exact.submit(asks[0], GREEDY, scope="a")
    assert again.result(60) == solo(llm, asks[0])
    assert again.restore is not None
    assert again.restore.restored_tokens == 0


def test_only_a_chat_prefix_that_can_be_a_restore_point_is_waited_for(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    """A request waits for an earlier one to store their shared chat prefix only where that prefix
    is long enough to be stored (64 tokens on the split alignment): a shorter one is read by each."""
    s = scheduler(n_seq=2)
    asks = prompts(llm, 2, SYSTEM)
    long_prefix, short_prefix = asks[0][:200], asks[0][:40]
    with s._cond:  # neither is taken before both are asked about
        first = s.submit(asks[0], GREEDY, chat_prefix=long_prefix, chat=True)
        second = s.submit(asks[1], GREEDY, chat_prefix=long_prefix, chat=True)
        other_scope = s.submit(asks[1], GREEDY, scope="b", chat_prefix=long_prefix, chat=True)
        short = s.submit(asks[1], GREEDY, chat_prefix=short_prefix, chat=True)
        assert s._follows(second, [first])
        assert not s._follows(other_scope, [first])
        assert not s._follows(short, [s.submit(asks[0], GREEDY, chat_prefix=short_prefix, chat=True)])
    for request in (first, second, other_scope, short):
        assert request.result(60)


def test_a_stored_prompt_end_supersedes_the_one_its_conversation_stored_before(
    llm: llama_cpp.Llama, scheduler: Any, store: SnapshotStore
) -> None:
    """As on a single sequence: the next turn of a chat (reusing its sequence) stores its own prompt
    end, and the previous turn's goes; another conversation's stays."""
    from snapcache.llama.stored.checkpoints import align_down, final_point

    s = scheduler(n_seq=2)
    turn = prompts(llm, 3, SYSTEM)[2]
    other = prompts(llm, 2, "Another conversation entirely. " * 4)[1]
    for prompt in (turn, other):
        assert s.submit(prompt, GREEDY, chat=True).result(60)
    store.flush()
    alignment = s._cache.alignment
    ends = [prompt[: final_point(len(prompt), alignment)] for prompt in (turn, other)]
    keys = [SnapshotKey.for_tokens(s.fingerprint, DEFAULT_SCOPE, end) for end in ends]
    assert all(store.held_priority(key) is not None for key in keys)
    next_turn = [*turn, *llm.tokenize(b" and then the next question about the fox?", add_bos=False)]
    request = s.submit(next_turn, GREEDY, chat=True)
    assert request.result(60) == solo(llm, next_turn)
    assert request.restore is not None
    assert (request.restore.source, request.restore.restored_tokens) == (
        "context",
        align_down(len(turn), alignment),
    )
    store.flush()
    new_end = next_turn[: final_point(len(next_turn), alignment)]
    assert store.held_priority(SnapshotKey.for_tokens(s.fingerprint, DEFAULT_SCOPE, new_end)) is not None
    assert store.held_priority(keys[0]) is None
    assert store.held_priority(keys[1]) is not None


def test_a_request_says_where_its_time_to_the_first_token_went(llm: llama_cpp.Llama, scheduler: Any) -> None:
    first, second, third = prompts(llm, 3, SYSTEM)
    running = scheduler(n_seq=2, mode="exact")
    running.submit(first, GREEDY).result(60)
    burst = [running.submit(p, GREEDY) for p in (second, third)]
    for request in burst:
        request.result(60)
        assert request.restore is not None
        assert request.restore.phases is not None
        phases = request.restore.phases
        assert request.first_token_seconds is not None
        assert phases.restore > 0
        assert phases.read > 0
        assert min(phases.as_dict().values()) >= 0
        # The phases add up to no more than the time to the first token, and cover most of it.
        assert phases.total <= phases.first_token + 1e-3
        assert phases.first_token <= request.first_token_seconds + 1e-3
        assert phases.total >= 0.5 * phases.first_token
    # Both were admitted in one step: the later one's first token waited for the earlier one's read.
    later = max(burst, key=lambda r: r.first_token_seconds or 0.0).restore
    assert later is not None
    assert later.phases is not None
    assert later.phases.others_read + later.phases.queue > 0
