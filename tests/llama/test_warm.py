"""CachedLlama.warm on the tiny llama model: what it stores, and how later completions find it."""

from __future__ import annotations

import pytest
from chat_support import DOCUMENT, GREEDY, N_CTX, SYSTEM, chat, chat_reply, cold_chat, context_of
from llama_cpp import llama_chat_format

from snapcache.errors import InvalidArgument
from snapcache.llama.hook.cached import CachedLlama

pytestmark = pytest.mark.model


def test_warm_then_chat_hits_the_warmed_prefix(cached, make_llama, tiny_model_path):
    warmer = cached()
    warmed = warmer.warm(SYSTEM, priority=5)
    assert warmer.alignment == 1  # f32 weights: any split point reads as a cold read does
    assert warmed.token_count % warmer.alignment == 0
    assert not warmed.from_cache

    messages = chat(SYSTEM, "Open the budget spreadsheet.")
    fresh = cached()
    reply = chat_reply(fresh.create_chat_completion(messages, **GREEDY))

    assert fresh.last_restore is not None
    assert (fresh.last_restore.restored_tokens, fresh.last_restore.source) == (warmed.token_count, "ram")
    assert (reply, context_of(fresh.llm)) == cold_chat(make_llama, tiny_model_path, messages)

    # The Llama that warmed still holds the prefix: it reads on from its own context.
    warmer.create_chat_completion(chat(SYSTEM, "Any new mail?"), **GREEDY)
    assert warmer.last_restore is not None
    assert (warmer.last_restore.restored_tokens, warmer.last_restore.source) == (
        warmed.token_count,
        "context",
    )


def test_warm_twice_comes_from_the_store_and_updates_priority(cached, store):
    first = cached().warm(SYSTEM, priority=1)
    again = cached().warm(SYSTEM, priority=7)

    assert again.from_cache
    assert not first.from_cache
    assert (again.key, again.token_count, again.state_bytes) == (
        first.key,
        first.token_count,
        first.state_bytes,
    )
    assert store.get(first.key).priority == 7


def test_warm_tokens_and_raw_text_are_cached_as_they_are(cached):
    warm = cached()
    tokens = warm.llm.tokenize(DOCUMENT.encode())
    assert warm.warm(tokens[:100]).token_count == 100
    raw = warm.warm(DOCUMENT, raw=True)
    assert raw.token_count == len(tokens)  # BOS plus the text, no end-of-sequence token
    with pytest.raises(InvalidArgument):
        warm.warm([])


def test_warm_progress_counts_up_to_the_total(make_llama, tiny_model_path, store):
    warm = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX, n_batch=64), store)
    calls: list[tuple[int, int]] = []
    result = warm.warm(DOCUMENT, raw=True, progress=lambda done, total: calls.append((done, total)))

    done = [d for d, _ in calls]
    assert len(calls) > 3
    assert done == sorted(set(done))
    assert {t for _, t in calls} == {result.token_count}
    assert calls[-1] == (result.token_count, result.token_count)


def test_warm_into_a_context_too_small_is_refused(make_llama, tiny_model_path, store):
    small = CachedLlama(make_llama(tiny_model_path, n_ctx=256), store)
    with pytest.raises(InvalidArgument, match=r"tokens.*256"):
        small.warm(DOCUMENT, raw=True)


def test_chat_aware_warm_is_what_every_chat_with_the_system_prompt_starts_with(cached):
    warm = cached()
    result = warm.warm(SYSTEM)
    stored = warm.store.get(result.key)
    assert stored is not None
    for question in ("Hi", " spaced", "\nnewline first", "12345"):
        fresh = cached(save=False)
        fresh.create_chat_completion(chat(SYSTEM, question), **GREEDY)
        assert fresh.last_restore is not None
        assert fresh.last_restore.restored_tokens == result.token_count
        assert context_of(fresh.llm)[: result.token_count] == stored.tokens.tolist()


def test_warm_rejects_bytes_and_bad_priority(cached):
    warm = cached()
    with pytest.raises(InvalidArgument):
        warm.warm(b"bytes are not a prompt")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        warm.warm(SYSTEM, priority=10**9)


def test_warm_of_a_short_system_prompt_says_it_is_too_short(cached, store):
    with pytest.raises(InvalidArgument, match="too short") as raised:
        cached().warm("Be brief.")
    assert "raw=True" not in str(raised.value)  # the chat format renders it; the advice would be wrong
    assert store.entries() == []


def test_the_chat_template_probes_render_text_without_tokenizing_it(cached, make_llama, tiny_model_path):
    warmed = cached().warm(SYSTEM)
    fresh = cached()
    llm = fresh.llm
    long_texts: list[int] = []
    tokenize = llm.tokenize

    def counting(text: bytes, *args: object, **kwargs: object) -> list[int]:
        if len(text) >= len(SYSTEM):
            long_texts.append(len(text))
        return tokenize(text, *args, **kwargs)  # type: ignore[arg-type]

    llm.tokenize = counting  # type: ignore[method-assign]
    messages = chat(SYSTEM, "Open the budget spreadsheet.")
    reply = chat_reply(fresh.create_chat_completion(messages, **GREEDY))
    assert fresh.last_restore is not None
    assert fresh.last_restore.restored_tokens == warmed.token_count
    assert (reply, context_of(llm)) == cold_chat(make_llama, tiny_model_path, messages)
    # The prompt, and the system part once (the tiny model's byte tokens do not decode back to the
    # text, so whether the restore reached its end is not known without them): not four probes.
    assert len(long_texts) == 2


def test_a_chat_handler_that_tokenizes_something_else_first_still_warms_its_system_part(cached):
    plain = cached().warm(SYSTEM)
    other = cached(scope="other")
    llm = other.llm
    chat_format = str(llm.chat_format)
    handler = (
        llm.chat_handler
        or llm._chat_handlers.get(chat_format)
        or llama_chat_format.get_chat_completion_handler(chat_format)
    )

    def with_a_stop_word(*, llama, messages, **kwargs):
        llama.tokenize(b"</s>", add_bos=False, special=True)  # a stop criterion, say
        return handler(llama=llama, messages=messages, **kwargs)

    llm.chat_handler = with_a_stop_word
    assert other.warm(SYSTEM).token_count == plain.token_count


def test_a_chat_handler_that_hands_over_text_warms_the_tokens_create_completion_reads(cached):
    from snapcache.key import as_token_array
    from snapcache.llama.templates.chat_prefix import text_prompt_tokens

    warmer = cached(scope="text")
    llm = warmer.llm

    def text_handler(*, llama, messages, **kwargs):
        text = "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages)
        return llama.create_completion(prompt=text, **kwargs)

    llm.chat_handler = text_handler
    warmed = warmer.warm(SYSTEM)
    whole = text_prompt_tokens(llm, f"<system>\n{SYSTEM}\n<user>\nHello.\n", add_eos=True)
    assert warmed.token_count >= len(text_prompt_tokens(llm, f"<system>\n{SYSTEM}\n", add_eos=False)) - 2
    # The warmed tokens are the start of what create_completion reads for a chat with this system part.
    assert warmed.key.matches(as_token_array(whole[: warmed.token_count]))
