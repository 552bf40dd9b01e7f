"""CachedLlama on the tiny llama model: restored completions are token for token the cold ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chat_support import (
    DOCUMENT,
    GREEDY,
    N_CTX,
    SYSTEM,
    chat,
    chat_reply,
    cold_chat,
    common_prefix,
    context_of,
)

from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey, as_token_array
from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.stored.checkpoints import CHECKPOINT_ALIGN, final_point, ladder_points
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model


def cold_completion(make_llama, model_path, prompt) -> tuple[str, list[int]]:
    llm = make_llama(model_path, n_ctx=N_CTX)
    text = llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    return text, context_of(llm)


def test_restore_then_suffix_matches_cold(cached, make_llama, tiny_model_path):
    warmed = cached().warm(DOCUMENT, raw=True)
    prompt = DOCUMENT + "Question: what does the fox do?\nAnswer:"

    warm = cached()
    started = time.perf_counter()
    text = warm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    whole_call = time.perf_counter() - started

    info = warm.last_restore
    assert info is not None
    assert (info.restored_tokens, info.source) == (warmed.token_count, "ram")
    assert info.evaluated_tokens == info.prompt_tokens - warmed.token_count
    assert 0 < info.restore_seconds < whole_call
    assert (text, context_of(warm.llm)) == cold_completion(make_llama, tiny_model_path, prompt)


def test_prompt_exactly_as_long_as_snapshot(cached, make_llama, tiny_model_path):
    tokens = cached().llm.tokenize(DOCUMENT.encode())
    assert cached().warm(tokens).token_count == len(tokens)

    warm = cached()
    text = warm.create_completion(tokens, **GREEDY)["choices"][0]["text"]

    info = warm.last_restore
    assert info is not None
    assert (info.restored_tokens, info.evaluated_tokens) == (len(tokens), 1)
    assert (text, context_of(warm.llm)) == cold_completion(make_llama, tiny_model_path, tokens)


def test_multi_turn_chat_restores_the_earlier_turns(cached, make_llama, tiny_model_path):
    first = cached()
    turn1 = chat(SYSTEM, "List my files.")
    reply1 = chat_reply(first.create_chat_completion(turn1, **GREEDY))
    assert first.last_restore is not None
    turn1_prompt = first.last_restore.prompt_tokens

    turn2 = chat(SYSTEM, "List my files.", reply1, "Now sort them by size.")
    second = cached()  # another Llama: nothing in its context, everything from the store
    reply2 = chat_reply(second.create_chat_completion(turn2, **GREEDY))

    info = second.last_restore
    assert info is not None
    assert info.source == "ram"
    assert info.restored_tokens >= turn1_prompt - CHECKPOINT_ALIGN
    assert (reply2, context_of(second.llm)) == cold_chat(make_llama, tiny_model_path, turn2)


def test_stream_gives_the_same_tokens_and_saves_when_exhausted(cached, make_llama, tiny_model_path, store):
    messages = chat(SYSTEM, "What is on my desktop?")
    warm = cached()
    # Long enough a reply that the state after it spares more than min_tokens over the prompt's.
    chunks = list(warm.create_chat_completion(messages, stream=True, temperature=0.0, max_tokens=64))
    streamed = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)

    cold = make_llama(tiny_model_path, n_ctx=N_CTX)
    reply = chat_reply(cold.create_chat_completion(messages=messages, temperature=0.0, max_tokens=64))
    assert len(context_of(warm.llm)) - warm.last_restore.prompt_tokens > 32
    assert (streamed, context_of(warm.llm)) == (reply, context_of(cold))
    # The prompt's end is stored; the reply, read one token at a time, is not what a cold read of it
    # computes and is never stored.
    held = as_token_array(context_of(warm.llm))
    found = store.lookup(warm.fingerprint, warm.scope, held)
    assert found is not None
    assert found.key.token_count == final_point(warm.last_restore.prompt_tokens, warm.alignment)


def test_stream_closed_early_saves_what_it_read(cached, store):
    warm = cached()
    stream = warm.create_completion(DOCUMENT, stream=True, temperature=0.0, max_tokens=200)
    for _, _chunk in zip(range(40), stream, strict=False):
        pass
    stream.close()

    held = as_token_array(context_of(warm.llm))
    assert len(held) > warm.last_restore.prompt_tokens
    found = store.lookup(warm.fingerprint, warm.scope, held)
    assert found is not None
    assert found.key.token_count == final_point(warm.last_restore.prompt_tokens, warm.alignment)


def test_new_chat_question_reuses_the_shared_prefix_without_warm(cached, make_llama, tiny_model_path):
    first = cached()
    first.create_chat_completion(chat(SYSTEM, "Where are my invoices?"), **GREEDY)
    prompt1 = context_of(first.llm)[: first.last_restore.prompt_tokens]

    messages = chat(SYSTEM, "Tell Sam I will be late.")
    second = cached()
    reply = chat_reply(second.create_chat_completion(messages, **GREEDY))
    prompt2 = context_of(second.llm)[: second.last_restore.prompt_tokens]

    shared = common_prefix(prompt1, prompt2)
    assert shared > 300
    assert second.last_restore.restored_tokens >= 0.9 * shared
    assert (reply, context_of(second.llm)) == cold_chat(make_llama, tiny_model_path, messages)


def test_new_raw_question_reuses_the_shared_prefix_without_warm(cached, make_llama, tiny_model_path):
    first = cached()
    first.create_completion(DOCUMENT + "Question: what colour is the fox?\nAnswer:", **GREEDY)
    prompt1 = context_of(first.llm)[: first.last_restore.prompt_tokens]

    prompt = DOCUMENT + "Question: where is the dog?\nAnswer:"
    second = cached()
    text = second.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    prompt2 = context_of(second.llm)[: second.last_restore.prompt_tokens]

    shared = common_prefix(prompt1, prompt2)
    assert shared >= 640  # from here on the ladder promises 90%
    assert second.last_restore.restored_tokens >= 0.9 * shared
    assert (text, context_of(second.llm)) == cold_completion(make_llama, tiny_model_path, prompt)


def test_a_context_too_small_is_a_miss_and_no_crash(cached, make_llama, tiny_model_path, store):
    big = cached()
    big.create_completion(DOCUMENT + "Question: why?\nAnswer:", **GREEDY)
    assert len(store.entries()) > 0

    small = CachedLlama(make_llama(tiny_model_path, n_ctx=256), store)
    with pytest.raises(ValueError, match="exceed context window"):
        small.create_completion(DOCUMENT + "Question: why?\nAnswer:", **GREEDY)
    assert small.last_restore is None
    # The small Llama still works, and a prompt that fits is served.
    text = small.create_completion(DOCUMENT[:100], **GREEDY)["choices"][0]["text"]
    assert small.last_restore is not None
    assert small.last_restore.restored_tokens >= 64
    assert (text, context_of(small.llm)) == cold_completion(make_llama, tiny_model_path, DOCUMENT[:100])


def test_another_fingerprint_never_hits(cached, make_llama, tiny_model_path_other_seed, store):
    donor = cached()
    donor.warm(SYSTEM)
    donor.create_completion(DOCUMENT, **GREEDY)

    other = CachedLlama(make_llama(tiny_model_path_other_seed, n_ctx=N_CTX), store)
    assert other.fingerprint != donor.fingerprint
    other.create_chat_completion(chat(SYSTEM, "Hello"), **GREEDY)
    assert other.last_restore is not None
    assert (other.last_restore.restored_tokens, other.last_restore.source) == (0, None)


def test_another_scope_never_hits(cached):
    cached("agent-a").warm(SYSTEM)
    other = cached("agent-b")
    other.create_chat_completion(chat(SYSTEM, "Hello"), **GREEDY)
    assert other.last_restore is not None
    assert other.last_restore.source is None


def test_save_false_only_restores(cached, store):
    reader = cached(save=False)
    reader.create_completion(DOCUMENT, **GREEDY)
    reader.create_chat_completion(chat(SYSTEM, "Hello"), **GREEDY)
    assert reader.last_restore is not None  # the hook ran, and restored what it could
    assert store.entries(blocks=True) == []  # neither a record nor a block was written


def test_new_process_restores_from_the_disk_store(tmp_path, tiny_model_path):
    """A second process with a new Llama restores the first one's warmed prefix from disk."""
    script = textwrap.dedent(
        """
        import json, sys
        from llama_cpp import Llama
        from snapcache.store import SnapshotStore
        from snapcache.llama.hook.cached import CachedLlama

        model, cache, step, system = sys.argv[1:5]
        llm = Llama(model_path=model, n_ctx=2048, n_threads=2, verbose=False)
        with SnapshotStore(cache) as store:
            cached = CachedLlama(llm, store)
            if step == "warm":
                print(json.dumps({"tokens": cached.warm(system).token_count}))
            else:
                messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
                reply = cached.create_chat_completion(messages, temperature=0.0, max_tokens=16)
                info = cached.last_restore
                print(json.dumps({"restored": info.restored_tokens, "source": info.source,
                                  "reply": reply["choices"][0]["message"]["content"]}))
        """
    )
    root = Path(__file__).resolve().parents[2]
    env_path = str(root)

    def run(step: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", script, str(tiny_model_path), str(tmp_path / "cache"), step, SYSTEM],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": env_path},
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    warmed = run("warm")
    answered = run("answer")
    assert (answered["restored"], answered["source"]) == (warmed["tokens"], "disk")


