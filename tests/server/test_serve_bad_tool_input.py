"""Bad tool input on `snapcache serve`, through the official clients: each gets a 400 in its API's own
error shape, and the server goes on serving.

A tool result without its call; a tool whose argument schema makes a grammar llama.cpp cannot take
(a string's `maxLength` of 50,000 is a grammar nested 50,000 groups deep, whose parsing overflowed
the stack and killed the server; an empty `enum`, which llama.cpp refuses); `min_tokens` with a
grammar that ends sooner (llama.cpp threw in its sampler and the process aborted); 200 tools, whose
prompt does not fit a 2,048-token context. And a grammar with a repeat_penalty of 0, which made the
batched sampler's logits NaN and its pick a token the grammar refuses (the same abort), is answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_process import ServerProcess, http_json, running_server

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

N_CTX = 2048
DEEP = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 50_000}}}
REFUSED = {"type": "object", "properties": {"kind": {"enum": []}}}
FINE = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 200}}, "required": ["path"]}
QUESTION = [{"role": "user", "content": "Which files are in the folder?"}]


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("bad-tools")
    with running_server(tiny_model_path, home / "cache", home / "server.log", n_ctx=N_CTX) as running:
        yield running
    assert "Traceback" not in running.log(), running.log()[-6000:]


@pytest.fixture
def messages_api(server: ServerProcess) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0) as api:
        yield api


@pytest.fixture
def openai_api(server: ServerProcess) -> Iterator[Any]:
    with openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0) as api:
        yield api


def anthropic_error(raised: pytest.ExceptionInfo[Any]) -> str:
    """The message of a 400 in Anthropic's shape."""
    assert raised.value.status_code == 400
    body = raised.value.body
    assert body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error", body
    return str(body["error"]["message"])


def openai_error(raised: pytest.ExceptionInfo[Any]) -> dict[str, Any]:
    """The error of a 400 in OpenAI's shape."""
    assert raised.value.status_code == 400
    error = raised.value.body
    error = error.get("error", error)  # the client hands over the inner object
    assert error["type"] == "invalid_request_error", error
    assert {"message", "type", "param", "code"} <= set(error), error
    return dict(error)


def still_serving(server: ServerProcess) -> None:
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    assert http_json("POST", server.api_url + "/chat/completions", body)[0] == 200
    assert server.process.poll() is None, "the server died"


def test_a_tool_result_without_its_tool_use_is_a_400(server: ServerProcess, messages_api: Any) -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_missing", "content": "3 files"}
    with pytest.raises(anthropic.BadRequestError) as raised:
        messages_api.messages.create(
            model="m", max_tokens=4, messages=[*QUESTION, {"role": "user", "content": [result]}]
        )
    assert "toolu_missing" in anthropic_error(raised)


def test_a_function_call_output_without_its_call_is_a_400(server: ServerProcess, openai_api: Any) -> None:
    output = {"type": "function_call_output", "call_id": "call_missing", "output": "3 files"}
    with pytest.raises(openai.BadRequestError) as raised:
        openai_api.responses.create(model="m", input=[*QUESTION, output], max_output_tokens=4)
    assert "call_missing" in openai_error(raised)["message"]


@pytest.mark.parametrize(
    ("schema", "expected"),
    [(DEEP, "nests 50000 groups deep"), (REFUSED, "llama.cpp cannot use this grammar")],
    ids=["nested too deep", "refused by llama.cpp"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_schema_llama_cpp_cannot_take_is_a_400_in_both_dialects(
    server: ServerProcess, messages_api: Any, openai_api: Any, schema: Any, expected: str, stream: bool
) -> None:
    tools = [{"name": "read", "input_schema": FINE}, {"name": "write", "input_schema": schema}]
    with pytest.raises(anthropic.BadRequestError) as raised:
        messages_api.messages.create(model="m", max_tokens=4, messages=QUESTION, tools=tools, stream=stream)
    message = anthropic_error(raised)
    assert message.startswith("tools.1.input_schema: "), message
    assert expected in message
    with pytest.raises(anthropic.BadRequestError) as raised:
        messages_api.messages.count_tokens(model="m", messages=QUESTION, tools=tools)
    assert expected in anthropic_error(raised)

    functions = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in tools]
    with pytest.raises(openai.BadRequestError) as raised:
        openai_api.responses.create(model="m", input=QUESTION, tools=functions, stream=stream)
    error = openai_error(raised)
    assert (error["param"], expected in error["message"]) == ("tools.1.parameters", True), error

    chat_tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in tools
    ]
    with pytest.raises(openai.BadRequestError) as raised:
        openai_api.chat.completions.create(
            model="m", messages=QUESTION, tools=chat_tools, max_tokens=4, stream=stream
        )
    error = openai_error(raised)
    assert error["param"] == "tools.1.function.parameters", error
    assert expected in error["message"]

    still_serving(server)


