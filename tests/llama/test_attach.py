"""`snapcache.attach`: a plain Llama restores and saves through the store on its own completion paths."""

from __future__ import annotations

import logging

import pytest
from chat_support import GREEDY, N_CTX, SYSTEM, chat, chat_reply, cold_chat, context_of
from llama_cpp import llama_chat_format

import snapcache
from snapcache import InvalidArgument
from snapcache.llama.hook.cached import attached_hook

pytestmark = pytest.mark.model


def test_an_attached_llama_restores_in_a_new_llama_and_answers_as_cold(
    make_llama, tiny_model_path, store
) -> None:
    writer = make_llama(tiny_model_path, n_ctx=N_CTX)
    snapcache.attach(writer, store, scope="agent")
    writer.create_chat_completion(messages=chat(SYSTEM, "Hello there."), **GREEDY)

    reader = make_llama(tiny_model_path, n_ctx=N_CTX)
    hook = snapcache.attach(reader, store, scope="agent")
    question = chat(SYSTEM, "What can you do?")
    reply = chat_reply(reader.create_chat_completion(messages=question, **GREEDY))
    info = hook.last_restore
    assert info is not None
    assert info.source == "ram"
    assert info.restored_tokens >= 64
    assert (reply, context_of(reader)) == cold_chat(make_llama, tiny_model_path, question)


def test_every_completion_path_goes_through_the_hook(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    hook = snapcache.attach(llm, store)

    def restore_of(text: str, before: object):
        """The hook's report of the completion of `text`: a new one, for a prompt of its length."""
        info = hook.last_restore
        assert info is not None
        assert info is not before
        assert info.prompt_tokens == len(llm.tokenize(text.encode()))
        return info

    prompt = SYSTEM + "Question: what is this?"
    llm(prompt, **GREEDY)  # __call__
    first = restore_of(prompt, None)
    llm.create_completion(prompt + " Answer", **GREEDY)
    answer = restore_of(prompt + " Answer", first)
    assert answer.restored_tokens > 0
    streamed = "".join(chunk["choices"][0]["text"] for chunk in llm(prompt + " Why?", stream=True, **GREEDY))
    assert streamed
    assert restore_of(prompt + " Why?", answer).restored_tokens > 0
    result = llm.create_chat_completion(messages=chat(SYSTEM, "Hi."), **GREEDY)
    assert hook.last_restore is not None
    assert result["usage"]["prompt_tokens"] == hook.last_restore.prompt_tokens
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == hook.last_restore.cached_tokens


def test_detach_gives_the_llama_back(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    handler_before = llm.chat_handler
    hook = snapcache.attach(llm, store)
    assert attached_hook(llm) is hook
    assert snapcache.detach(llm) is True
    assert attached_hook(llm) is None
    assert "create_completion" not in vars(llm)
    assert llm.chat_handler is handler_before
    assert snapcache.detach(llm) is False
    llm.create_chat_completion(messages=chat(SYSTEM, "Hello."), **GREEDY)
    assert hook.last_restore is None
    assert store.entries(blocks=True) == []  # neither a record nor a block was written


def test_one_store_per_llama(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    snapcache.attach(llm, store, scope="a")
    with pytest.raises(InvalidArgument, match="already attached"):
        snapcache.attach(llm, store, scope="b")
    wrapper = snapcache.CachedLlama(llm, store, scope="b")
    with pytest.raises(InvalidArgument, match="already attached"):
        wrapper.create_completion("Hello", max_tokens=1)
    with pytest.raises(InvalidArgument, match=r"must be a llama_cpp\.Llama"):
        snapcache.attach("not a model", store)  # type: ignore[arg-type]


def test_a_scope_function_picks_each_completions_scope(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    current = {"scope": "agent-a"}
    hook = snapcache.attach(llm, store, scope=lambda: current["scope"])
    llm.create_chat_completion(messages=chat(SYSTEM, "Hello."), **GREEDY)
    current["scope"] = "agent-b"
    llm.create_chat_completion(messages=chat(SYSTEM, "What now?"), **GREEDY)
    assert hook.last_restore is not None
    assert hook.last_restore.restored_tokens == 0  # neither agent-a's snapshots nor its context
    saved = store.entries(blocks=True)
    assert {entry.key.user_scope for entry in saved if not entry.key.is_block} == {"agent-a", "agent-b"}
    assert {entry.key.user_scope for entry in saved if entry.key.is_block} == {"agent-a", "agent-b"}


class _TextOnlyLlava(llama_chat_format.Llava15ChatHandler):
    """A multimodal handler without a vision model: it renders text as the llama-2 format does."""

    def __init__(self) -> None:  # no CLIP model to load
        pass

    def __call__(self, **kwargs):
        return llama_chat_format.get_chat_completion_handler("llama-2")(**kwargs)


def test_multimodal_chat_handlers_pass_through_uncached(make_llama, tiny_model_path, store, caplog) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX, chat_handler=_TextOnlyLlava())
    hook = snapcache.attach(llm, store)
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        for question in ("Hello.", "And now?"):
            reply = llm.create_chat_completion(messages=chat(SYSTEM, question), **GREEDY)
            assert reply["usage"]["completion_tokens"] > 0
    assert hook.last_restore is None
    assert store.entries(blocks=True) == []  # neither a record nor a block was written
    assert caplog.text.count("_TextOnlyLlava evaluates images itself") == 1  # one reason, logged once
    llm.create_completion(SYSTEM + "Plain text is still cached.", **GREEDY)
    saved = store.entries(blocks=True)
    assert any(row.key.is_block for row in saved)
    assert any(not row.key.is_block for row in saved)


def test_embedding_llamas_are_refused(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, embedding=True)
    with pytest.raises(InvalidArgument, match="embedding=True"):
        snapcache.attach(llm, store)
