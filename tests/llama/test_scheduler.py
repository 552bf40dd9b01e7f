"""The scheduler on the tiny model: several requests in one context of N sequences, without HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from snapcache.errors import InvalidArgument
from snapcache.llama.batch import SamplingParams, Scheduler, SchedulerError
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

N_CTX = 2048
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
SYSTEM = "You are a careful desktop assistant. Answer briefly and plainly. " * 4


def prompts(llm: llama_cpp.Llama, count: int, system: str = "") -> list[list[int]]:
    """Prompts of different lengths (the tiny model's byte vocabulary: a token per byte)."""
    return [
        llm.tokenize(f"{system}Question {i}: {'the quick brown fox ' * (3 + 5 * i)}?".encode())
        for i in range(count)
    ]


def solo(llm: llama_cpp.Llama, prompt: Sequence[int], params: SamplingParams = GREEDY) -> list[int]:
    """The same request on the Llama's own 1-sequence context, from cold."""
    llm.reset()
    out: list[int] = []
    assert params.max_tokens is not None
    for token in llm.generate(prompt, temp=params.temperature, top_k=params.top_k, top_p=params.top_p):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token) or len(out) >= params.max_tokens:
            break
        out.append(token)
    return out


@pytest.fixture
def llm(make_llama: Any, tiny_model_path: Path) -> llama_cpp.Llama:
    return make_llama(tiny_model_path, n_ctx=N_CTX)


@pytest.fixture
def scheduler(llm: llama_cpp.Llama) -> Iterator[Any]:
    """Factory of schedulers over `llm`, closed after the test."""
    made: list[Scheduler] = []

    def factory(store: SnapshotStore | None = None, **kwargs: Any) -> Scheduler:
        made.append(Scheduler(llm, store, **kwargs))
        return made[-1]

    yield factory
    for s in made:
        s.close()


def occupied(s: Scheduler, seq_id: int) -> bool:
    return s._context.last_position(seq_id) >= 0


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_four_concurrent_requests_complete(llm: llama_cpp.Llama, scheduler: Any, mode: str) -> None:
    s = scheduler(n_seq=4, mode=mode)
    requests = [s.submit(p, GREEDY) for p in prompts(llm, 4)]
    for request in requests:
        tokens = request.result(60)
        assert request.finish_reason in ("stop", "length")
        assert 0 < len(tokens) <= 16
        assert request.restore is not None
        assert request.restore.prompt_tokens == len(request.prompt)
    assert s.pending() == (0, 0)


def test_exact_mode_answers_each_as_alone(llm: llama_cpp.Llama, scheduler: Any) -> None:
    batch = prompts(llm, 4)
    s = scheduler(n_seq=4, mode="exact")
    requests = [s.submit(p, GREEDY) for p in batch]
    answers = [r.result(60) for r in requests]
    assert answers == [solo(llm, p) for p in batch]


def test_a_request_alone_answers_as_a_cold_single_sequence_run(llm: llama_cpp.Llama, scheduler: Any) -> None:
    prompt = prompts(llm, 3)[2]
    s = scheduler(n_seq=4, mode="batched")
    assert s.submit(prompt, GREEDY).result(60) == solo(llm, prompt)


def test_seeded_sampling_matches_the_llama(llm: llama_cpp.Llama, scheduler: Any) -> None:
    prompt = prompts(llm, 1)[0]
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, max_tokens=12, seed=1234)
    llm.set_seed(1234)
    expected = solo(llm, prompt, params)
    got = scheduler(n_seq=2, mode="exact").submit(prompt, params).result(60)
    assert got == expected
    llm.set_seed(1235)
    assert solo(llm, prompt, params) != expected  # the seed decides


def test_tokens_stream_as_they_are_sampled(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=2)
    request = s.submit(prompts(llm, 1)[0], SamplingParams(temperature=0.0, max_tokens=8))
    streamed = list(request)
    assert streamed == request.tokens
    assert len(streamed) == 8
    assert request.first_token_seconds is not None
    assert request.first_token_seconds > 0