def test_a_response_format_or_grammar_llama_cpp_cannot_take_is_a_400(
    server: ServerProcess, openai_api: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        openai_api.chat.completions.create(
            model="m", messages=QUESTION, response_format={"type": "json_object", "schema": DEEP}
        )
    assert openai_error(raised)["param"] == "response_format.schema"
    deep_grammar = "root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000
    with pytest.raises(openai.BadRequestError) as raised:
        openai_api.completions.create(model="m", prompt="hi", extra_body={"grammar": deep_grammar})
    assert "nests 30000 groups deep" in openai_error(raised)["message"]
    still_serving(server)


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("completions", {"grammar": 'root ::= "ab"'}),
        ("chat", {"grammar": 'root ::= "ab"'}),
        ("chat", {"response_format": {"type": "json_object"}}),
        (
            "chat",
            {"functions": [{"name": "read", "parameters": FINE}], "function_call": {"name": "read"}},
        ),
    ],
    ids=["completion grammar", "chat grammar", "json response", "chosen function"],
)
def test_min_tokens_with_a_grammar_is_a_400(
    server: ServerProcess, openai_api: Any, path: str, extra: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        complete(openai_api, path, {**extra, "min_tokens": 8})
    assert openai_error(raised)["param"] == "min_tokens"
    still_serving(server)


@pytest.mark.parametrize(
    ("path", "extra"),
    [("completions", {"grammar": "root ::= [a-z]+"}), ("chat", {"response_format": {"type": "json_object"}})],
    ids=["completion grammar", "json response"],
)
def test_a_grammar_with_a_repeat_penalty_of_0_is_answered(
    server: ServerProcess, openai_api: Any, path: str, extra: dict[str, Any]
) -> None:
    for _ in range(4):  # each answer drew its tokens from NaN logits, and one was enough to abort
        answer = complete(openai_api, path, {**extra, "repeat_penalty": 0.0, "min_p": 0.0})
        assert answer.usage.completion_tokens > 0
    still_serving(server)


def complete(api: Any, path: str, extra: dict[str, Any]) -> Any:
    if path == "completions":
        return api.completions.create(model="m", prompt="hi", max_tokens=12, extra_body=extra)
    return api.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, extra_body=extra)


def two_hundred_tools() -> list[dict[str, Any]]:
    return [
        {"name": f"tool_{i}", "description": f"Tool number {i}.", "input_schema": FINE} for i in range(200)
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_two_hundred_tools_that_do_not_fit_name_the_flag_to_raise(
    server: ServerProcess, messages_api: Any, openai_api: Any, stream: bool
) -> None:
    tools = two_hundred_tools()
    with pytest.raises(anthropic.BadRequestError) as raised:
        messages_api.messages.create(model="m", max_tokens=4, messages=QUESTION, tools=tools, stream=stream)
    message = anthropic_error(raised)
    assert "--n-ctx" in message, message
    assert f"holds {N_CTX}" in message, message

    functions = [{"type": "function", "name": t["name"], "parameters": FINE} for t in tools]
    with pytest.raises(openai.BadRequestError) as raised:
        openai_api.responses.create(model="m", input=QUESTION, tools=functions, stream=stream)
    error = openai_error(raised)
    assert "--n-ctx" in error["message"], error
    assert error["code"] == "context_length_exceeded", error  # a stream's early error too
    still_serving(server)


def test_count_tokens_counts_two_hundred_tools_it_could_not_run(messages_api: Any) -> None:
    counted = messages_api.messages.count_tokens(model="m", messages=QUESTION, tools=two_hundred_tools())
    assert counted.input_tokens > N_CTX
