"""Anthropic Messages on `snapcache serve`: a real server process, driven by the official `anthropic`
client (and by raw HTTP where the client hides what is checked: event order, bad bodies)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, http_json, running_server

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.model

MAX_TOKENS = 12
LONG_SYSTEM = SYSTEM * 2
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.{}; cc_entrypoint=sdk-cli;"


def client(server: ServerProcess, *, scope: str = "default", api_key: str = "unused") -> Any:
    headers = {"X-Snapcache-Scope": scope}
    return anthropic.Anthropic(
        base_url=server.base_url, api_key=api_key, max_retries=0, default_headers=headers
    )


def ask(server: ServerProcess, question: str, *, scope: str, system: Any = LONG_SYSTEM, **kwargs: Any) -> Any:
    with client(server, scope=scope) as api:
        return api.messages.create(
            model="m",
            max_tokens=kwargs.pop("max_tokens", MAX_TOKENS),
            system=system,
            messages=[{"role": "user", "content": question}],
            extra_body={"temperature": 0},
            **kwargs,
        )


def raw_post(server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None):
    return http_json("POST", server.base_url + path, body, headers=headers)


def sse_events(
    server: ServerProcess, path: str, document: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a streamed answer, read as they come."""
    request = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(document).encode(),
        headers={"Content-Type": "application/json"},
    )
    events, name = [], None
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response:
            text = line.decode().rstrip("\n")
            if text.startswith("event: "):
                name = text[len("event: ") :]
            elif text.startswith("data: "):
                events.append((name, json.loads(text[len("data: ") :])))
    return events


@pytest.fixture(scope="module", params=["1", "4"], ids=["one at a time", "parallel 4"])
def server(request: pytest.FixtureRequest, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("messages")
    with running_server(
        tiny_model_path, home / "cache", home / "server.log", "--parallel", request.param
    ) as running:
        yield running


def test_a_message_is_answered_and_the_second_restores_its_system_prompt(server: ServerProcess) -> None:
    first = ask(server, "Where did I save the invoice?", scope="restore")
    assert first.type == "message"
    assert first.role == "assistant"
    assert first.content[0].type == "text"
    assert first.stop_reason in {"end_turn", "max_tokens"}
    assert 0 < first.usage.output_tokens <= MAX_TOKENS + 3
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.input_tokens > 200

    second = ask(server, "What is on my calendar?", scope="restore")
    assert second.usage.cache_read_input_tokens >= 64, second.usage
    assert second.usage.input_tokens < first.usage.input_tokens / 2


def test_a_streamed_message_sends_anthropic_s_events_in_order(server: ServerProcess) -> None:
    document = {
        "model": "m",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "system": [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Open the last report."}]}],
        "temperature": 0,
    }
    events = sse_events(server, "/v1/messages?beta=true", document)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in events)
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    final = events[-2][1]
    assert final["delta"]["stop_reason"] in {"end_turn", "max_tokens"}
    assert final["usage"]["output_tokens"] > 0
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] > 200


def test_the_client_s_stream_gives_the_same_text_as_its_events(server: ServerProcess) -> None:
    with (
        client(server, scope="stream") as api,
        api.messages.stream(
            model="m",
            max_tokens=MAX_TOKENS,
            system=LONG_SYSTEM,
            messages=[{"role": "user", "content": "Summarize my day."}],
            extra_body={"temperature": 0},
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert message.content[0].text == text
    assert message.usage.output_tokens > 0
    again = ask(server, "Summarize my day.", scope="stream")
    assert again.content[0].text == text, "a streamed answer differs from the same answer unstreamed"
    assert again.usage.cache_read_input_tokens >= 64


def test_count_tokens_counts_the_prompt_a_message_reads(server: ServerProcess) -> None:
    with client(server, scope="count") as api:
        counted = api.messages.count_tokens(
            model="m", system=LONG_SYSTEM, messages=[{"role": "user", "content": "How many?"}]
        )
    answer = ask(server, "How many?", scope="count-fresh")
    assert counted.input_tokens == answer.usage.input_tokens + answer.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(server: ServerProcess) -> None:
    free = ask(server, "Tell me a story.", scope="stops", max_tokens=16)
    text = free.content[0].text
    stop = text[4:6]
    if len(stop) < 2 or not stop.strip():
        pytest.fail(f"the answer is too short to take a stop sequence from: {text!r}")
    stopped = ask(server, "Tell me a story.", scope="stops", max_tokens=16, stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.index(stop)]


def test_fields_the_server_has_no_use_for_are_accepted(server: ServerProcess) -> None:
    document = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            },
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": []},
        "output_config": {"effort": "low"},
        "metadata": {"user_id": "u"},
    }
    status, answer, _ = raw_post(
        server,
        "/v1/messages?beta=true",
        json.dumps(document).encode(),
        {"anthropic-beta": "interleaved-thinking"},
    )
    assert status == 200, answer
    assert answer["type"] == "message"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "JSON"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(), "max_tokens"),
        (json.dumps({"model": "m", "max_tokens": 4, "messages": []}).encode(), "messages"),
        (
            json.dumps(
                {
                    "model": "m",
                    "max_tokens": 4,
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "42"}],
                        }
                    ],
                }
            ).encode(),
            "toolu_x",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tool_choice": {"type": "tool", "name": "missing"},
                    "tools": [{"name": "present", "input_schema": {"type": "object"}}],
                }
            ).encode(),
            "missing",
        ),
        (
            json.dumps(
                {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "\ud800"}]}
            ).encode(),
            "surrogate",
        ),
    ],
    ids=[
        "not json",
        "no max_tokens",
        "no messages",
        "tool_result without tool_use",
        "unknown tool",
        "surrogate",
    ],
)
def test_bad_requests_get_anthropic_s_error_shape(server: ServerProcess, body: bytes, expected: str) -> None:
    status, answer, _ = raw_post(server, "/v1/messages", body)
    assert status == 400, answer
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert expected in answer["error"]["message"], answer


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_prompt_longer_than_the_context_names_the_flag_to_raise(
    server: ServerProcess, stream: bool
) -> None:
    with client(server) as api, pytest.raises(anthropic.BadRequestError) as raised:
        api.messages.create(
            model="m", max_tokens=4, stream=stream, messages=[{"role": "user", "content": "word " * 1000}]
        )
    error = raised.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert "--n-ctx" in error["message"], error


