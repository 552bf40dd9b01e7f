"""BatchedLlama on the tiny model: llama-cpp-python's completion and chat responses, from the scheduler."""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from test_scheduler import N_CTX, SYSTEM

from snapcache.llama.batch import BatchedLlama, Scheduler
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 24}
PROMPT = "Question: where does the quick brown fox go? Answer:"


@pytest.fixture
def llm(make_llama: Any, tiny_model_path: Path) -> llama_cpp.Llama:
    return make_llama(tiny_model_path, n_ctx=N_CTX)


@pytest.fixture
def reference(make_llama: Any, tiny_model_path: Path) -> llama_cpp.Llama:
    """Another Llama of the same model: the single-sequence answers."""
    return make_llama(tiny_model_path, n_ctx=N_CTX)


@pytest.fixture
def batched(llm: llama_cpp.Llama, store: SnapshotStore) -> Iterator[BatchedLlama]:
    with Scheduler(llm, store, n_seq=4, mode="exact") as scheduler:
        yield BatchedLlama(scheduler)


def text(result: dict[str, Any]) -> str:
    return str(result["choices"][0]["text"])


def test_a_completion_is_the_llamas(batched: BatchedLlama, reference: llama_cpp.Llama) -> None:
    got = batched.create_completion(PROMPT, **GREEDY)
    expected = reference.create_completion(PROMPT, **GREEDY)
    assert text(got) == text(expected)
    assert got["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"]
    assert got["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    assert got["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    assert got["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert got["object"] == "text_completion"


@pytest.mark.parametrize("special", [False, True], ids=["text", "special tokens kept"])
def test_a_long_drawn_completion_is_the_llamas_text(
    batched: BatchedLlama, reference: llama_cpp.Llama, special: bool
) -> None:
    """Drawn tokens of the tiny model's byte vocabulary: characters split over tokens, bytes that are
    no UTF-8, special tokens; the text made a piece a token is the text of all tokens at once."""
    kwargs: dict[str, Any] = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 11}
    kwargs["max_tokens"] = 120
    # The Llama's completion text keeps special tokens where its detokenize is told to.
    reference.detokenize = functools.partial(type(reference).detokenize, reference, special=special)  # type: ignore[method-assign]
    got = batched.create_completion(PROMPT, special_text=special, **kwargs)
    expected = reference.create_completion(PROMPT, **kwargs)
    assert got["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"] > 60
    assert text(got) == text(expected)
    streamed = list(batched.create_completion(PROMPT, stream=True, special_text=special, **kwargs))
    assert "".join(c["choices"][0]["text"] for c in streamed) == text(expected)


def test_a_stop_string_cuts_the_text_as_the_llama_does(
    batched: BatchedLlama, reference: llama_cpp.Llama
) -> None:
    full = text(reference.create_completion(PROMPT, **GREEDY))
    for i in range(3, len(full)):  # a stop string the Llama stops at, with text before it
        kwargs = {**GREEDY, "stop": ["no such text", full[i : i + 2]]}
        expected = reference.create_completion(PROMPT, **kwargs)
        if expected["choices"][0]["finish_reason"] == "stop" and text(expected):
            break
    else:
        pytest.fail("no stop string found in the reference text")
    got = batched.create_completion(PROMPT, **kwargs)
    assert text(got) == text(expected)
    assert got["choices"][0]["finish_reason"] == "stop"
    streamed = list(batched.create_completion(PROMPT, stream=True, **kwargs))
    assert "".join(c["choices"][0]["text"] for c in streamed) == text(expected)
    assert streamed[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_stream_gives_the_same_text(batched: BatchedLlama) -> None:
    whole = text(batched.create_completion(PROMPT, **GREEDY))
    chunks = list(batched.create_completion(PROMPT, stream=True, **GREEDY))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_a_chat_is_rendered_by_the_llamas_handler(batched: BatchedLlama, reference: llama_cpp.Llama) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there."}]
    got = batched.create_chat_completion(messages, **GREEDY)
    expected = reference.create_chat_completion(messages=messages, **GREEDY)
    assert got["choices"][0]["message"] == expected["choices"][0]["message"]
    assert got["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    assert got["object"] == "chat.completion"


def test_a_chat_saves_the_end_of_its_system_messages(
    batched: BatchedLlama, reference: llama_cpp.Llama
) -> None:
    def ask(question: str) -> dict[str, Any]:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return dict(batched.create_chat_completion(messages, **GREEDY))

    ask("First question?")
    second = ask("Something else entirely.")
    system_tokens = len(reference.tokenize(SYSTEM.encode()))
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= system_tokens - 8


def test_max_completion_tokens_caps_a_chat(batched: BatchedLlama, reference: llama_cpp.Llama) -> None:
    messages = [{"role": "user", "content": "Tell me a long story."}]
    result = batched.create_chat_completion(messages, temperature=0.0, max_completion_tokens=3)
    expected = reference.create_chat_completion(messages=messages, temperature=0.0, max_tokens=3)
    # The Llama reads on past max_tokens to finish a UTF-8 character (random bytes here), as it does.
    assert result["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    assert 3 <= result["usage"]["completion_tokens"] <= 6
    assert result["choices"][0] == expected["choices"][0]


def test_a_closed_stream_frees_its_sequence(batched: BatchedLlama) -> None:
    stream = batched.create_completion(PROMPT, stream=True, temperature=0.0, max_tokens=1000)
    next(stream)
    stream.close()
    scheduler = batched.scheduler
    follow = scheduler.submit([1, 2, 3], None)
    follow.result(30)
    assert scheduler.pending() == (0, 0)


# A JSON object with one short ASCII field: a tool call's arguments, as a grammar constrains them.
CALL_GRAMMAR = llama_cpp.LlamaGrammar.from_string(
    r'''root ::= "{\"path\": \"" [a-z./]{1,12} "\"}"''', verbose=False
)


def test_a_grammar_request_is_batched_and_answers_as_the_llama(
    batched: BatchedLlama, reference: llama_cpp.Llama, caplog: pytest.LogCaptureFixture
) -> None:
    options: dict[str, Any] = {"temperature": 0.0, "max_tokens": 40}
    grammar = llama_cpp.LlamaGrammar.from_string('root ::= "yes" | "no"', verbose=False)
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        got = batched.create_completion(PROMPT, grammar=grammar, **options)
        call = batched.create_completion(PROMPT, grammar=CALL_GRAMMAR, **options)
    assert "not supported by the batched path" not in caplog.text
    assert text(got) in ("yes", "no")
    assert text(got) == text(reference.create_completion(PROMPT, grammar=grammar, **options))
    assert text(call) == text(reference.create_completion(PROMPT, grammar=CALL_GRAMMAR, **options))
    assert json.loads(text(call)).keys() == {"path"}


def test_a_burst_of_grammar_requests_shares_its_decode_steps(
    llm: llama_cpp.Llama, store: SnapshotStore
) -> None:
    """Four tool-call requests at once on a batched scheduler step together (the scheduler's own
    record of its decodes), and each answer holds to its grammar."""
    from test_scheduler import _recorded

    prompts = [f"Question {i}: which file holds the fox? Answer:" for i in range(4)]
    options: dict[str, Any] = {"temperature": 0.0, "max_tokens": 30, "grammar": CALL_GRAMMAR}
    results: list[str] = [""] * 4
    with Scheduler(llm, store, n_seq=4) as scheduler:
        model = BatchedLlama(scheduler)
        events = _recorded(scheduler)

        def ask(i: int) -> None:
            results[i] = text(model.create_completion(prompts[i], **options))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    for got in results:
        assert json.loads(got).keys() == {"path"}
    widest = max(len(seqs) for kind, seqs in events if kind == "step")
    assert widest == 4, events


class Recorder:
    """A CompletionListener that keeps what it hears, and the thread it heard it on."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any, str]] = []

    def restored(self, scope: str, info: Any) -> None:
        self.heard.append(("restored", info, threading.current_thread().name))

    def finished(self, report: Any) -> None:
        self.heard.append(("finished", report, threading.current_thread().name))


def test_the_listener_hears_each_completion_on_the_readers_thread(llm: llama_cpp.Llama) -> None:
    recorder = Recorder()
    with Scheduler(llm, None, n_seq=2) as scheduler:
        batched = BatchedLlama(scheduler, scope=lambda: "agent-x", listener=recorder)
        result = batched.create_completion(PROMPT, **GREEDY)
    kinds = [kind for kind, _, _ in recorder.heard]
    assert kinds == ["restored", "finished"]
    assert {thread for _, _, thread in recorder.heard} == {threading.current_thread().name}
    report = recorder.heard[1][1]
    assert report.scope == "agent-x"
    assert report.completion_tokens == result["usage"]["completion_tokens"]
    assert report.restore.prompt_tokens == result["usage"]["prompt_tokens"]


def test_a_request_longer_than_a_sequence_holds_runs_on_the_llamas_own_context(
    llm: llama_cpp.Llama, reference: llama_cpp.Llama, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    """With `seq_ctx` below the Llama's context, a request that may need more takes the single path
    (logged once) and answers as the Llama does; one that fits goes to the scheduler."""
    long_prompt = SYSTEM * 2 + PROMPT  # the tiny model reads a token per byte: about 570 tokens
    with Scheduler(llm, store, n_seq=2, seq_ctx=256) as scheduler:
        assert scheduler.n_ctx == 256
        batched = BatchedLlama(scheduler)
        with caplog.at_level(logging.WARNING, logger="snapcache"):
            got = batched.create_completion(long_prompt, **GREEDY)
        assert text(got) == text(reference.create_completion(long_prompt, **GREEDY))
        assert batched.last_request("default") is None
        assert "more than the 256 tokens a sequence holds" in caplog.text
        short = batched.create_completion(PROMPT, **GREEDY)
        assert text(short) == text(reference.create_completion(PROMPT, **GREEDY))
        assert batched.last_request("default") is not None
        # No max_tokens: up to the context's end, which only the Llama's own context can give.
        assert batched._too_long(len(PROMPT), None) is not None
