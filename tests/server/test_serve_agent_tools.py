"""Tool calls through Anthropic Messages and OpenAI Responses on Gemma 3, whose template knows no
tools: the generic format describes them in the system text and a grammar holds the answer to a call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from server_process import ServerProcess, running_server

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.model, pytest.mark.gemma]

SYSTEM = "You are a weather assistant. Use the tools to look up the weather before you answer."
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
}
QUESTION = "What is the weather in Paris?"
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(gemma_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("agent-tools")
    # The default --parallel: requests with a grammar are batched like the rest. Calls stream as the
    # model writes them (--live-tool-calls; the default sends them whole: test_serve_chat_tools).
    log = home / "server.log"
    with running_server(gemma_model_path, home / "cache", log, "--live-tool-calls", n_ctx=4096) as running:
        yield running


def messages_client(server: ServerProcess) -> Any:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def test_a_required_tool_call_comes_back_as_a_tool_use_block(server: ServerProcess) -> None:
    tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER}]
    with messages_client(server) as api:
        first = api.messages.create(
            model="gemma",
            max_tokens=MAX_TOKENS,
            system=SYSTEM,
            tools=tools,
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        )
        assert first.stop_reason == "tool_use", first
        call = next(block for block in first.content if block.type == "tool_use")
        assert call.name == "get_weather"
        assert isinstance(call.input.get("city"), str)
        history = [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}],
            },
        ]
        second = api.messages.create(
            model="gemma",
            max_tokens=MAX_TOKENS,
            system=SYSTEM,
            tools=tools,
            messages=history,
            extra_body={"temperature": 0},
        )
    assert second.stop_reason in {"end_turn", "max_tokens", "tool_use"}
    # The tools are part of the system text every turn shares: the second turn restores them.
    assert second.usage.cache_read_input_tokens >= 64, second.usage


def test_a_streamed_tool_call_sends_its_input_as_json_deltas(server: ServerProcess) -> None:
    tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER}]
    with (
        messages_client(server) as api,
        api.messages.stream(
            model="gemma",
            max_tokens=MAX_TOKENS,
            system=SYSTEM,
            tools=tools,
            tool_choice={"type": "tool", "name": "get_weather"},
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        ) as stream,
    ):
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert "input_json" in kinds
    assert message.stop_reason == "tool_use"
    call = next(block for block in message.content if block.type == "tool_use")
    assert call.name == "get_weather"
    assert isinstance(call.input["city"], str)


def test_a_responses_function_call_and_its_output(server: ServerProcess) -> None:
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER,
        },
        {"type": "web_search"},
    ]
    with openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0) as api:
        first = api.responses.create(
            model="gemma",
            instructions=SYSTEM,
            input=QUESTION,
            tools=tools,
            tool_choice="required",
            max_output_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},
            store=False,
        )
        call = next(item for item in first.output if item.type == "function_call")
        assert call.name == "get_weather"
        assert isinstance(json.loads(call.arguments)["city"], str)
        items = [
            {"role": "user", "content": QUESTION},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
        ]
        events = list(
            api.responses.create(
                model="gemma",
                instructions=SYSTEM,
                input=items,
                tools=tools,
                max_output_tokens=MAX_TOKENS,
                extra_body={"temperature": 0},
                stream=True,
            )
        )
    final = events[-1].response
    assert final.status in {"completed", "incomplete"}
    assert final.output, final
    assert final.usage.input_tokens_details.cached_tokens >= 64, final.usage


def test_a_text_answer_with_tools_offered_streams_as_it_comes(server: ServerProcess) -> None:
    """Under `auto` the grammar lets Gemma answer `{"response": "..."}`: its text goes out in deltas
    while it is generated, not in one piece at the end."""
    tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER}]
    with (
        messages_client(server) as api,
        api.messages.stream(
            model="gemma",
            max_tokens=MAX_TOKENS,
            system="You are a weather assistant.",
            tools=tools,
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        ) as stream,
    ):
        deltas = [event.delta.text for event in stream if event.type == "content_block_delta"]
        message = stream.get_final_message()
    assert message.stop_reason == "end_turn", message  # Gemma-3-270M answers this one in text
    assert len(deltas) > 2
    assert "".join(deltas) == message.content[0].text
    assert not message.content[0].text.lstrip().startswith("{")


# With --live-tool-calls, a call written as it streams, and one cut by max_tokens: each API sends the
# call from the moment its name is known, its arguments in pieces as written; a call cut short stays a
# call (as the hosted APIs end one at max_tokens) and its text is never sent as text: a whole answer
# holds the partial call where its API can (Chat Completions, Responses), else the stop reason alone.
WEATHER_TOOL = {"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER}
# One call a turn (offered a list, Gemma writes its call again), whole after this many tokens less
# the closing `"}` and `}`: cut there, the answer ends inside the call's arguments (checked: they are
# no JSON yet).
ONE_CALL = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
CUT = 3


def one_call(max_tokens: int) -> dict[str, Any]:
    """A Messages request that asks for one get_weather call, greedy."""
    return {
        "model": "gemma",
        "max_tokens": max_tokens,
        "system": SYSTEM,
        "tools": [WEATHER_TOOL],
        "tool_choice": ONE_CALL,
        "messages": [{"role": "user", "content": QUESTION}],
        "extra_body": {"temperature": 0},
    }


def anthropic_stream(api: Any, max_tokens: int) -> tuple[list[Any], Any]:
    with api.messages.stream(**one_call(max_tokens)) as stream:
        return list(stream), stream.get_final_message()


def anthropic_whole(api: Any, max_tokens: int) -> Any:
    return api.messages.create(**one_call(max_tokens))


def test_a_messages_call_streams_as_written_and_a_cut_one_stays_a_call(server: ServerProcess) -> None:
    with messages_client(server) as api:
        whole = anthropic_whole(api, MAX_TOKENS)
        events, message = anthropic_stream(api, MAX_TOKENS)
        [call] = [block for block in whole.content if block.type == "tool_use"]
        pieces = [
            event.delta.partial_json
            for event in events
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
        ]
        assert len(pieces) >= 2, pieces  # the input arrives as written, not in one piece at the end
        assert json.loads("".join(pieces)) == call.input
        started = next(event for event in events if event.type == "content_block_start")
        assert started.content_block.type == "tool_use"
        assert started.content_block.id == message.content[0].id
        assert [block.type for block in message.content] == ["tool_use"]
        assert message.content[0].input == call.input
        assert message.stop_reason == "tool_use"

        cut = whole.usage.output_tokens - CUT
        shown = anthropic_whole(api, cut)
        # A whole message cut inside its call: the stop reason says so, and no call syntax as text.
        assert shown.stop_reason == "max_tokens"
        assert [(block.type, block.text) for block in shown.content] == [("text", "")], shown
        events, message = anthropic_stream(api, cut)
    kinds = [event.type for event in events if event.type.startswith("content_block")]
    assert kinds[0] == "content_block_start"
    assert kinds[-1] == "content_block_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert [block.type for block in message.content] == ["tool_use"]  # no text block after it
    assert message.stop_reason == "max_tokens"
    written = "".join(
        event.delta.partial_json
        for event in events
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
    )
    assert written
    with pytest.raises(json.JSONDecodeError):  # the premise: cut inside the call's arguments
        json.loads(written)


def test_a_responses_call_streams_as_written_and_a_cut_one_ends_incomplete(server: ServerProcess) -> None:
    request: dict[str, Any] = {
        "model": "gemma",
        "instructions": SYSTEM,
        "input": QUESTION,
        "tools": [{"type": "function", **{k: v for k, v in WEATHER_TOOL.items() if k != "input_schema"}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "extra_body": {"temperature": 0},
        "store": False,
    }
    request["tools"][0]["parameters"] = WEATHER
    with openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0) as api:
        whole = api.responses.create(**request, max_output_tokens=MAX_TOKENS)
        events = list(api.responses.create(**request, max_output_tokens=MAX_TOKENS, stream=True))
        [call] = [item for item in whole.output if item.type == "function_call"]
        pieces = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
        assert len(pieces) >= 2, pieces
        assert json.loads("".join(pieces)) == json.loads(call.arguments)
        added = next(event for event in events if event.type == "response.output_item.added")
        done = next(event for event in events if event.type == "response.function_call_arguments.done")
        assert added.item.type == "function_call"
        assert added.item.name == "get_weather"
        assert done.item_id == added.item.id
        assert json.loads(done.arguments) == json.loads(call.arguments)
        final = events[-1].response
        assert [item.type for item in final.output] == ["function_call"]
        assert final.output[0].call_id == added.item.call_id

        cut = whole.usage.output_tokens - CUT
        shown = api.responses.create(**request, max_output_tokens=cut)
        assert shown.status == "incomplete"
        assert [(item.type, item.status) for item in shown.output] == [("function_call", "incomplete")]
        events = list(api.responses.create(**request, max_output_tokens=cut, stream=True))
    final = events[-1].response
    assert final.status == "incomplete"
    assert [(item.type, item.status) for item in final.output] == [("function_call", "incomplete")]
    written = "".join(
        event.delta for event in events if event.type == "response.function_call_arguments.delta"
    )
    assert written == final.output[0].arguments == shown.output[0].arguments
    with pytest.raises(json.JSONDecodeError):  # the premise: cut inside the call's arguments
        json.loads(written)
    assert not shown.output_text
    assert not [event for event in events if event.type == "response.output_text.delta"]


def test_a_chat_completions_call_streams_as_written_and_a_cut_one_stays_a_call(server: ServerProcess) -> None:
    request: dict[str, Any] = {
        "model": "gemma",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "tools": [{"type": "function", "function": {**WEATHER_TOOL}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }
    function = request["tools"][0]["function"]
    function["parameters"] = function.pop("input_schema")
    with openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0) as api:
        whole = api.chat.completions.create(**request, max_tokens=MAX_TOKENS)
        chunks = list(api.chat.completions.create(**request, max_tokens=MAX_TOKENS, stream=True))
        [call] = whole.choices[0].message.tool_calls
        pieces = [
            delta.function.arguments
            for chunk in chunks
            for delta in chunk.choices[0].delta.tool_calls or ()
            if delta.function.arguments
        ]
        assert len(pieces) >= 2, pieces
        assert json.loads("".join(pieces)) == json.loads(call.function.arguments)

        cut = whole.usage.completion_tokens - CUT
        shown = api.chat.completions.create(**request, max_tokens=cut)
        assert shown.choices[0].finish_reason == "length"
        assert not shown.choices[0].message.content  # the call's syntax is no answer
        [partial] = shown.choices[0].message.tool_calls  # the call as far as it went, as OpenAI leaves one
        chunks = list(api.chat.completions.create(**request, max_tokens=cut, stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    named = [call for delta in deltas for call in delta.tool_calls or () if call.id]
    assert [call.function.name for call in named] == ["get_weather"]
    assert not "".join(delta.content or "" for delta in deltas)  # the call's text is not sent as content
    assert chunks[-1].choices[0].finish_reason == "length"
    written = "".join(
        call.function.arguments or "" for delta in deltas for call in delta.tool_calls or () if call.function
    )
    assert written == partial.function.arguments
    assert partial.function.name == "get_weather"
    with pytest.raises(json.JSONDecodeError):  # the premise: the answer ends inside the call
        json.loads(written)
