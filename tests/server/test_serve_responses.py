"""OpenAI Responses on `snapcache serve`: a real server process, driven by the official `openai`
client (and by raw HTTP where the client hides what is checked: event names, bad bodies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, http_json, running_server
from test_serve_messages import sse_events

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

MAX_TOKENS = 12
LONG_SYSTEM = SYSTEM * 2


def client(server: ServerProcess, *, scope: str = "default") -> Any:
    headers = {"X-Snapcache-Scope": scope}
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, default_headers=headers)


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("responses")
    with running_server(tiny_model_path, home / "cache", home / "server.log") as running:
        yield running


def codex_input(question: str) -> list[dict[str, Any]]:
    """Input as Codex sends it: developer messages, then the user's, as content parts."""
    return [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": LONG_SYSTEM}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]},
    ]


def test_a_response_is_answered_and_the_second_restores_its_instructions(server: ServerProcess) -> None:
    with client(server, scope="restore") as api:
        first = api.responses.create(
            model="m", input=codex_input("Where is the invoice?"), max_output_tokens=MAX_TOKENS, temperature=0
        )
        second = api.responses.create(
            model="m", input=codex_input("What is next?"), max_output_tokens=MAX_TOKENS, temperature=0
        )
    assert first.object == "response"
    assert first.status in {"completed", "incomplete"}
    assert first.output[0].type == "message"
    assert first.output_text == first.output[0].content[0].text
    assert first.usage.input_tokens > 200
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert 0 < first.usage.output_tokens <= MAX_TOKENS + 3
    assert second.usage.input_tokens_details.cached_tokens >= 64, second.usage


def test_a_streamed_response_sends_the_events_codex_reads(server: ServerProcess) -> None:
    document = {
        "model": "m",
        "instructions": LONG_SYSTEM,
        "input": "Open the last report.",
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "store": False,
        "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "tools": [
            {"type": "web_search"},
            {"type": "namespace", "name": "mcp", "tools": []},
        ],
    }
    events = sse_events(server, "/v1/responses", document)
    names = [name for name, _ in events]
    assert names[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ], names
    assert names[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert names[-1] == "response.completed"
    assert events[-1][1]["response"]["status"] in {"completed", "incomplete"}
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    done = events[-1][1]["response"]
    assert done["output"][0]["content"][0]["text"] == text
    assert done["usage"]["input_tokens"] > 200


def test_the_client_s_stream_ends_with_the_whole_response(server: ServerProcess) -> None:
    with client(server, scope="stream") as api:
        stream = api.responses.create(
            model="m",
            input=codex_input("Summarize my day."),
            max_output_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        events = list(stream)
        again = api.responses.create(
            model="m", input=codex_input("Summarize my day."), max_output_tokens=MAX_TOKENS, temperature=0
        )
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text
    assert again.output_text == text, "a streamed answer differs from the same answer unstreamed"
    assert again.usage.input_tokens_details.cached_tokens >= 64


def test_function_calls_and_their_outputs_are_taken_as_input(server: ServerProcess) -> None:
    tools = [
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        }
    ]
    items = [
        *codex_input("What does notes.txt say?"),
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": '{"path": "notes.txt"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Buy milk."},
    ]
    with client(server, scope="calls") as api:
        answer = api.responses.create(
            model="m", input=items, tools=tools, tool_choice="none", max_output_tokens=4, store=False
        )
    assert answer.status in {"completed", "incomplete"}
    assert answer.output[0].type == "message"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, "c9"),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            },
            "input.0.content.0.image_url",
        ),
        ({"model": "m", "input": "hi", "tool_choice": {"type": "function", "name": "nope"}}, "nope"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
    ids=["previous response", "no input", "output without call", "image", "unknown function", "zero tokens"],
)
def test_bad_requests_get_openai_s_error_shape(
    server: ServerProcess, document: dict[str, Any], expected: str
) -> None:
    status, answer, _ = http_json("POST", server.api_url + "/responses", json.dumps(document).encode())
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert expected in answer["error"]["message"], answer


def test_a_prompt_longer_than_the_context_names_the_flag_to_raise(server: ServerProcess) -> None:
    with client(server) as api, pytest.raises(openai.BadRequestError) as raised:
        api.responses.create(model="m", input="word " * 1000, max_output_tokens=4, stream=True)
    assert "--n-ctx" in raised.value.body["message"], raised.value.body