def test_checkpoint_ladder_keeps_its_promise():
    points = ladder_points(CHECKPOINT_ALIGN, 0.9, 8192)
    assert all(p % CHECKPOINT_ALIGN == 0 for p in points)
    for shared in range(CHECKPOINT_ALIGN, 8192):
        best = max(p for p in points if p <= shared)
        assert best >= 0.9 * shared or best > shared - CHECKPOINT_ALIGN
        if shared >= 640:
            assert best >= 0.9 * shared
    assert len([p for p in points if p < 2000]) == 24


def test_fingerprint_scope_and_store_are_exposed(cached, store):
    warm = cached("agent-x")
    assert warm.fingerprint == model_fingerprint(warm.llm)
    assert (warm.scope, warm.store) == ("agent-x", store)
    assert isinstance(store, SnapshotStore)
    with pytest.raises(InvalidArgument):
        CachedLlama(warm.llm, store, scope="")
    with pytest.raises(InvalidArgument):
        CachedLlama(warm.llm, store, prefix_reuse=1.5)


def test_restored_tokens_are_a_prefix_of_the_prompt(cached):
    """What last_restore reports is what the store holds: the warmed tokens start the prompt."""
    warmer = cached()
    result = warmer.warm(SYSTEM)
    snapshot = warmer.store.get(result.key)
    fresh = cached()
    fresh.create_chat_completion(chat(SYSTEM, "Hi"), **GREEDY)
    prompt = as_token_array(context_of(fresh.llm)[: fresh.last_restore.prompt_tokens])
    assert np.array_equal(prompt[: result.token_count], snapshot.tokens)


