"""Ollama's API on `snapcache serve`: a real server process, driven by the `ollama` Python client as
it comes from the registry (and by raw HTTP where the client hides what is checked: the lines of a
stream, error bodies, the media type)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, http_json, running_server

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0, "num_predict": 12}
# llama-cpp-python reads on past a token limit to finish a UTF-8 character: on the tiny model's byte
# vocabulary, up to 3 tokens more.
UTF8_TAIL = 3
LONG_SYSTEM = SYSTEM * 2


_OPEN: list[Any] = []


def client(server: ServerProcess, *, scope: str = "default") -> Any:
    """An `ollama` client of `server` in `scope` (closed after the test)."""
    opened = ollama.Client(host=server.base_url, headers={"X-Snapcache-Scope": scope})
    _OPEN.append(opened)
    return opened


@pytest.fixture(autouse=True)
def _close_clients() -> Any:
    yield
    while _OPEN:
        _OPEN.pop().close()


def asked(question: str, system: str = LONG_SYSTEM) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def ndjson_lines(
    server: ServerProcess, path: str, document: dict[str, Any], *, scope: str = "default"
) -> list[dict[str, Any]]:
    """The lines of a streamed answer in `scope`, read as they come; the body sent as `curl -d`
    sends it."""
    request = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(document).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "X-Snapcache-Scope": scope},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in response if line.strip()]


@pytest.fixture(scope="module", params=["1", "4"], ids=["one at a time", "parallel 4"])
def server(request: pytest.FixtureRequest, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("ollama")
    with running_server(
        tiny_model_path, home / "cache", home / "server.log", "--parallel", request.param
    ) as running:
        yield running


def test_the_model_is_listed_shown_and_running(server: ServerProcess, tiny_model_path: Path) -> None:
    api = client(server)
    [listed] = api.list().models
    assert listed.model == tiny_model_path.name
    assert listed.size == tiny_model_path.stat().st_size
    assert listed.details.format == "gguf"
    assert listed.details.family == "llama"
    assert listed.digest
    shown = api.show(listed.model)
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.block_count"] == 2  # a number, as Ollama gives it
    assert "tools" in shown.capabilities
    [loaded] = api.ps().models
    assert (loaded.model, loaded.size, loaded.context_length) == (listed.model, listed.size, 2048)
    status, version, _ = http_json("GET", server.base_url + "/api/version")
    assert status == 200
    assert version["version"].count(".") == 2


def test_a_repeated_system_prompt_is_restored_and_answers_as_a_cold_read(server: ServerProcess) -> None:
    first = client(server, scope="ollama-restore").chat(
        model="tiny", messages=asked("Where did I save the invoice?"), options=GREEDY
    )
    assert first.done
    assert first.done_reason in {"stop", "length"}
    assert first.message.role == "assistant"
    assert 0 < first.eval_count <= GREEDY["num_predict"] + UTF8_TAIL
    read_cold = first.prompt_eval_count
    assert read_cold > 300  # the whole prompt, read
    again = client(server, scope="ollama-restore").chat(
        model="tiny", messages=asked("And the receipt?"), options=GREEDY
    )
    # Only what follows the stored system prompt is read again (blocks of 64 tokens).
    assert again.prompt_eval_count < 64 + len("And the receipt?") + 32, again
    assert again.total_duration >= again.prompt_eval_duration > 0
    # The same request cold, in a scope of its own, answers the same tokens.
    cold = client(server, scope="ollama-cold").chat(
        model="tiny", messages=asked("And the receipt?"), options=GREEDY
    )
    assert cold.prompt_eval_count > 300
    assert cold.message.content == again.message.content


def test_a_streamed_chat_joins_into_the_whole_answer(server: ServerProcess) -> None:
    question = asked("Name three colours.")
    whole = client(server, scope="ollama-stream").chat(model="tiny", messages=question, options=GREEDY)
    parts = list(
        client(server, scope="ollama-stream").chat(
            model="tiny", messages=question, options=GREEDY, stream=True
        )
    )
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == whole.message.content
    last = parts[-1]
    assert (last.eval_count, last.done_reason) == (whole.eval_count, whole.done_reason)
    document = {"model": "tiny", "messages": question, "options": GREEDY}
    lines = ndjson_lines(server, "/api/chat", document, scope="ollama-stream")
    assert "".join(line["message"]["content"] for line in lines) == whole.message.content
    assert lines[-1]["done"] is True
    assert lines[-1]["prompt_eval_count"] < 64  # its prefix restored


def test_generate_renders_system_and_prompt_as_a_chat(server: ServerProcess) -> None:
    api = client(server, scope="ollama-generate")
    chat = api.chat(model="tiny", messages=asked("Summarise the plan."), options=GREEDY)
    generated = api.generate(model="tiny", system=LONG_SYSTEM, prompt="Summarise the plan.", options=GREEDY)
    assert generated.response == chat.message.content
    assert generated.prompt_eval_count < 64  # the chat's prompt, restored
    lines = ndjson_lines(
        server,
        "/api/generate",
        {"model": "tiny", "system": LONG_SYSTEM, "prompt": "Summarise the plan.", "options": GREEDY},
        scope="ollama-generate",
    )
    assert "".join(line["response"] for line in lines) == generated.response


def test_options_are_sampling_settings(server: ServerProcess) -> None:
    api = client(server, scope="ollama-options")
    question = asked("Tell me a story.")
    options = {"temperature": 1.0, "seed": 1234, "num_predict": 10, "top_k": 40, "repeat_penalty": 1.1}
    one = api.chat(model="tiny", messages=question, options=options)
    two = api.chat(model="tiny", messages=question, options=options)
    assert one.message.content == two.message.content  # the same seed draws the same tokens
    assert one.eval_count <= 10 + UTF8_TAIL
    stopped = api.chat(model="tiny", messages=question, options={**GREEDY, "num_predict": 3})
    assert stopped.eval_count <= 3 + UTF8_TAIL
    assert stopped.done_reason == "length"


def test_a_json_format_holds_the_answer_to_json(server: ServerProcess) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    answer = client(server).chat(
        model="tiny",
        messages=asked("Is it fine?"),
        format=schema,
        options={"temperature": 0, "num_predict": 24},
    )
    assert json.loads(answer.message.content)["ok"] in {True, False}


def test_tool_history_is_rendered_and_answered(server: ServerProcess) -> None:
    """Calls as Ollama's clients send them (no ids) and results named by the tool: the turn after is
    answered, and the one after that restores the conversation up to it."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    history = [
        *asked("What is the weather in Paris?", system=SYSTEM),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C"},
    ]
    api = client(server, scope="ollama-tools")
    first = api.chat(model="tiny", messages=history, tools=tools, options=GREEDY)
    assert first.done
    more = [*history, first.message, {"role": "user", "content": "And tomorrow?"}]
    second = api.chat(model="tiny", messages=more, tools=tools, options=GREEDY)
    assert second.prompt_eval_count < first.prompt_eval_count