def test_claude_code_s_billing_line_does_not_cost_the_next_session_its_prefix(server: ServerProcess) -> None:
    def session(nonce: str) -> Any:
        system = [{"type": "text", "text": BILLING.format(nonce)}, {"type": "text", "text": LONG_SYSTEM}]
        return ask(server, f"Session {nonce}: list my files.", scope="billing", system=system)

    first = session("1c0")
    second = session("871")
    assert first.usage.cache_read_input_tokens == 0
    # Restored up to the question: the system text after the line is the second session's too.
    assert second.usage.cache_read_input_tokens > 4 * second.usage.input_tokens, second.usage
    status, why, _ = http_json("GET", f"{server.base_url}/snapcache/why?scope=billing")
    assert status == 200, why
    assert why["prompt_rules"]["matched_in_last_request"] == ["claude-code-billing-header"]


def test_x_api_key_authenticates_anthropic_clients(tiny_model_path: Path, tmp_path: Path) -> None:
    with running_server(
        tiny_model_path, tmp_path / "cache", tmp_path / "log.txt", "--api-key", "sekrit"
    ) as server:
        with anthropic.Anthropic(base_url=server.base_url, api_key="sekrit", max_retries=0) as api:
            answer = api.messages.create(
                model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        assert answer.type == "message"
        bearer = {"Authorization": "Bearer sekrit"}
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        assert raw_post(server, "/v1/messages/count_tokens", body, bearer)[0] == 200
        with (
            anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0) as api,
            pytest.raises(anthropic.AuthenticationError) as raised,
        ):
            api.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert raised.value.body["error"]["type"] == "authentication_error"


def _with_question(path: str, question: str) -> dict[str, Any]:
    """A body of `path`'s dialect: the long system prompt, `question`, a short answer."""
    system = {"role": "system", "content": LONG_SYSTEM}
    user = {"role": "user", "content": question}
    if path == "/v1/messages":
        return {"model": "m", "max_tokens": 4, "system": LONG_SYSTEM, "messages": [user]}
    if path == "/v1/responses":
        return {"model": "m", "max_output_tokens": 4, "instructions": LONG_SYSTEM, "input": question}
    if path == "/api/chat":
        return {"model": "m", "options": {"num_predict": 4}, "messages": [system, user]}
    return {"model": "m", "max_tokens": 4, "messages": [system, user]}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses", "/v1/chat/completions", "/api/chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_dialect_says_in_its_headers_what_it_reused(
    server: ServerProcess, path: str, stream: bool
) -> None:
    """`X-Snapcache-Restored-Tokens` and `X-Snapcache-Source`, as text completions have them: the
    second question under the same system prompt restores it."""
    scope = f"headers-{path.strip('/').replace('/', '-')}-{stream}"
    seen = []
    for question in ("Where did I save the invoice?", "Which folder holds the receipts?"):
        request = urllib.request.Request(
            server.base_url + path,
            data=json.dumps({**_with_question(path, question), "stream": stream}).encode(),
            headers={"Content-Type": "application/json", "X-Snapcache-Scope": scope},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()
            headers = response.headers
            seen.append((headers["x-snapcache-source"], int(headers["x-snapcache-restored-tokens"])))
    assert seen[0] == ("none", 0)
    source, restored = seen[1]
    assert source in {"ram", "context"}, seen
    assert restored >= 64, seen