def test_a_snapshot_refused_before_loading_keeps_the_live_context(cached, make_llama, tiny_model_path, store):
    """A stored state that fails the checks made before llama.cpp sees it leaves the context as it was:
    the completion reads on from the context's own prefix, and every state saved is keyed right."""
    llama = cached()
    llama.create_completion(DOCUMENT + "Question: what does the fox do?\nAnswer:", **GREEDY)
    first_context = context_of(llama.llm)
    second = DOCUMENT + "Question: where is the river?\nAnswer:"
    tokens = llama.llm.tokenize(second.encode())
    live = common_prefix(first_context, tokens)
    bogus = tokens[:-2]  # longer than what the context shares with the prompt: the lookup picks it
    assert live < len(bogus)
    store.put(SnapshotKey.for_tokens(llama.fingerprint, llama.scope, bogus), bogus, b"\x00" * 4096)

    text = llama.create_completion(second, **GREEDY)["choices"][0]["text"]

    assert llama.last_restore is not None
    assert (llama.last_restore.restored_tokens, llama.last_restore.source) == (live, "context")
    second_context = context_of(llama.llm)
    assert (text, second_context) == cold_completion(make_llama, tiny_model_path, second)
    for entry in store.entries():
        stored = store.get(entry.key).tokens.tolist()
        assert stored in (first_context[: len(stored)], second_context[: len(stored)])


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_context_restored_past_its_window_is_not_cut_back_into_it(make_llama, gemma_model_path, store):
    """A restored Gemma state has real window cells only for its last token; a prompt that leaves it
    earlier than that is read from the start, as a cold run reads it."""
    text = "".join(
        f"Note {i}: the meeting about topic {i} moved to room {i % 7 + 1}.\n" for i in range(1, 40)
    )
    warmer = CachedLlama(make_llama(gemma_model_path, n_ctx=N_CTX), store, prefix_reuse=None)
    warmed = warmer.warm(text, raw=True)
    assert warmed.token_count > 600  # past Gemma's 512-token sliding window

    llama = CachedLlama(make_llama(gemma_model_path, n_ctx=N_CTX), store, save=False)
    tokens = store.get(warmed.key).tokens.tolist()
    # 16 tokens or more: a restore leaves at least that many to read (`ReadGrid`).
    question = llama.llm.tokenize(
        b"Question: which room did the meeting about topic twelve move to, and when?\nAnswer:", add_bos=False
    )
    llama.create_completion(tokens + question, **GREEDY)
    assert llama.last_restore is not None
    assert llama.last_restore.source == "ram"

    shorter = tokens[: warmed.token_count - 100] + question
    reply = llama.create_completion(shorter, **GREEDY)["choices"][0]["text"]
    assert llama.last_restore is not None
    assert (llama.last_restore.restored_tokens, llama.last_restore.source) == (0, None)
    assert (reply, context_of(llama.llm)) == cold_completion(make_llama, gemma_model_path, shorter)
