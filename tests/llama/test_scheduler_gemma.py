"""The scheduler on Gemma-3-270M: a quantized sliding-window model, prompts longer than its window.

Every answer is compared token for token with the same request run alone, from cold, on the Llama's
own 1-sequence context.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from test_scheduler import solo

from snapcache.llama.batch import BatchedLlama, SamplingParams, Scheduler
from snapcache.llama.hook.cached import CachedLlama
from snapcache.store import SnapshotStore

pytestmark = [pytest.mark.model, pytest.mark.gemma, pytest.mark.slow]

N_CTX = 2048
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
# About 700 Gemma tokens: longer than the 512-token sliding window.
SYSTEM = (Path(__file__).resolve().parents[2] / "examples" / "system_prompt.txt").read_text()[:2900]
QUESTIONS = ("What should I do first today?", "Summarize the rules in one line.", "Who are you?")


@pytest.fixture(scope="module", params=[True, False], ids=["full-size window cache", "window-sized cache"])
def gemma(request: pytest.FixtureRequest, gemma_model_path: Path) -> Iterator[llama_cpp.Llama]:
    """Gemma with llama-cpp-python's full-size sliding-window cache, or a window-sized one
    (`--swa-cache window`)."""
    from conftest import new_llama

    llm = new_llama(gemma_model_path, n_ctx=N_CTX, swa_full=request.param)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def cold(gemma: llama_cpp.Llama) -> Any:
    """Memoized cold answers on the Llama's own context."""
    done: dict[tuple[int, ...], list[int]] = {}

    def run(prompt: list[int]) -> list[int]:
        if tuple(prompt) not in done:
            done[tuple(prompt)] = solo(gemma, prompt)
        return done[tuple(prompt)]

    return run


def prompt_of(llm: llama_cpp.Llama, question: str, system: str = SYSTEM) -> list[int]:
    return list(llm.tokenize(f"{system}\nUser: {question}\nAssistant:".encode()))


@pytest.mark.parametrize("cache", [False, True])
def test_exact_mode_answers_each_as_alone(
    gemma: llama_cpp.Llama, cold: Any, store: SnapshotStore, cache: bool
) -> None:
    batch = [
        prompt_of(gemma, q, system) for q, system in zip(QUESTIONS, ("", SYSTEM, SYSTEM[:1500]), strict=True)
    ]
    with Scheduler(gemma, store if cache else None, n_seq=4, mode="exact") as s:
        requests = [s.submit(p, GREEDY) for p in batch]
        answers = [r.result(300) for r in requests]
    assert answers == [cold(p) for p in batch]


def test_a_request_alone_in_batched_mode_answers_as_cold(gemma: llama_cpp.Llama, cold: Any) -> None:
    prompt = prompt_of(gemma, QUESTIONS[0])
    with Scheduler(gemma, None, n_seq=4, mode="batched") as s:
        assert s.submit(prompt, GREEDY).result(300) == cold(prompt)


def test_batched_mode_answers_all(gemma: llama_cpp.Llama) -> None:
    batch = [prompt_of(gemma, q) for q in QUESTIONS]
    with Scheduler(gemma, None, n_seq=4, mode="batched") as s:
        requests = [s.submit(p, GREEDY) for p in batch]
        for request in requests:
            tokens = request.result(300)
            assert request.finish_reason in ("stop", "length")
            assert tokens
            assert len(tokens) <= 16


def test_a_warmed_state_serves_requests_across_the_window(
    gemma: llama_cpp.Llama, cold: Any, store: SnapshotStore
) -> None:
    """A state `CachedLlama.warm` saved in the 1-sequence layout restores into the sequences of the
    scheduler (its window padded), and what the scheduler saves (at the end of the shared system
    prompt it was given) serves the next request."""
    system = list(gemma.tokenize(SYSTEM.encode()))
    CachedLlama(gemma, store, "agents").warm(system)
    first, second = (prompt_of(gemma, q) for q in QUESTIONS[:2])
    with Scheduler(gemma, store, n_seq=2, mode="exact") as s:
        one = s.submit(first, GREEDY, scope="agents")
        other = s.submit(first, GREEDY, scope="elsewhere", chat_prefix=system)
        assert one.result(300) == cold(first)
        assert other.result(300) == cold(first)
        assert one.restore is not None
        assert other.restore is not None
        assert one.restore.restored_tokens >= 512
        assert other.restore.restored_tokens == 0
        two = s.submit(second, GREEDY, scope="elsewhere")
        assert two.result(300) == cold(second)
        assert two.restore is not None
        # where `other` saved (its system part's end or its prompt's, on the split alignment)
        shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
        assert 512 < two.restore.restored_tokens <= shared


def test_a_chat_through_batched_llama_is_the_llamas_and_restores_its_system_part(
    gemma: llama_cpp.Llama, store: SnapshotStore
) -> None:
    def chat(question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]

    options: dict[str, Any] = {"temperature": 0.0, "max_tokens": 16}
    expected = [gemma.create_chat_completion(messages=chat(q), **options) for q in QUESTIONS[:2]]
    with Scheduler(gemma, store, n_seq=2, mode="exact") as s:
        batched = BatchedLlama(s)
        first = batched.create_chat_completion(chat(QUESTIONS[0]), **options)
        second = batched.create_chat_completion(chat(QUESTIONS[1]), **options)
    for got, want in zip((first, second), expected, strict=True):
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 512


