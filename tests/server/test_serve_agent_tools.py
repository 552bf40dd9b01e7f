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
    # The default --parallel: requests with a grammar are batched like the rest.
    with running_server(gemma_model_path, home / "cache", home / "server.log", n_ctx=4096) as running:
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
