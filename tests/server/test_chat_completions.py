"""The Chat Completions adapter without a model: a request's translation (tools offered either way,
what holds the answer, the sampling settings) and the answer and chunks of an engine's events (as
many calls as it reports, or one legacy function call)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from snapcache.server.chat.chat_request import NamedTool
from snapcache.server.chat.dialects.chat_completions.chat_completions import (
    CompletionChunks,
    chat_request,
    completion_of,
)
from snapcache.server.chat.dialects.chat_completions.chat_completions_protocol import parsed
from snapcache.server.chat.events import ChatEvent, Finished, Started, TextDelta, ToolCalled, Usage
from snapcache.server.error_answers import BadRequest
from snapcache.server.tools import ToolCall

TOOL = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
USER = {"role": "user", "content": "hi"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "read"}}]}
USAGE = Usage(prompt_tokens=300, cached_tokens=256, completion_tokens=20)
TWO_CALLS: list[ChatEvent] = [
    Started(Usage(300, 256, 0)),
    ToolCalled(ToolCall("call_a", "read", '{"path": "a"}')),
    ToolCalled(ToolCall("call_b", "read", '{"path": "b"}')),
    Finished("tool_calls", USAGE),
]


FUNCTION = {"name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
ONE_CALL: list[ChatEvent] = [
    Started(USAGE),
    ToolCalled(ToolCall("call_a", "read", '{"path": "a"}')),
    Finished("tool_calls", USAGE),
]


def test_legacy_functions_offer_tools_and_win_over_tools() -> None:
    other = {"type": "function", "function": {"name": "write"}}
    body = parsed(
        {"messages": [USER], "functions": [FUNCTION], "function_call": {"name": "read"}, "tools": [other]}
    )
    request = chat_request(body, "s")
    assert [tool.name for tool in request.tools] == ["read"]
    assert request.tool_choice == NamedTool("read")
    assert request.parallel_tool_calls is False  # one function_call in the answer
    assert chat_request(parsed({"messages": [USER], "functions": [FUNCTION]}), "s").tool_choice == "auto"
    none = parsed({"messages": [USER], "functions": [FUNCTION], "function_call": "none"})
    assert not chat_request(none, "s").uses_tools


def test_a_legacy_call_is_answered_as_one_function_call() -> None:
    body = parsed({"messages": [USER], "functions": [FUNCTION]})
    choice = completion_of(ONE_CALL, body)["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "read", "arguments": '{"path": "a"}'},
    }
    streamed = parsed({"messages": [USER], "functions": [FUNCTION], "stream": True})

    async def chunks() -> list[bytes]:
        async def events() -> Any:
            for event in ONE_CALL:
                yield event

        return [chunk async for chunk in CompletionChunks(streamed).events(events())]

    data = [json.loads(chunk.removeprefix(b"data: ")) for chunk in anyio.run(chunks)[:-1]]
    assert [d["choices"][0]["delta"].get("function_call") for d in data[1:3]] == [
        {"name": "read", "arguments": ""},
        {"arguments": '{"path": "a"}'},
    ]
    assert data[-1]["choices"][0]["finish_reason"] == "function_call"


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_object", "schema": FUNCTION["parameters"]},
            {"type": "json_object", "schema": FUNCTION["parameters"]},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": FUNCTION["parameters"]}},
            {"type": "json_object", "schema": FUNCTION["parameters"]},
        ),
    ],
    ids=["text", "json", "json with llama-cpp-python's schema", "openai's json_schema"],
)
def test_a_response_format_is_json_held_to_its_schema(response_format: Any, expected: Any) -> None:
    body = parsed({"messages": [USER], "response_format": response_format})
    assert chat_request(body, "s").response_format == expected


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [TOOL], "grammar": "root ::= [a-z]+"}, "grammar"),
        ({"tools": [TOOL], "response_format": {"type": "json_object"}}, "response_format"),
        ({"grammar": "root ::= [a-z]+", "response_format": {"type": "json_object"}}, "response_format"),
        ({"grammar": "root ::= [a-z]+", "min_tokens": 4}, "min_tokens"),
        ({"functions": [FUNCTION], "function_call": {"name": "read"}, "min_tokens": 4}, "min_tokens"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
            "response_format.json_schema.schema",
        ),
        ({"functions": [FUNCTION], "function_call": {"name": "write"}}, "function_call"),
        ({"n": 2}, "n"),
    ],
    ids=[
        "tools and a grammar",
        "tools and a response format",
        "a grammar and a response format",
        "min_tokens with a grammar",
        "min_tokens with a chosen function",
        "a json_schema without its schema",
        "a function call of no function offered",
        "two choices",
    ],
)
def test_what_the_engine_cannot_serve_is_a_400_naming_its_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as raised:
        chat_request(parsed({"messages": [USER], **extra}), "s")
    assert raised.value.param == param, raised.value


def test_llama_cpp_python_s_sampling_settings_are_taken() -> None:
    body = parsed(
        {
            "messages": [USER],
            "mirostat_mode": 2,
            "mirostat_tau": 4.0,
            "logit_bias": {"15": -100},
            "logit_bias_type": "input_ids",
            "grammar": 'root ::= "yes" | "no"',
            "min_tokens": 0,
            "top_k": 5,
        }
    )
    request = chat_request(body, "s")
    assert request.sampling.settings() == {"mirostat_mode": 2, "mirostat_tau": 4.0, "top_k": 5}
    assert request.sampling.logit_bias == {"15": -100}
    assert request.grammar == 'root ::= "yes" | "no"'


def test_a_request_becomes_one_chat_request() -> None:
    body = parsed(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                USER,
                CALLED,
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"}]},
            ],
            "tools": [TOOL, {"type": "custom", "custom": {"name": "grep"}}],
            "tool_choice": {"type": "function", "function": {"name": "read"}},
            "parallel_tool_calls": False,
            "max_tokens": 9,
            "max_completion_tokens": 12,
            "stop": "END",
            "store": True,
        }
    )
    chat = chat_request(body, "agent")
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.messages[0].content == "Be brief.\n\nUse tools."
    assert chat.messages[2].tool_calls == (ToolCall("c1", "read", "{}"),)
    assert [tool.name for tool in chat.tools] == ["read"]
    assert (chat.tool_choice, chat.parallel_tool_calls, chat.max_tokens) == (NamedTool("read"), False, 12)
    assert (chat.stop, chat.scope) == (("END",), "agent")


def test_no_limit_given_leaves_the_server_s_cap() -> None:
    for limit in ({}, {"max_tokens": 0}, {"max_tokens": None}):
        assert chat_request(parsed({"messages": [USER], "tools": [TOOL], **limit}), "s").max_tokens is None


def test_a_named_choice_must_name_a_function_among_the_tools() -> None:
    body = parsed(
        {"messages": [USER], "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}}
    )
    with pytest.raises(BadRequest, match="no function named 'x'"):
        chat_request(body, "s")


def test_every_call_the_engine_reports_is_in_the_answer() -> None:
    body = parsed({"model": "m", "messages": [USER], "tools": [TOOL]})
    answer = completion_of(TWO_CALLS, body)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [(c["id"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        ("call_a", '{"path": "a"}'),
        ("call_b", '{"path": "b"}'),
    ]
    assert answer["usage"] == {
        "prompt_tokens": 300,
        "completion_tokens": 20,
        "total_tokens": 320,
        "prompt_tokens_details": {"cached_tokens": 256},
    }


def test_a_text_answer_has_its_content_and_no_calls() -> None:
    body = parsed({"messages": [USER], "tools": [TOOL]})
    answer = completion_of([Started(USAGE), TextDelta("Hel"), TextDelta("lo"), Finished("end", USAGE)], body)
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_chunks_carry_each_call_by_index_then_the_usage_and_done() -> None:
    body = parsed(
        {"messages": [USER], "tools": [TOOL], "stream": True, "stream_options": {"include_usage": True}}
    )

    async def chunks() -> list[bytes]:
        async def events() -> Any:
            for event in TWO_CALLS:
                yield event

        return [chunk async for chunk in CompletionChunks(body).events(events())]

    sent = anyio.run(chunks)
    assert sent[-1] == b"data: [DONE]\n\n"
    data = [json.loads(chunk.removeprefix(b"data: ")) for chunk in sent[:-1]]
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [d["choices"][0]["delta"]["tool_calls"][0] for d in data[1:5]]
    assert [(d["index"], d.get("id"), d["function"].get("name")) for d in deltas] == [
        (0, "call_a", "read"),
        (0, None, None),
        (1, "call_b", "read"),
        (1, None, None),
    ]
    assert [d["function"]["arguments"] for d in deltas] == ["", '{"path": "a"}', "", '{"path": "b"}']
    assert data[5]["choices"][0]["finish_reason"] == "tool_calls"
    assert data[6]["choices"] == []
    assert data[6]["usage"]["prompt_tokens_details"] == {"cached_tokens": 256}
    assert len({d["id"] for d in data}) == 1
