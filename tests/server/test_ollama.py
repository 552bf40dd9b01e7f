"""Ollama's dialect without a model: bodies into chat requests, events into answers."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from snapcache.server.chat.chat_request import Sampling
from snapcache.server.chat.dialects.anthropic.anthropic_protocol import MessagesRequest
from snapcache.server.chat.dialects.ollama import ollama
from snapcache.server.chat.dialects.ollama.ollama_protocol import ChatBody, GenerateBody
from snapcache.server.chat.events import Finished, Started, TextDelta, ToolCalled, Usage
from snapcache.server.error_answers import BadRequest
from snapcache.server.served_model import ServedModel
from snapcache.server.tools import ToolCall

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def chat_body(*messages: dict[str, Any], **fields: Any) -> ChatBody:
    return ChatBody.model_validate({"model": "m", "messages": list(messages), **fields})


def called(*names: str) -> dict[str, Any]:
    calls = [{"function": {"name": name, "arguments": {"city": "Oslo"}}} for name in names]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def test_calls_without_ids_are_named_by_their_place_and_results_find_them() -> None:
    body = chat_body(
        {"role": "user", "content": "Weather and time?"},
        called("get_weather", "get_time"),
        {"role": "tool", "tool_name": "get_time", "content": "noon"},  # by name, out of order
        {"role": "tool", "content": "sunny"},  # by order: the call not answered yet
        called("get_weather"),
        {"role": "tool", "tool_call_id": "call_4_0", "content": "rain"},  # by the id it was given
        tools=[WEATHER, TIME],
    )
    request = ollama.chat_request(body, "s")
    assistant = request.messages[1]
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("call_1_0", "get_weather", '{"city":"Oslo"}'),
        ("call_1_1", "get_time", '{"city":"Oslo"}'),
    ]
    results = [(m.tool_call_id, m.name, m.content) for m in request.messages if m.role == "tool"]
    assert results == [
        ("call_1_1", "get_time", "noon"),
        ("call_1_0", "get_weather", "sunny"),
        ("call_4_0", "get_weather", "rain"),
    ]
    # The same conversation a turn later renders the same ids: its prompt stays a prefix.
    again = ollama.chat_request(
        chat_body(*body.model_dump()["messages"], {"role": "user", "content": "ok"}), "s"
    )
    assert again.messages[: len(request.messages)] == request.messages


@pytest.mark.parametrize(
    "result",
    [
        {"role": "tool", "content": "x"},
        {"role": "tool", "tool_name": "get_time", "content": "x"},
        {"role": "tool", "tool_call_id": "call_kept_elsewhere", "content": "x"},
    ],
    ids=["no call left", "no call of that tool", "an id no call has"],
)
def test_a_result_with_no_call_left_answers_the_last_call_as_ollama_renders_it(
    result: dict[str, Any],
) -> None:
    body = chat_body(
        {"role": "user", "content": "q"}, called("get_weather"), {"role": "tool", "content": "a"}, result
    )
    last = ollama.chat_request(body, "s").messages[-1]
    assert (last.role, last.tool_call_id, last.name) == ("tool", "call_1_0", "get_weather")


def test_a_result_before_any_call_is_a_bad_request() -> None:
    body = chat_body(
        {"role": "user", "content": "q"}, {"role": "tool", "tool_name": "get_time", "content": "x"}
    )
    with pytest.raises(BadRequest, match="answers no call"):
        ollama.chat_request(body, "s")


@pytest.mark.parametrize(
    ("keep_alive", "reason"), [(None, "load"), ("5m", "load"), (0, "unload"), ("0s", "unload")]
)
def test_a_request_without_messages_says_what_it_asked_for(keep_alive: Any, reason: str) -> None:
    body = ChatBody.model_validate({"model": "m", "keep_alive": keep_alive})
    assert ollama.loaded(body)["done_reason"] == reason


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": float("inf")},
        {"presence_penalty": float("nan")},
        {"repeat_penalty": -1},
        {"seed": 1.5},
    ],
    ids=["infinite temperature", "NaN penalty", "negative repeat penalty", "fractional seed"],
)
def test_options_no_sampler_takes_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ChatBody.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "q"}], "options": options}
        )


def test_shown_metadata_keeps_numbers_as_numbers_and_text_as_text() -> None:
    model = ServedModel(
        "m",
        Path("m.gguf"),
        1,
        datetime.now(timezone.utc),
        "f",
        2048,
        268_098_176,
        metadata={
            "general.file_type": "15",
            "llama.rope.freq_base": "10000.0",
            "general.version": "3.10",
            "general.name": "1_000",
            "general.tags": "nan",
            "tokenizer.chat_template": "{{ x }}",
        },
    )
    typed = model.typed_metadata()
    assert typed == {
        "general.file_type": 15,
        "llama.rope.freq_base": 10000.0,
        "general.version": "3.10",
        "general.name": "1_000",
        "general.tags": "nan",
        "general.parameter_count": 268_098_176,
    }
    assert (model.quantization, model.parameter_size, model.chat_template) == ("Q4_K_M", "268.10M", "{{ x }}")


def test_options_become_the_request_s_limits_and_sampling() -> None:
    options = {
        "num_predict": 7,
        "temperature": 0.2,
        "seed": 9,
        "stop": "END",
        "repeat_penalty": 1.1,
        "num_ctx": 99,
    }
    request = ollama.chat_request(chat_body({"role": "user", "content": "q"}, options=options), "s")
    assert request.max_tokens == 7
    assert request.stop == ("END",)
    assert request.sampling == Sampling(temperature=0.2, repeat_penalty=1.1, seed=9)
    assert request.stream  # Ollama's default
    for unlimited in (-1, -2):
        body = chat_body({"role": "user", "content": "q"}, options={"num_predict": unlimited})
        assert ollama.chat_request(body, "s").max_tokens is None  # the server's cap


def test_a_format_holds_the_answer_to_json_but_not_beside_tools() -> None:
    user = {"role": "user", "content": "q"}
    assert ollama.chat_request(chat_body(user, format="json"), "s").response_format == {"type": "json_object"}
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    held = ollama.chat_request(chat_body(user, format=schema), "s").response_format
    assert held == {"type": "json_object", "schema": schema}
    with pytest.raises(BadRequest, match="format"):
        ollama.chat_request(chat_body(user, format="json", tools=[WEATHER]), "s")


def test_generate_is_a_chat_of_its_system_text_and_prompt() -> None:
    body = GenerateBody.model_validate({"model": "m", "system": "Be brief.", "prompt": "Hi", "stream": False})
    request = ollama.generate_request(body, "s")
    assert [(m.role, m.content) for m in request.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert not request.stream


def test_whole_answers_report_ollama_s_counts_and_durations() -> None:
    usage = Usage(prompt_tokens=900, cached_tokens=832, completion_tokens=5)
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    events = [
        Started(usage, elapsed_ns=40),
        TextDelta("Let me look."),
        ToolCalled(call),
        Finished("tool_calls", usage, elapsed_ns=100),
    ]
    answer = ollama.Answer("m", chat=True).of(events)
    assert answer["message"] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Oslo"}}}
        ],
    }
    assert answer["done"] is True
    assert answer["done_reason"] == "stop"
    assert (answer["prompt_eval_count"], answer["eval_count"]) == (68, 5)  # read afresh; generated
    assert (answer["total_duration"], answer["prompt_eval_duration"], answer["eval_duration"]) == (
        100,
        40,
        60,
    )
    generated = ollama.Answer("m", chat=False).of([Started(usage), TextDelta("x"), Finished("length", usage)])
    assert (generated["response"], generated["done_reason"]) == ("x", "length")
    assert "message" not in generated


def test_sampling_reads_only_what_a_request_model_declares() -> None:
    """A field the client sent that its dialect does not declare is never passed to llama.cpp."""
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "q"}],
            "top_k": 3,
            "seed": "x",
        }
    )
    assert Sampling.of(body) == Sampling(top_k=3)
