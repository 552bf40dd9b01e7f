"""The prompt split alignment: measured per model, kept with the fingerprint, and where checkpoints go."""

from __future__ import annotations

import json

import llama_cpp
import numpy as np
import pytest
from chat_support import GREEDY, N_CTX, SYSTEM, chat, chat_reply, cold_chat, context_of

import snapcache
from snapcache.llama.exactness import alignment
from snapcache.llama.exactness.alignment import measure_alignment
from snapcache.llama.stored.checkpoints import FINAL_TAIL_TOKENS

pytestmark = pytest.mark.model


def last_logits(llm, parts: list[list[int]]) -> np.ndarray:
    llm.reset()
    for part in parts:
        llm.eval(part)
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy()


def test_f32_weights_split_anywhere(make_llama, tiny_model_path) -> None:
    assert measure_alignment(make_llama(tiny_model_path, n_ctx=N_CTX)) == 1


@pytest.mark.gemma
def test_a_full_size_window_cache_keeps_the_coarsest_alignment(make_llama, gemma_model_path) -> None:
    assert measure_alignment(make_llama(gemma_model_path, n_ctx=1024, swa_cache="full")) == 64


@pytest.mark.gemma
def test_a_window_sized_cache_is_measured(make_llama, gemma_model_path) -> None:
    # Finer than 64 (4 on the CPUs measured; the quantized kernels' row groups decide it).
    assert measure_alignment(make_llama(gemma_model_path, n_ctx=1024, swa_cache="window")) < 64


def test_a_chat_restores_all_but_the_last_tokens(cached, make_llama, tiny_model_path) -> None:
    first = cached()
    reply1 = chat_reply(first.create_chat_completion(chat(SYSTEM, "List my files."), **GREEDY))
    turn1_prompt = first.last_restore.prompt_tokens
    turn2 = chat(SYSTEM, "List my files.", reply1, "Now sort them by size.")
    second = cached()
    reply2 = chat_reply(second.create_chat_completion(turn2, **GREEDY))
    assert second.alignment == 1
    # The checkpoints of turn 1 (its system part, and near its end: its last 16 tokens are read with
    # its last token) sit on any token, not on multiples of 64.
    assert (
        turn1_prompt - 2 * FINAL_TAIL_TOKENS
        < second.last_restore.restored_tokens
        <= turn1_prompt - FINAL_TAIL_TOKENS
    )
    assert second.last_restore.restored_tokens % 64 != 0
    assert (reply2, context_of(second.llm)) == cold_chat(make_llama, tiny_model_path, turn2)


def test_the_alignment_is_kept_with_the_fingerprint(make_llama, tiny_model_path, store, monkeypatch) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    cached = snapcache.CachedLlama(llm, store, "agent")
    cached.warm(SYSTEM)
    note = json.loads((store.directory / "fingerprints" / f"{cached.fingerprint}.json").read_text())
    assert note["alignment"] == 1
    assert note["parts"]["context"]["type_k"] == llama_cpp.GGML_TYPE_F16

    # Another process (the in-process memo forgotten) reads it from the note instead of measuring.
    monkeypatch.setattr(alignment, "_measured", {})

    def no_measuring(llm):
        raise AssertionError("measured again although the note holds the alignment")

    monkeypatch.setattr(alignment, "measure_alignment", no_measuring)
    again = snapcache.CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, "agent")
    assert again.warm(SYSTEM).from_cache
    assert again.alignment == 1


@pytest.mark.gemma
def test_a_follow_up_question_reuses_the_context_only_at_an_aligned_point(
    make_llama, gemma_model_path, store
):
    system = "You are Desk, a careful assistant on the user's own computer. " + SYSTEM * 4
    llm = make_llama(gemma_model_path, n_ctx=2048)
    hook = snapcache.attach(llm, store, scope="desk")
    llm.create_chat_completion(messages=chat(system, "Where did I save the invoice?"), **GREEDY)
    question = chat(system, "Which folder holds my tax papers?")
    reply = chat_reply(llm.create_chat_completion(messages=question, **GREEDY))
    info = hook.last_restore
    assert info is not None
    assert info.source == "context"
    assert info.restored_tokens % hook.alignment == 0  # not where the two questions part
    cold = make_llama(gemma_model_path, n_ctx=2048)
    assert reply == chat_reply(cold.create_chat_completion(messages=question, **GREEDY))


def test_a_note_of_an_older_rule_is_measured_again(make_llama, tiny_model_path, store, monkeypatch) -> None:
    # Before the window-sized caches were measured, their notes said 64 without a probe.
    cached = snapcache.CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, "agent")
    cached.warm(SYSTEM)
    path = store.directory / "fingerprints" / f"{cached.fingerprint}.json"
    note = json.loads(path.read_text())
    path.write_text(json.dumps({"parts": note["parts"], "alignment": 64}))
    monkeypatch.setattr(alignment, "_measured", {})
    measured: list[int] = []

    def measuring(llm):
        measured.append(1)
        return 1

    monkeypatch.setattr(alignment, "measure_alignment", measuring)
    again = snapcache.CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, "agent")
    assert again.warm(SYSTEM).from_cache
    assert (measured, again.alignment) == ([1], 1)
    assert json.loads(path.read_text())["alignment"] == 1  # noted again, under this rule
