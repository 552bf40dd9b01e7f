"""CachedLlama on Gemma-3-270M, a sliding-window model whose restored states cannot be cut back.

The system prompt is longer than Gemma's 512-token window, so restores cross it. Every reply is
compared token for token with a cold run of a plain Llama.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chat_support import chat as chat_with
from chat_support import chat_reply as reply_of
from chat_support import common_prefix, context_of

from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.stored.checkpoints import CHECKPOINT_ALIGN, FINAL_TAIL_TOKENS, final_point
from snapcache.llama.stored.read_grid import MIN_PIECE_TOKENS, ReadGrid

pytestmark = [pytest.mark.model, pytest.mark.gemma, pytest.mark.slow]

N_CTX = 2048
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 16}
# About 700 Gemma tokens: longer than the 512-token sliding window.
SYSTEM = (Path(__file__).resolve().parents[2] / "examples" / "system_prompt.txt").read_text()[:2900]


def chat(*turns: str) -> list[dict[str, str]]:
    return chat_with(SYSTEM, *turns)


@pytest.fixture(scope="module")
def cold_runs(gemma_model_path):
    """Memoized cold runs on one plain Llama, reset before each so that it reads every prompt in full."""
    from conftest import new_llama

    llm = new_llama(gemma_model_path, n_ctx=N_CTX)
    done: dict[str, tuple[str, list[int]]] = {}

    def run(prompt: Any) -> tuple[str, list[int]]:
        key = json.dumps(prompt)
        if key not in done:
            llm.reset()
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
                text = reply_of(llm.create_chat_completion(messages=prompt, **GREEDY))
            else:
                text = llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
            done[key] = (text, context_of(llm))
        return done[key]

    yield run
    llm.close()


@pytest.fixture
def cached(make_llama, gemma_model_path, store):
    def factory(**kwargs: Any) -> CachedLlama:
        return CachedLlama(make_llama(gemma_model_path, n_ctx=N_CTX), store, **kwargs)

    return factory


def test_restore_then_suffix_matches_cold(cached, cold_runs):
    warmer = cached()
    tokens = warmer.llm.tokenize(SYSTEM.encode())[:640]
    assert warmer.warm(tokens).token_count == 640
    # 16 tokens or more: a restore leaves at least that many to read (`ReadGrid`).
    question = b"\nQuestion: where are the invoices from last spring, and who sent them to me?\nAnswer:"
    prompt = tokens + warmer.llm.tokenize(question, add_bos=False)

    fresh = cached()
    text = fresh.create_completion(prompt, **GREEDY)["choices"][0]["text"]

    info = fresh.last_restore
    assert (info.restored_tokens, info.source) == (640, "ram")
    assert (text, context_of(fresh.llm)) == cold_runs(prompt)


def test_a_prompt_a_token_past_a_snapshot_restores_a_piece_before_it(cached, cold_runs):
    warmer = cached()
    # Warmed at 640 of 641 tokens: restored there, the completion of the 641 would read the last one
    # alone, a batch of one that Gemma's kernels read otherwise than the cold read's batch does. It
    # restores the point warm leaves a piece of a batch before (624) and reads 17; 16 tokens past
    # the snapshot, the snapshot restores (`ReadGrid`).
    tokens = warmer.llm.tokenize(SYSTEM.encode())[:657]
    assert warmer.warm(tokens[:641]).token_count == 640

    fresh = cached()
    text = fresh.create_completion(tokens[:641], **GREEDY)["choices"][0]["text"]
    info = fresh.last_restore
    assert (info.restored_tokens, info.evaluated_tokens) == (624, 17)
    assert (text, context_of(fresh.llm)) == cold_runs(tokens[:641])

    fresh = cached()
    text = fresh.create_completion(tokens, **GREEDY)["choices"][0]["text"]
    info = fresh.last_restore
    assert (info.restored_tokens, info.evaluated_tokens) == (640, 17)
    assert (text, context_of(fresh.llm)) == cold_runs(tokens)


def test_multi_turn_chat_restores_the_earlier_turns(cached, cold_runs):
    first = cached()
    reply1 = reply_of(first.create_chat_completion(chat("Where is the plumber's invoice?"), **GREEDY))
    turn1_prompt = first.last_restore.prompt_tokens

    turn2 = chat("Where is the plumber's invoice?", reply1, "Open it, please.")
    second = cached()
    reply2 = reply_of(second.create_chat_completion(turn2, **GREEDY))

    assert second.last_restore.source == "ram"
    # The prompt end leaves 16 tokens or more to read (16 to 79 on the 64-token grid: `ReadGrid`).
    assert second.last_restore.restored_tokens >= turn1_prompt - CHECKPOINT_ALIGN - MIN_PIECE_TOKENS
    assert (reply2, context_of(second.llm)) == cold_runs(turn2)


def test_stream_gives_the_same_tokens_and_saves_when_exhausted(cached, cold_runs, store):
    messages = chat("What is on my calendar today?")
    warm = cached()
    chunks = list(warm.create_chat_completion(messages, stream=True, **GREEDY))
    streamed = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)

    assert (streamed, context_of(warm.llm)) == cold_runs(messages)
    saved = {entry.key.token_count for entry in store.entries()}
    assert warm.last_restore.checkpoints >= 1
    # The prompt end is saved 16 tokens or more before the reply: 16 to 79 on the 64 grid, 16 to 19
    # on a 4-token one (see `final_point`, `ReadGrid`); the context holds the reply too.
    prompt = warm.last_restore.prompt_tokens
    assert prompt - max(saved) <= FINAL_TAIL_TOKENS + CHECKPOINT_ALIGN


def test_new_chat_question_reuses_the_shared_prefix_without_warm(cached, cold_runs):
    first = cached()
    first.create_chat_completion(chat("Clear out my desktop."), **GREEDY)
    prompt1 = context_of(first.llm)[: first.last_restore.prompt_tokens]

    messages = chat("Tell Sam I will be ten minutes late.")
    second = cached()
    reply = reply_of(second.create_chat_completion(messages, **GREEDY))
    prompt2 = context_of(second.llm)[: second.last_restore.prompt_tokens]

    shared = common_prefix(prompt1, prompt2)
    assert shared > 640
    assert second.last_restore.restored_tokens >= 0.9 * shared
    assert (reply, context_of(second.llm)) == cold_runs(messages)


def test_new_raw_question_reuses_the_shared_prefix_without_warm(cached, cold_runs):
    first = cached()
    first.create_completion(SYSTEM + "\nQuestion: what can you do?\nAnswer:", **GREEDY)
    prompt1 = context_of(first.llm)[: first.last_restore.prompt_tokens]

    prompt = SYSTEM + "\nQuestion: may you delete files?\nAnswer:"
    second = cached()
    text = second.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    prompt2 = context_of(second.llm)[: second.last_restore.prompt_tokens]

    shared = common_prefix(prompt1, prompt2)
    assert shared > 640
    # A sliding-window model restores at the stored points that hold a window: on a raw prompt, every
    # window length (512 tokens for Gemma 3) and the prompt's end (see `final_point`), on the read
    # grid (16 tokens or more before the end: `ReadGrid`).
    grid = ReadGrid.of(first.llm, first.alignment)
    points = [shared // 512 * 512, grid.at_most(final_point(len(prompt1), first.alignment), len(prompt1))]
    assert second.last_restore.restored_tokens == max(p for p in points if p <= shared)
    assert (text, context_of(second.llm)) == cold_runs(prompt)


def test_warm_then_chat_hits_the_warmed_prefix(cached, cold_runs):
    warmed = cached().warm(SYSTEM)
    assert warmed.token_count > 512  # past the sliding window

    messages = chat("Tell Sam I will be ten minutes late.")
    fresh = cached()
    reply = reply_of(fresh.create_chat_completion(messages, **GREEDY))

    assert (fresh.last_restore.restored_tokens, fresh.last_restore.source) == (warmed.token_count, "ram")
    assert (reply, context_of(fresh.llm)) == cold_runs(messages)


def test_a_raw_warm_is_saved_where_reading_on_is_a_cold_read(cached, cold_runs):
    """Raw tokens of any length are warmed at the model's split alignment, so a restore reads on
    from a split where the reply is the cold one (a restore from an unaligned point is not: with a
    Q4_0 cache and flash attention it changed Gemma's greedy reply)."""
    warmer = cached()
    tokens = list(warmer.llm.tokenize(SYSTEM.encode()))
    length = len(tokens) - 40
    assert length % warmer.alignment != 0
    warmed = warmer.warm(tokens[:length])
    assert warmed.token_count == length - length % warmer.alignment

    prompt = tokens + list(warmer.llm.tokenize(b" Question: who comes first?", add_bos=False))
    reader = cached()
    text = reader.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    assert reader.last_restore.restored_tokens == warmed.token_count
    assert (text, context_of(reader.llm)) == cold_runs(prompt)


def _counting_long_tokenizations(llm: Any, shortest: int) -> list[int]:
    """Record the length of every text of at least `shortest` bytes the Llama tokenizes from now on."""
    seen: list[int] = []
    tokenize = llm.tokenize

    def counting(text: bytes, *args: Any, **kwargs: Any) -> list[int]:
        if len(text) >= shortest:
            seen.append(len(text))
        return tokenize(text, *args, **kwargs)  # type: ignore[no-any-return]

    llm.tokenize = counting
    return seen


def test_a_chat_restored_to_its_warmed_system_part_tokenizes_only_its_prompt(cached, cold_runs):
    warmed = cached().warm(SYSTEM)
    fresh = cached()
    seen = _counting_long_tokenizations(fresh.llm, len(SYSTEM))
    decoded_by_token: list[int] = []  # long runs only: generation decodes its own few tokens
    detokenize = fresh.llm.detokenize
    fresh.llm.detokenize = lambda tokens, *args, **kwargs: (  # type: ignore[method-assign]
        (len(tokens) > 100 and decoded_by_token.append(len(tokens))) or detokenize(tokens, *args, **kwargs)
    )
    messages = chat("Tell Sam I will be ten minutes late.")
    reply = reply_of(fresh.create_chat_completion(messages, **GREEDY))
    assert fresh.last_restore.restored_tokens == warmed.token_count
    assert (reply, context_of(fresh.llm)) == cold_runs(messages)
    # The prompt, once: the template probes that find the system part render text and stop before
    # tokenizing it, and the restored tokens already reach its last checkpoint. llama.cpp decoded
    # them in one call, and Gemma's text came back as it was: no decoding token by token.
    assert len(seen) == 1
    assert decoded_by_token == []

    # A system part not stored yet is tokenized once more, to put a checkpoint at its end.
    seen.clear()
    fresh.llm.reset()
    # Longer by more than a checkpoint's worth (`min_tokens`) on any grid.
    signed = SYSTEM + " Sign every message with your first name, keep each one under five short lines," * 3
    longer = chat_with(signed, "Tell Sam I will be ten minutes late.")
    fresh.create_chat_completion(longer, **GREEDY)
    assert len(seen) == 2
    later = cached()
    later.create_chat_completion(chat_with(signed, "Any news from the office about today?"), **GREEDY)
    assert later.last_restore.restored_tokens > warmed.token_count  # the new system part's checkpoint


def test_decoding_at_once_gives_what_detokenize_gives_token_by_token(make_llama, gemma_model_path):
    from snapcache.key import as_token_array
    from snapcache.llama.templates.chat_prefix import _decode_at_once

    llm = make_llama(gemma_model_path, n_ctx=N_CTX)
    rendered = f"<start_of_turn>user\n{SYSTEM}\n\n¿Qué tal? 1 + 1 = ?<end_of_turn>\n<start_of_turn>model\n"
    tokens = as_token_array(llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True))
    assert len(tokens) > 600
    at_once = _decode_at_once(llm, tokens)
    assert at_once == llm.detokenize(tokens.tolist(), special=True)
    assert at_once == rendered.encode("utf-8")
