"""`snapcache serve`'s options and token limits: global options after the command, the default cap
on generated tokens, and `max_completion_tokens`, with a real server and the real `openai` client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, http_json, running_server, start_server, wait_until_written
from typer.testing import CliRunner

from snapcache import SnapshotKey, SnapshotStore
from snapcache_cli.app import app

openai = pytest.importorskip("openai")

# Token ids of the tiny test model: <unk>, <s> and </s>, then one token per byte (3 + byte).
_CONTROL = (0, 1, 2)
_NON_ASCII = range(3 + 0x80, 3 + 0x100)
# Every generated token an ASCII character, and no end of text: an answer runs to its limit, one
# character per token, so the answer's length counts its tokens.
TO_THE_LIMIT = {str(token): -100.0 for token in (*_CONTROL, *_NON_ASCII)}


def put_one(directory: Path) -> None:
    with SnapshotStore(directory) as store:
        key = SnapshotKey.for_tokens("cafe" * 8, "default", [1, 2, 3])
        store.put(key, [1, 2, 3], b"state")


@pytest.mark.parametrize(
    "args",
    [
        ["--cache-dir", "{dir}", "stats", "--json"],
        ["stats", "--json", "--cache-dir", "{dir}"],
        ["stats", "--cache-dir={dir}", "-v", "--json"],
        ["-v", "stats", "--json", "--cache-dir", "{dir}"],
    ],
    ids=["before", "after", "after, with =", "split"],
)
def test_global_options_before_or_after_the_command(tmp_path: Path, args: list[str]) -> None:
    directory = tmp_path / "cache"
    put_one(directory)
    result = CliRunner().invoke(app, [arg.format(dir=directory) for arg in args])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["cache_dir"] == str(directory)
    assert shown["snapshots"] == 1


def test_ls_reads_the_cache_directory_given_after_it(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    put_one(directory)
    after = CliRunner().invoke(app, ["ls", "--json", "--cache-dir", str(directory)])
    default = CliRunner().invoke(app, ["ls", "--json"])
    assert after.exit_code == default.exit_code == 0, after.output
    assert len(json.loads(after.stdout)) == 1
    assert json.loads(default.stdout) == []


def test_a_global_option_after_the_command_without_its_value_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["stats", "--cache-dir"])
    assert result.exit_code == 2
    assert "--cache-dir" in result.output
    assert "Traceback" not in result.output


def test_serve_takes_the_cache_directory_after_the_command(tiny_model_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "after"
    server = start_server(tiny_model_path, cache, tmp_path / "server.log", global_options_after=True)
    try:
        chat(server, max_tokens=4)
        wait_until_written(server)
    finally:
        server.kill()
    assert f"(cache: {cache})" in server.log()
    assert any(path.suffix in (".snap", ".pack") for path in (cache / "snapshots").iterdir())


def test_serve_help_names_the_default_cap() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "snapcache", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "--max-tokens-default" in shown.stdout
    assert "1024" in shown.stdout


@pytest.fixture(scope="module")
def capped_server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("capped")
    with running_server(
        tiny_model_path, home / "cache", home / "log.txt", "--max-tokens-default", "7"
    ) as server:
        yield server


def chat(server: ServerProcess, **limits: Any) -> Any:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count to ten."}]
    with openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0) as api:
        return api.chat.completions.create(
            model="m", messages=messages, temperature=0, logit_bias=TO_THE_LIMIT, **limits
        )


def test_a_chat_without_a_limit_stops_at_the_default_cap(capped_server: ServerProcess) -> None:
    reply = chat(capped_server)
    assert reply.usage.completion_tokens == 7
    assert len(reply.choices[0].message.content) == 7
    assert reply.choices[0].finish_reason == "length"


def test_max_completion_tokens_caps_a_chat(capped_server: ServerProcess) -> None:
    reply = chat(capped_server, max_completion_tokens=3)
    assert reply.usage.completion_tokens == 3
    assert len(reply.choices[0].message.content) == 3
    # As OpenAI has it, max_completion_tokens wins over the older max_tokens.
    for max_tokens in (2, 20):
        both = chat(capped_server, max_completion_tokens=5, max_tokens=max_tokens)
        assert both.usage.completion_tokens == 5
    assert chat(capped_server, max_tokens=9).usage.completion_tokens == 9


def test_a_text_completion_keeps_its_default_and_caps_no_limit(capped_server: ServerProcess) -> None:
    def tokens(**limits: Any) -> int:
        with openai.OpenAI(base_url=capped_server.api_url, api_key="unused", max_retries=0) as api:
            reply = api.completions.create(
                model="m", prompt="Count: one, two,", temperature=0, logit_bias=TO_THE_LIMIT, **limits
            )
        return int(reply.usage.completion_tokens)

    assert tokens() == 16  # llama-cpp-python's and OpenAI's default for text completions
    assert tokens(max_tokens=0) == 7  # no limit to llama-cpp-python: the server's cap
    assert tokens(extra_body={"max_completion_tokens": 4}) == 4


def test_a_bad_max_completion_tokens_is_a_400(capped_server: ServerProcess) -> None:
    for value in (0, -3, "many", 2.5, True):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": value}
        status, document, _ = http_json(
            "POST", capped_server.api_url + "/chat/completions", json.dumps(body).encode()
        )
        assert status == 400, (value, document)
        assert document["error"]["param"] == "max_completion_tokens"


def test_completion_failures_that_are_the_clients_are_400s() -> None:
    from jinja2 import TemplateError

    from snapcache.server.error_answers import client_error

    error = client_error(TemplateError("Conversation roles must alternate user/assistant"))
    assert error is not None
    assert error["error"]["message"] == (
        "the model's chat template refused the messages: Conversation roles must alternate user/assistant"
    )
    error = client_error(RuntimeError("llama_decode returned 1"))
    assert error is not None
    assert error["error"]["code"] == "context_length_exceeded"
    assert client_error(RuntimeError("something else")) is None