def test_every_request_of_a_burst_stores_its_prompt_end(
    gemma: llama_cpp.Llama, cold: Any, store: SnapshotStore
) -> None:
    """On a sliding-window model the window state at a restore point exists only while the read
    stops there: each request of a burst stops at its prompt-end point and stores it, also while
    another waits for its first token (the next turn of its chat restores it). Both answer as cold."""
    from snapcache.key import SnapshotKey
    from snapcache.llama.stored.checkpoints import final_point

    system = list(gemma.tokenize(SYSTEM.encode()))
    CachedLlama(gemma, store, "agents").warm(system)
    # Questions long enough for a prompt-end point on any grid past the system part by more than
    # `min_tokens` (32 tokens or more before the reply: see `final_point`).
    detail = " Answer in full, step by step, and give one example for each step you describe to me."
    asks = [prompt_of(gemma, q + detail * 4) for q in QUESTIONS[:2]]
    with Scheduler(gemma, store, n_seq=2, mode="exact") as s:
        assert s.fingerprint is not None
        alignment = s._cache.alignment
        with s._cond:  # both wait before the scheduler takes either
            burst = [s.submit(prompt, GREEDY, scope="agents") for prompt in asks]
        assert [r.result(300) for r in burst] == [cold(p) for p in asks]
        store.flush()
        for request in burst:
            assert request.restore is not None
            assert 512 < request.restore.restored_tokens < final_point(len(request.prompt), alignment)
        ends = [prompt[: final_point(len(prompt), alignment)] for prompt in asks]
        keys = [SnapshotKey.for_tokens(s.fingerprint, "agents", end) for end in ends]
        assert [store.held_priority(key) is not None for key in keys] == [True, True]


def test_an_inexact_scheduler_restores_and_reuses_a_sliding_window_model_at_any_token(
    gemma: llama_cpp.Llama, store: SnapshotStore
) -> None:
    """`exact=False` on Gemma: a system part warmed inexact restores at its own length (not cut to
    the split alignment), and the questions of a later burst reuse it from the sequences."""
    system = list(gemma.tokenize(SYSTEM.encode()))
    CachedLlama(gemma, store, "agents", exact=False).warm(system)
    asks = [prompt_of(gemma, q) for q in QUESTIONS]
    with Scheduler(gemma, store, n_seq=2, exact=False) as s:
        first = s.submit(asks[0], GREEDY, scope="agents")
        assert first.result(300)
        assert first.restore is not None
        assert first.restore.restored_tokens == len(system)
        burst = [s.submit(prompt, GREEDY, scope="agents") for prompt in asks[1:]]
        for request in burst:
            tokens = request.result(300)
            assert tokens
            assert request.finish_reason in ("stop", "length")
            assert request.restore is not None
            assert request.restore.restored_tokens >= len(system)


def test_a_sequence_whose_window_wrapped_is_cut_back_for_its_scopes_next_question(
    gemma: llama_cpp.Llama, cold: Any, store: SnapshotStore
) -> None:
    """A window-sized cache goes round its ring (1,024 cells here) on a prompt past it; the next
    question of the scope reads on from that sequence cut back to their shared prefix (no restore),
    where its ring still holds the cut point's window, and answers as cold."""
    from snapcache.llama.state.sequences import window_cells

    system = (Path(__file__).resolve().parents[2] / "examples" / "system_prompt.txt").read_text()[:5200]
    first, second = (prompt_of(gemma, q, system) for q in QUESTIONS[:2])
    ring = window_cells(gemma, N_CTX)
    with Scheduler(gemma, store, n_seq=2, mode="exact") as s:
        assert s.submit(first, GREEDY, scope="agents").result(300) == cold(first)
        again = s.submit(second, GREEDY, scope="agents")
        assert again.result(300) == cold(second)
    assert again.restore is not None
    if gemma.context_params.swa_full:
        return  # a full-size cache holds every cell: cut back from position 0, as before
    assert ring
    assert len(first) > ring
    assert again.restore.source == "context"
    assert again.restore.restored_tokens > len(system) // 8  # most of the system prompt, in tokens


def test_a_window_is_cut_back_only_where_a_cold_read_would_lay_it_out() -> None:
    from snapcache.llama.state.window_cuts import window_cut_reads_cold

    # A ring of 1,024 cells, a 512-token window, a sequence read cold to position 1,400 (it holds
    # positions 377..1,400).
    assert window_cut_reads_cold(377, 1400, 1300, 512, 1024)
    assert window_cut_reads_cold(377, 1400, 1025, 512, 1024)
    assert not window_cut_reads_cold(377, 1400, 1023, 512, 1024)  # the cut would wrap the ring
    assert not window_cut_reads_cold(377, 1400, 880, 512, 1024)  # its window is gone
    assert not window_cut_reads_cold(377, 1400, 1300, 512, 0)  # not a window-sized cache
    assert not window_cut_reads_cold(700, 1400, 1100, 512, 1024)  # held from 700: 589.. is gone
