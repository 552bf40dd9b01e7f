"""Tool calls in the model's own format on `snapcache serve`, driven by the official SDKs.

The models are tiny llamas whose GGUFs carry a real chat template (Qwen 2.5's: Hermes `<tool_call>`;
Mistral Nemo's: `[TOOL_CALLS]`) and its special tokens (`tool_models`). Their weights are random, so
the calls are asked for with tool_choice "required" or a tool's name: the answer is then held by the
format's grammar, which starts with the marker token, and what the model writes is parsed from its
tokens as the format reads it. Mistral's `[TOOL_CALLS]` is a control token, gone from text
detokenized without special tokens: its calls are found only because the server reads the answer with
them. The Qwen model runs on the batched scheduler (the default --parallel), the Mistral one on both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from server_process import ServerProcess, running_server
from tool_models import MISTRAL_SPECIALS, QWEN_SPECIALS, write_template_model

from snapcache.server.tools import render_prompt

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat_templates"
QWEN = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
MISTRAL = (TEMPLATES / "mistral-nemo-instruct-2407.jinja").read_text()
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
UNIT = {"type": "object", "properties": {"unit": {"enum": ["C", "F"]}}, "required": ["unit"]}
SYSTEM = "You are a weather assistant."
QUESTION = "What is the weather in Paris?"
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "qwen-template.gguf"
    return write_template_model(path, QWEN, QWEN_SPECIALS, eos="<|im_end|>")


@pytest.fixture(scope="module")
def mistral_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_template_model(
        tmp_path_factory.mktemp("models") / "mistral-nemo.gguf", MISTRAL, MISTRAL_SPECIALS
    )


@pytest.fixture(scope="module")
def qwen_server(qwen_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("qwen-serve")
    with running_server(qwen_path, home / "cache", home / "server.log") as running:
        yield running


@pytest.fixture(scope="module", params=["4", "1"], ids=["batched", "one-at-a-time"])
def mistral_server(
    request: pytest.FixtureRequest, mistral_path: Path, tmp_path_factory: pytest.TempPathFactory
):
    home = tmp_path_factory.mktemp("mistral-serve")
    with running_server(
        mistral_path, home / "cache", home / "server.log", "--parallel", request.param
    ) as running:
        yield running


def messages_client(server: ServerProcess) -> Any:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def prompt_tokens(model: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """The tokens of the prompt the template itself makes of OpenAI-shaped messages and tools."""
    llm = llama_cpp.Llama(str(model), n_ctx=64, vocab_only=True, verbose=False)
    try:
        prompt = render_prompt(llm.metadata["tokenizer.chat_template"], "<s>", "<|im_end|>", messages, tools)
        return len(llm.tokenize(prompt.encode(), add_bos=False, special=True))
    finally:
        llm.close()


def test_a_hermes_model_calls_in_its_own_format_and_reads_the_result_in_its_template(
    qwen_server: ServerProcess, qwen_path: Path
) -> None:
    tools = [
        {"name": "get_weather", "description": "The weather in a city.", "input_schema": CITY},
        {"name": "get_units", "description": "The user's units.", "input_schema": UNIT},
    ]
    with messages_client(qwen_server) as api:
        first = api.messages.create(
            model="qwen",
            max_tokens=MAX_TOKENS,
            system=SYSTEM,
            tools=tools,
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        )
        assert first.stop_reason == "tool_use", first
        calls = [block for block in first.content if block.type == "tool_use"]
        assert [call.name for call in calls] == ["get_weather"]
        assert calls[0].input["city"] in ("Paris", "Rome")
        assert not [block for block in first.content if block.type == "text"]  # no marker shown as text
        history = [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny"}],
            },
        ]
        counted = api.messages.count_tokens(model="qwen", system=SYSTEM, tools=tools, messages=history)
        second = api.messages.create(
            model="qwen",
            max_tokens=8,
            system=SYSTEM,
            tools=tools,
            tool_choice={"type": "any"},
            messages=history,
            extra_body={"temperature": 0},
        )
    # The template places the tools (in its system turn), the call and its result itself.
    openai_tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in tools
    ]
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(calls[0].input)},
    }
    rendered = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "Sunny"},
    ]
    assert counted.input_tokens == prompt_tokens(qwen_path, rendered, openai_tools)
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == counted.input_tokens
    # The second turn starts with the first's prompt: its system turn and tools come back restored.
    assert second.usage.cache_read_input_tokens >= 64, second.usage
    assert second.stop_reason in ("tool_use", "max_tokens")


def test_a_streamed_hermes_call_shows_no_marker(qwen_server: ServerProcess) -> None:
    tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": CITY}]
    with (
        messages_client(qwen_server) as api,
        api.messages.stream(
            model="qwen",
            max_tokens=MAX_TOKENS,
            system=SYSTEM,
            tools=tools,
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        ) as stream,
    ):
        events = list(stream)
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use", message
    assert [block.type for block in message.content] == ["tool_use"] * len(message.content)
    assert all(block.input["city"] in ("Paris", "Rome") for block in message.content)
    assert "input_json" in [event.type for event in events]
    assert not [event for event in events if event.type == "text"]


def test_mistral_control_tokens_vanish_from_plain_text(mistral_path: Path) -> None:
    """The premise of the next test: without special tokens, the marker is no text at all."""
    llm = llama_cpp.Llama(str(mistral_path), n_ctx=64, vocab_only=True, verbose=False)
    try:
        (marker,) = llm.tokenize(b"[TOOL_CALLS]", add_bos=False, special=True)
        assert llm.detokenize([marker]) == b""
        assert llm.detokenize([marker], special=True) == b"[TOOL_CALLS]"
    finally:
        llm.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_mistral_call_is_read_from_its_control_token(mistral_server: ServerProcess, stream: bool) -> None:
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": CITY,
        },
        {"type": "function", "name": "get_units", "description": "The user's units.", "parameters": UNIT},
    ]
    request: dict[str, Any] = {
        "model": "mistral",
        "instructions": SYSTEM,
        "input": QUESTION,
        "tools": tools,
        "tool_choice": {"type": "function", "name": "get_units"},
        "parallel_tool_calls": False,
        "max_output_tokens": MAX_TOKENS,
        "extra_body": {"temperature": 0},
    }
    with openai.OpenAI(base_url=mistral_server.api_url, api_key="unused", max_retries=0) as api:
        if stream:
            events = list(api.responses.create(**request, stream=True))
            response = events[-1].response
            deltas = [
                event.delta for event in events if event.type == "response.function_call_arguments.delta"
            ]
            assert deltas, [event.type for event in events]
            assert not [event for event in events if event.type == "response.output_text.delta"]
        else:
            response = api.responses.create(**request)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_units"], response.output
    assert json.loads(calls[0].arguments)["unit"] in ("C", "F")
    # Mistral's own 9-character id, as its template will want it back.
    assert len(calls[0].call_id) == 9, calls[0].call_id
    assert calls[0].call_id.isalnum()
    assert not [item for item in response.output if item.type == "message"]


def test_a_generic_call_streams_its_input(tiny_model_path: Path, tmp_path: Path) -> None:
    """A template without tools (the tiny model's) gets the generic format: tools in the system text,
    the call as JSON under its grammar, its arguments streamed as they are written."""
    tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": CITY}]
    with (
        running_server(tiny_model_path, tmp_path / "cache", tmp_path / "server.log") as server,
        messages_client(server) as api,
        api.messages.stream(
            model="tiny",
            max_tokens=MAX_TOKENS,
            system=SYSTEM,
            tools=tools,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        ) as stream,
    ):
        events = list(stream)
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use", message
    assert [(block.type, block.name) for block in message.content] == [("tool_use", "get_weather")]
    assert message.content[0].input["city"] in ("Paris", "Rome")
    assert "input_json" in [event.type for event in events]
