"""schemathesis against a real `snapcache serve`: requests generated from the server's own
/openapi.json, valid and invalid, each answered as the schema says: a valid body with a 2xx, an
invalid one with a documented 4xx in JSON, never a 5xx, and credentials asked for only where the
server takes them (every check schemathesis has, `--checks all`).

The quick test runs schemathesis's examples and coverage phases with a fixed seed; the `fuzz` test
adds its random fuzzing phase for SNAPCACHE_FUZZ_SECONDS (default 120). Both run schemathesis's own
command line in a new process, with this module as its hooks module: it caps answers' lengths, says
how to write a grammar, and makes a body generated as valid follow the rules that its schema states
in words only (see `follow_the_rules`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from hypothesis import strategies as st
from server_process import ServerProcess, http_json, running_server

from snapcache.server.openapi import GRAMMAR_FORMAT

pytestmark = [pytest.mark.model, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
QUICK_SEED = 34
API_KEY = "schema-key"
# The tiny model's answers are random bytes, and llama-cpp-python's streaming decoder retries every
# prefix of the bytes it cannot decode yet at each token: cubic in a stream's length (a 250-token
# stream of them takes over a minute). Streamed answers are kept short, and others short enough that
# a run of thousands of requests takes minutes on 2 cores.
STREAMED_TOKENS = 16
ANSWER_TOKENS = 64
# Room for the prompts fuzzing writes (the tiny model reads a token per byte; tools go in the
# prompt): a prompt that does not fit is a 400 no schema can foretell.
N_CTX = 8192
# The server's words for such a 400: its own dialects', and the OpenAI routes' error code.
_TOO_LONG_FOR_THE_CONTEXT = re.compile(r"does not fit the model's context|\bcontext_length_exceeded\b")
# The Messages and Responses routes read every answer as a stream (to match stop sequences as the
# text comes): their answers are kept short, streamed or not.
ALWAYS_STREAMED = ("/v1/messages", "/v1/responses")
LIMITS = ("max_tokens", "max_output_tokens", "max_completion_tokens")
# A system prompt long enough to warm: chats with it share more than 64 tokens.
WARM_TEXT = "You answer questions about the files in this folder, briefly and in plain words. " * 3


def body_validator(document: dict[str, Any], path: str) -> Any:
    """A validator of `POST path`'s JSON body, as `document` (the server's schema) documents it."""
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    root = {
        **schema,
        "components": document["components"],
        "$schema": "https://json-schema.org/draft/2020-12/schema",
    }
    return jsonschema_rs.validator_for(root)


# Grammars llama.cpp parses, for the schema's `gbnf` format.
_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ", max_size=12)
schemathesis.openapi.format(
    GRAMMAR_FORMAT,
    st.one_of(
        _WORD.map(lambda word: f'root ::= "{word}"'),
        st.sampled_from(["root ::= [a-z]+", 'root ::= ("yes" | "no") "."', "root ::= [0-9]{1,3}"]),
    ),
)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Cap the length of answers (see STREAMED_TOKENS; a lower cap leaves a body as valid or invalid
    as it was); a body generated as valid is made to follow the rules its schema states only in
    words (see `follow_the_rules`)."""
    body = case.body
    if not isinstance(body, dict):
        return
    if case.meta is not None and case.meta.generation.mode.is_positive:
        follow_the_rules(case.path, body)
    cap = STREAMED_TOKENS if body.get("stream") is True or case.path in ALWAYS_STREAMED else ANSWER_TOKENS
    for name in LIMITS:
        limit = body.get(name)
        if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > cap:
            body[name] = cap


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but two that are not the schema's to foretell.

    "Schema-valid request rejected" where the prompt did not fit the context: how many tokens a
    body makes is the model's tokenizer's and the chat template's to say (see N_CTX). The 400 must
    be the one that says so, in the route's own shape.

    "Schema-violating request accepted" for a body that its schema takes: schemathesis 4.32 pins a
    discriminated union's tag inside each branch (`allOf` with an `enum`) and negates that pin; a
    body it labels invalid that way can still be valid (a `tool_choice` of `{"type": "auto"}`). Such
    a body is checked again against the schema the server publishes.
    """
    if failure.code == "ST202":
        return not (response.status_code == 400 and _TOO_LONG_FOR_THE_CONTEXT.search(response.text_lossy()))
    if failure.code != "ST201" or not isinstance(case.body, dict) or case.meta is None:
        return True
    negative = {place.name for place, info in case.meta.components.items() if info.mode.is_negative}
    if negative != {"BODY"}:
        return True
    return not body_validator(case.operation.schema.raw_schema, case.path).is_valid(case.body)


def follow_the_rules(path: str, body: dict[str, Any]) -> None:
    """Make a valid body follow what JSON Schema cannot say: a tool chosen by name is among the
    tools, a tool result answers an earlier call, and a prompt to warm is long enough to store."""
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "tool":
            tools = body["tools"] = [t for t in body.get("tools") or [] if t.get("name") != choice["name"]]
            tools.append({"name": choice["name"], "input_schema": {"type": "object"}})
        body["messages"] = _anthropic_calls_before_results(body["messages"])
    elif path == "/v1/responses":
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            tools = body["tools"] = [t for t in body.get("tools") or [] if t.get("name") != choice["name"]]
            tools.append({"type": "function", "name": choice["name"]})
        if isinstance(body["input"], list):
            body["input"] = _responses_calls_before_outputs(body["input"])
    elif path == "/v1/chat/completions":
        _chat_rules(body)
    elif path == "/api/chat":
        _ollama_chat_rules(body)
    elif path == "/snapcache/warm":
        holder, name = next(
            ((body, name) for name in ("system", "prompt") if isinstance(body.get(name), str)),
            (body["messages"][0], "content") if isinstance(body.get("messages"), list) else (body, ""),
        )
        if name and not holder[name].startswith(WARM_TEXT):  # a case may be sent more than once
            holder[name] = WARM_TEXT + holder[name]


def _anthropic_calls_before_results(messages: list[Any]) -> list[Any]:
    called: set[str] = set()
    done: list[Any] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            missing = [
                block["tool_use_id"]
                for block in content
                if block.get("type") == "tool_result" and block["tool_use_id"] not in called
            ]
            if missing:
                uses = [{"type": "tool_use", "id": id_, "name": "f", "input": {}} for id_ in missing]
                done.append({"role": "assistant", "content": uses})
            called.update(block["id"] for block in content if block.get("type") == "tool_use")
        done.append(message)
    return done


def _responses_calls_before_outputs(items: list[Any]) -> list[Any]:
    called: set[str] = set()
    done: list[Any] = []
    for item in items:
        if item.get("type") == "function_call_output" and item["call_id"] not in called:
            done.append({"type": "function_call", "call_id": item["call_id"], "name": "f", "arguments": "{}"})
        if item.get("type") in ("function_call", "function_call_output"):
            called.add(item["call_id"])
        done.append(item)
    return done


def _chat_rules(body: dict[str, Any]) -> None:
    """A Chat Completions body as the server takes it: function names apart, the function a choice
    names (or `required` needs) among them (in `functions` where it offers those, which win), and
    every tool result after its call."""
    if body.get("functions") is not None:
        _functions_apart(body, "functions", lambda f: f, lambda name: {"name": name})
        call = body.get("function_call")
        if isinstance(call, dict) and all(f["name"] != call["name"] for f in body["functions"]):
            body["functions"].append({"name": call["name"], "parameters": {"type": "object"}})
    else:
        _functions_apart(
            body,
            "tools",
            lambda tool: tool.get("function") if tool.get("type") == "function" else None,
            lambda name: {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}},
        )
    called: set[str] = set()
    messages: list[Any] = []
    for message in body["messages"]:
        answered = message.get("tool_call_id")
        if message.get("role") == "tool" and answered not in called:
            call = {"id": answered, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            called.add(answered)
        called.update(call["id"] for call in message.get("tool_calls") or [])
        messages.append(message)
    body["messages"] = messages


def _ollama_chat_rules(body: dict[str, Any]) -> None:
    """An Ollama chat as the server takes it: function names apart, every tool result after a call
    it answers, and some message besides system text where there are messages."""
    functions: set[str] = set()
    tools: list[Any] = []
    for tool in body.get("tools") or []:
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if function is not None and function["name"] in functions:
            continue
        if function is not None:
            functions.add(function["name"])
        tools.append(tool)
    if body.get("tools") is not None:
        body["tools"] = tools
    if not body.get("messages"):
        return
    messages: list[Any] = []
    for message in body["messages"]:
        if message.get("role") == "tool":  # a call of its own just before it, as the result names it
            call: dict[str, Any] = {"function": {"name": message.get("tool_name") or "f", "arguments": {}}}
            if message.get("tool_call_id"):
                call["id"] = message["tool_call_id"]
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append(message)
    if messages and all(message.get("role") == "system" for message in messages):
        messages.append({"role": "user", "content": "hi"})
    body["messages"] = messages


def _functions_apart(
    body: dict[str, Any], field: str, function_of: Callable[[Any], Any], offered: Callable[[str], Any]
) -> None:
    """`body[field]` with one function of each name, and the one `tool_choice` names (or some
    function, where it is `required`) among them."""
    names: set[str] = set()
    kept: list[Any] = []
    for item in body.get(field) or []:
        function = function_of(item)
        if function is not None and function["name"] in names:
            continue
        if function is not None:
            names.add(function["name"])
        kept.append(item)
    choice = body.get("tool_choice") if field == "tools" else None
    wanted = choice["function"]["name"] if isinstance(choice, dict) else "f" if choice == "required" else None
    if wanted is not None and wanted not in names:
        kept.append(offered(wanted))
    if body.get(field) is not None or wanted is not None:
        body[field] = kept


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server whose answers stay short (16 tokens unless a request asks), with a context that holds
    the prompts schemathesis writes."""
    home = tmp_path_factory.mktemp("schema")
    with running_server(
        tiny_model_path, home / "cache", home / "server.log", "--max-tokens-default", "16", n_ctx=N_CTX
    ) as running:
        # The first completion measures the model's alignment; let it not count against the run.
        body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        assert http_json("POST", running.api_url + "/chat/completions", body)[0] == 200
        yield running