def test_a_request_without_messages_or_prompt_loads_the_model(server: ServerProcess) -> None:
    api = client(server)
    assert api.chat(model="tiny", messages=[]).done_reason == "load"
    assert api.generate(model="tiny", prompt="").done_reason == "load"
    [line] = ndjson_lines(server, "/api/generate", {"model": "tiny"})
    assert (line["done"], line["done_reason"]) == (True, "load")


@pytest.mark.parametrize(
    ("path", "document", "named"),
    [
        (
            "/api/chat",
            {"model": "t", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            "images",
        ),
        ("/api/chat", {"model": "t", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        (
            "/api/chat",
            {"model": "t", "messages": [{"role": "user", "content": "x"}], "options": {"seed": "a"}},
            "seed",
        ),
        (
            "/api/chat",
            {"model": "t", "messages": [{"role": "tool", "content": "x", "tool_name": "f"}]},
            "tool",
        ),
        ("/api/generate", {"model": "t", "prompt": "x", "raw": True}, "raw"),
        ("/api/generate", {"model": "t", "prompt": "x", "suffix": "y"}, "suffix"),
        ("/api/generate", {"model": "t", "prompt": "x", "context": [1, 2]}, "context"),
    ],
    ids=["image", "role", "option type", "result without call", "raw", "suffix", "context"],
)
def test_bad_requests_get_ollama_s_error_shape(
    server: ServerProcess, path: str, document: dict[str, Any], named: str
) -> None:
    status, body, _ = http_json("POST", server.base_url + path, json.dumps(document).encode())
    assert status == 400
    assert list(body) == ["error"]
    assert named in body["error"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", b'{"model": "\\ud800", "stream": false}'),
        ("/api/show", b'{"model": "\\ud800"}'),
        (
            "/api/chat",
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
            b'"options": {"temperature": 1e400}}',
        ),
    ],
    ids=["load, a lone surrogate", "show, a lone surrogate", "an infinite temperature"],
)
def test_text_that_is_not_text_and_numbers_no_sampler_takes_are_400s(
    server: ServerProcess, path: str, body: bytes
) -> None:
    status, answer, _ = http_json("POST", server.base_url + path, body)
    assert status == 400
    assert list(answer) == ["error"]


def test_the_root_answers_as_ollama_s_does(server: ServerProcess) -> None:
    with urllib.request.urlopen(server.base_url + "/", timeout=30) as response:
        assert response.status == 200
        assert b"running" in response.read()


def test_the_client_raises_ollama_s_error(server: ServerProcess) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        client(server).generate(model="tiny", prompt="x", raw=True)
    assert raised.value.status_code == 400
    assert "raw" in raised.value.error


@pytest.fixture(scope="module")
def gemma_server(gemma_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("ollama-gemma")
    with running_server(gemma_model_path, home / "cache", home / "server.log", n_ctx=4096) as running:
        yield running


@pytest.mark.gemma
def test_gemma_calls_a_tool_and_its_result_is_answered(gemma_server: ServerProcess) -> None:
    """A tool call through the `ollama` client, whole and streamed; the result's turn restores the
    conversation's head (system prompt and tools) and reads little more."""
    system = "You are a weather assistant. Always look up the weather with a tool call before you answer."
    city = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
    }
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": city},
        }
    ]
    messages = asked("Call get_weather for Paris.", system=system)
    options = {"temperature": 0, "num_predict": 32}
    api = client(gemma_server)
    first = api.chat(model="gemma", messages=messages, tools=tools, options=options)
    assert first.message.tool_calls, first.message
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert call.function.arguments["city"] == "Paris"
    streamed = [
        part.message.tool_calls[0]
        for part in api.chat(model="gemma", messages=messages, tools=tools, options=options, stream=True)
        if part.message.tool_calls
    ]
    assert streamed[0].function == call.function
    history = [
        *messages,
        first.message,
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C"},
    ]
    second = api.chat(
        model="gemma", messages=history, tools=tools, options={"temperature": 0, "num_predict": 16}
    )
    assert second.done
    total = first.prompt_eval_count  # the first turn read its whole prompt
    assert second.prompt_eval_count < total / 2, (second.prompt_eval_count, total)