def test_burst_larger_than_the_sequences_queues_and_all_are_answered(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    batch = prompts(llm, 7)
    s = scheduler(n_seq=2, mode="exact")
    requests = [s.submit(p, GREEDY) for p in batch]
    holding, waiting = s.pending()
    assert holding + waiting <= 7
    assert waiting >= 1
    answers = [r.result(120) for r in requests]
    assert answers == [solo(llm, p) for p in batch]
    assert s.pending() == (0, 0)


def test_cancel_frees_the_sequence_at_once(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=1)
    long = s.submit(prompts(llm, 1)[0], SamplingParams(temperature=0.0, max_tokens=1000))
    waiting = s.submit(prompts(llm, 2)[1], GREEDY)
    first = next(iter(long))
    assert isinstance(first, int)
    assert occupied(s, 0)
    long.cancel()
    assert waiting.result(60) == solo(llm, prompts(llm, 2)[1])
    assert long.finish_reason == "cancelled"
    assert len(long.tokens) < 1000
    deadline = time.monotonic() + 10
    while s.pending() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.pending() == (0, 0)


def test_a_finished_request_leaves_its_prompt_for_the_next_of_its_scope(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    """The next request sharing the prompt's start reuses the cells in place, on the alignment, and
    answers as cold; a request of another scope does not."""
    first, second = prompts(llm, 2, SYSTEM)
    s = scheduler(n_seq=1, mode="exact")
    assert s.submit(first, GREEDY).result(60) == solo(llm, first)
    again = s.submit(second, GREEDY)
    assert again.result(60) == solo(llm, second)
    assert again.restore is not None
    assert again.restore.source == "context"
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert 0 < again.restore.restored_tokens <= shared
    assert again.restore.restored_tokens % 64 == 0  # without a store: the coarsest alignment
    other = s.submit(second, GREEDY, scope="someone-else")
    assert other.result(60) == solo(llm, second)
    assert other.restore is not None
    assert other.restore.restored_tokens == 0


def test_a_request_copies_the_prefix_another_sequence_holds(llm: llama_cpp.Llama, scheduler: Any) -> None:
    """While one request generates, the next with the same start copies its cells into its own sequence."""
    first, second = prompts(llm, 2, SYSTEM)
    s = scheduler(n_seq=2, mode="exact")
    long = s.submit(first, SamplingParams(temperature=0.0, max_tokens=1000))
    assert isinstance(next(iter(long)), int)  # it has read its prompt
    copied = s.submit(second, GREEDY)
    answer = copied.result(60)
    long.cancel()
    assert copied.restore is not None
    assert copied.restore.source == "context"
    assert copied.restore.restored_tokens > 0
    assert answer == solo(llm, second)


def test_a_waiting_request_cancelled_never_runs(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=1)
    first = s.submit(prompts(llm, 1)[0], SamplingParams(temperature=0.0, max_tokens=200))
    second = s.submit(prompts(llm, 2)[1], GREEDY)
    second.cancel()
    first.result(60)
    assert second.result(10) == []
    assert second.finish_reason == "cancelled"
    assert second.restore is None


def test_a_slow_reader_does_not_hold_the_others_back(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=2)
    slow = s.submit(prompts(llm, 1)[0], SamplingParams(temperature=0.0, max_tokens=40))
    fast = s.submit(prompts(llm, 2)[1], SamplingParams(temperature=0.0, max_tokens=40))
    assert len(fast.result(60)) == 40  # nobody has read `slow` yet
    assert len(list(slow)) == 40


def test_max_tokens_caps_the_answer(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=2)
    prompt = prompts(llm, 1)[0]
    params = SamplingParams.from_completion_kwargs({"temperature": 0.0, "max_completion_tokens": 5})
    request = s.submit(prompt, params)
    assert len(request.result(60)) == 5
    assert request.finish_reason == "length"
    # None: up to the context's end, as on the Llama's own path.
    endless = s.submit(prompt, SamplingParams(temperature=0.0, max_tokens=None))
    assert endless.max_tokens == N_CTX - len(prompt)
    endless.cancel()


def test_bad_requests_are_refused(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=2)
    with pytest.raises(InvalidArgument, match="no tokens"):
        s.submit([], GREEDY)
    with pytest.raises(InvalidArgument, match="exceed context window"):
        s.submit([1] * N_CTX, GREEDY)
    with pytest.raises(InvalidArgument, match="vocabulary"):
        s.submit([1, 10**6], GREEDY)
    with pytest.raises(InvalidArgument):
        Scheduler(llm, n_seq=0)
    with pytest.raises(InvalidArgument):
        Scheduler(llm, mode="fast")  # type: ignore[arg-type]


def test_close_ends_running_and_waiting_requests(llm: llama_cpp.Llama) -> None:
    s = Scheduler(llm, n_seq=1)
    running = s.submit(prompts(llm, 1)[0], SamplingParams(temperature=0.0, max_tokens=5000 // 4))
    waiting = s.submit(prompts(llm, 1)[0], GREEDY)
    next(iter(running))
    s.close()
    for request in (running, waiting):
        assert request.done
    with pytest.raises(SchedulerError):
        waiting.result(1)
    with pytest.raises(SchedulerError):
        s.submit(prompts(llm, 1)[0], GREEDY)


def test_requests_from_many_threads(llm: llama_cpp.Llama, scheduler: Any) -> None:
    s = scheduler(n_seq=3, mode="exact")
    batch = prompts(llm, 6)
    answers: dict[int, list[int]] = {}

    def client(i: int) -> None:
        answers[i] = list(s.submit(batch[i], GREEDY))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [answers[i] for i in range(6)] == [solo(llm, p) for p in batch]


def test_a_request_sharing_little_does_not_cut_down_a_held_prompt(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    """With a sequence free, a request sharing only a few tokens copies them and leaves the held
    prompt whole for the next request of its conversation."""
    first, second = prompts(llm, 2, SYSTEM)
    s = scheduler(n_seq=2, mode="exact")
    assert s.submit(first, GREEDY).result(60) == solo(llm, first)
    other = llm.tokenize((SYSTEM[:100] + " Or rather: you are someone else entirely. Why?").encode())
    assert s.submit(other, GREEDY).result(60) == solo(llm, other)
    again = s.submit(second, GREEDY)
    assert again.result(60) == solo(llm, second)
    assert again.restore is not None
    assert again.restore.source == "context"
    assert again.restore.restored_tokens >= len(llm.tokenize(SYSTEM.encode())) - 64 > 100


def test_a_generation_step_decodes_its_sequences_in_sequence_order(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    """llama.cpp splits a batch over several KV streams into runs of increasing sequence ids, each
    run reading the weights once: a step lists its sequences in that order, whatever order their
    requests came in (here the reverse, each scope going back to the sequence holding its prompt)."""
    scopes = ["a", "b", "c", "d"]
    asks = prompts(llm, 4, SYSTEM)
    s = scheduler(n_seq=4)
    for scope, prompt in zip(scopes, asks, strict=True):
        s.submit(prompt, GREEDY, scope=scope).result(60)
    steps: list[list[int]] = []
    real_decode = s._context.decode

    def recording_decode(chunks: Any) -> Any:
        if len(chunks) > 1:
            steps.append([chunk.seq_id for chunk in chunks])
        return real_decode(chunks)

    s._context.decode = recording_decode
    params = SamplingParams(temperature=0.0, max_tokens=12)
    pairs = reversed(list(zip(scopes, asks, strict=True)))
    later = [s.submit(prompt, params, scope=scope) for scope, prompt in pairs]
    for request in later:
        assert len(request.result(60)) > 0
        assert request.restore is not None
        assert request.restore.source == "context"
    assert any(len(step) == 4 for step in steps)
    assert all(step == sorted(step) for step in steps)


def _recorded(s: Scheduler, on_read: Any = None) -> list[tuple[str, list[int]]]:
    """The scheduler's decodes from now on, as ("read", [seq]) or ("step", [seqs]); `on_read(seq_id)`
    runs on the scheduler's thread before each prompt read."""
    events: list[tuple[str, list[int]]] = []
    real_decode = s._context.decode

    def recording_decode(chunks: Any) -> Any:
        seqs = [chunk.seq_id for chunk in chunks]
        reading = len(chunks) == 1 and len(chunks[0].tokens) > 1
        if reading and on_read is not None:
            on_read(seqs[0])
        events.append(("read" if reading else "step", seqs))
        return real_decode(chunks)

    s._context.decode = recording_decode
    return events


def test_a_request_that_comes_during_a_read_is_read_before_the_next_step(
    llm: llama_cpp.Llama, scheduler: Any
) -> None:
    """A burst's questions reach the scheduler a few milliseconds apart: one that comes while the
    first is read joins before the generation step, so its first token waits for no step."""
    first = prompts(llm, 1)[0]
    second = llm.tokenize(b"Question 9: where does the quick brown fox sleep?")
    s = scheduler(n_seq=2)
    later: list[Any] = []

    def submit_second(seq_id: int) -> None:
        if not later:
            later.append(s.submit(second, GREEDY))

    events = _recorded(s, submit_second)
    one = s.submit(first, GREEDY)
    assert one.result(60) == solo(llm, first)
    assert later[0].result(60)
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["read", "read"]
    assert events[2] == ("step", [0, 1])