def run_schemathesis(
    server: ServerProcess, report: Path, *extra: str, phases: str, seed: int, seconds: int
) -> str:
    """schemathesis's output, every check on; the test fails if it found anything."""
    command = [
        *("run", f"{server.base_url}/openapi.json", "--phases", phases, "--checks", "all"),
        *("--seed", str(seed), "--max-time", str(seconds), "--request-timeout", "60", "--workers", "1"),
        # Its default limit (10 s) is the time of a long answer on 2 busy cores, not a schema's.
        *("--max-response-time", "60", "--continue-on-failure", "--output-sanitize", "false"),
        *("--no-color", "--generation-database", "none", "--report", "junit", "--report-dir", str(report)),
        *extra,
    ]
    launcher = "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())"
    path = os.pathsep.join(filter(None, [str(HERE), str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "SCHEMATHESIS_HOOKS": Path(__file__).stem, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", launcher, *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=report.parent,
        timeout=seconds + 120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "Traceback" not in server.log(), server.log()[-6000:]
    assert server.process.poll() is None, "the server died"
    return output


def generated_cases(output: str) -> int:
    found = re.search(r"(\d+) generated, \1 passed", output)
    assert found is not None, output[-3000:]
    return int(found.group(1))


def openapi(server: ServerProcess) -> dict[str, Any]:
    status, document, _ = http_json("GET", f"{server.base_url}/openapi.json")
    assert status == 200
    return dict(document)


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]


def test_examples_and_coverage_pass_every_check(server: ServerProcess, tmp_path: Path) -> None:
    output = run_schemathesis(
        server, tmp_path / "report", phases="examples,coverage", seed=QUICK_SEED, seconds=150
    )
    for phase in ("Examples", "Coverage"):
        assert re.search(rf"✅\s+{phase}", output), output[-3000:]
    cases = generated_cases(output)
    print(f"schemathesis examples and coverage, every check: {cases} cases, none failed")
    assert cases >= 1500, "fewer cases than the schema gives: was the run cut short?"


@pytest.mark.fuzz
def test_fuzzing_passes_every_check(server: ServerProcess, tmp_path: Path) -> None:
    seconds = int(os.environ.get("SNAPCACHE_FUZZ_SECONDS", "120"))
    seed = int(os.environ.get("SNAPCACHE_FUZZ_SEED", str(QUICK_SEED)))
    output = run_schemathesis(server, tmp_path / "report", phases="fuzzing", seed=seed, seconds=seconds)
    cases = generated_cases(output)
    print(f"schemathesis fuzzing, seed {seed}, {seconds} s, every check: {cases} cases, none failed")
    assert cases >= 100


def test_without_an_api_key_the_schema_asks_for_no_credentials(server: ServerProcess) -> None:
    document = openapi(server)
    assert "securitySchemes" not in document["components"]
    for path, method, operation in operations(document):
        assert "security" not in operation, (method, path)
        assert "401" not in operation["responses"], (method, path)
    status, _, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
    assert status == 200


def test_with_an_api_key_every_route_asks_for_it_and_answers_401_without_it(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    with running_server(tiny_model_path, tmp_path / "cache", tmp_path / "log", "--api-key", API_KEY) as keyed:
        document = openapi(keyed)
        schemes = document["components"]["securitySchemes"]
        assert schemes["HTTPBearer"] == {"type": "http", "scheme": "bearer"}
        assert schemes["APIKeyHeader"]["name"] == "x-api-key"
        for path, method, operation in operations(document):
            named = {name for option in operation["security"] for name in option}
            dialect = path == "/" or path.startswith(("/v1/messages", "/v1/responses", "/v1/chat/", "/api/"))
            assert named == ({"HTTPBearer", "APIKeyHeader"} if dialect else {"HTTPBearer"}), path
            assert "401" in operation["responses"], (method, path)
        # schemathesis's own checks of the credentials: sent, left out, wrong.
        output = run_schemathesis(
            keyed,
            tmp_path / "report",
            *("--header", f"Authorization: Bearer {API_KEY}"),
            phases="examples",
            seed=QUICK_SEED,
            seconds=60,
        )
        assert generated_cases(output) >= 10


def test_embeddings_are_left_out_of_the_schema_and_refused_in_openai_s_shape(server: ServerProcess) -> None:
    assert "/v1/embeddings" not in openapi(server)["paths"]
    status, answer, _ = http_json("POST", f"{server.api_url}/embeddings", b'{"input": "hi"}')
    assert status == 400, answer
    assert answer["error"]["code"] == "unsupported_endpoint"
    assert answer["error"]["type"] == "invalid_request_error"
    assert "embeddings" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {}, 400),
        ("/v1/chat/completions", {"messages": []}, 400),
        ("/snapcache/warm", {}, 400),
        ("/snapcache/warm", {"system": WARM_TEXT, "prompt": WARM_TEXT}, 400),
        ("/snapcache/warm", {"messages": [{"role": "user", "content": WARM_TEXT}]}, 400),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
            400,
        ),
        ("/v1/responses", {"input": [{"role": "developer", "content": "x"}]}, 400),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"100000": 1}},
            400,
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "grammar": "root ::= [a-z]+",
                "response_format": {"type": "json_object"},
            },
            400,
        ),
        ("/v1/completions", {"prompt": "hi", "logprobs": 1}, 400),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"100000": 1}}, 400),
        ("/v1/completions", {"prompt": "hi", "grammar": "root ::= root"}, 400),
    ],
    ids=[
        "chat: no body",
        "chat: no messages",
        "warm: no body",
        "warm: two texts",
        "warm: no system message",
        "messages: system text only",
        "responses: developer text only",
        "chat: logprobs",
        "chat: logit_bias: no such token",
        "chat: a grammar and a response format",
        "logprobs",
        "logit_bias: no such token",
        "grammar llama.cpp cannot parse",
    ],
)
def test_bodies_the_server_refuses_are_invalid_in_its_schema(
    server: ServerProcess, path: str, body: dict[str, Any], status: int
) -> None:
    document = openapi(server)
    answered, answer, _ = http_json("POST", server.base_url + path, json.dumps(body).encode())
    assert answered == status, answer
    if "grammar" in body:
        return  # the schema says it by its format: a grammar llama.cpp parses
    assert not body_validator(document, path).is_valid(body), "the schema documents a body the server refuses"
