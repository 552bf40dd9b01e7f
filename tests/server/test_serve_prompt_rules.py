"""What `snapcache serve` takes out of prompts before rendering them: Claude Code's per-session billing
line (unless `--keep-billing-header`) and the user's `--normalize REGEX` rules, in all three APIs,
with a real server process and the official clients; and the default context the server gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from chat_support import SYSTEM
from server_process import ServerProcess, free_port, http_json, running_server
from typer.testing import CliRunner

from snapcache.server import SERVE_N_CTX, serve_context_size
from snapcache_cli.app import app

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

DATE_RULE = r"^Today is .*$"
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.{}; cc_entrypoint=sdk-cli;"
LONG_SYSTEM = SYSTEM * 2


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("rules")
    with running_server(
        tiny_model_path, home / "cache", home / "log.txt", "--normalize", DATE_RULE, "--keep-billing-header"
    ) as running:
        yield running


def matched(server: ServerProcess, scope: str) -> list[str]:
    status, why, _ = http_json("GET", f"{server.base_url}/snapcache/why?scope={scope}")
    assert status == 200, why
    return list(why["prompt_rules"]["matched_in_last_request"])


def dated(day: str) -> str:
    return f"Today is {day}.\n{LONG_SYSTEM}"


def test_a_rule_takes_a_date_line_out_of_chat_completions(server: ServerProcess) -> None:
    headers = {"X-Snapcache-Scope": "chat"}
    with openai.OpenAI(
        base_url=server.api_url, api_key="unused", max_retries=0, default_headers=headers
    ) as api:
        cached = []
        for day, question in (("Monday", "What is due?"), ("Tuesday", "What is next?")):
            reply = api.chat.completions.create(
                model="m",
                max_tokens=4,
                temperature=0,
                messages=[{"role": "system", "content": dated(day)}, {"role": "user", "content": question}],
            )
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0
    assert cached[1] >= 64, cached
    assert matched(server, "chat") == [DATE_RULE]


def test_a_rule_takes_a_date_line_out_of_responses_instructions(server: ServerProcess) -> None:
    headers = {"X-Snapcache-Scope": "responses"}
    with openai.OpenAI(
        base_url=server.api_url, api_key="unused", max_retries=0, default_headers=headers
    ) as api:
        answers = [
            api.responses.create(
                model="m", instructions=dated(day), input="What is due?", max_output_tokens=4
            )
            for day in ("Monday", "Tuesday")
        ]
    assert answers[1].usage.input_tokens_details.cached_tokens >= 64, answers[1].usage
    assert matched(server, "responses") == [DATE_RULE]


def test_the_billing_line_kept_on_request_costs_the_next_session_its_prefix(server: ServerProcess) -> None:
    def session(nonce: str) -> Any:
        system = [{"type": "text", "text": BILLING.format(nonce)}, {"type": "text", "text": LONG_SYSTEM}]
        with anthropic.Anthropic(
            base_url=server.base_url,
            api_key="unused",
            max_retries=0,
            default_headers={"X-Snapcache-Scope": "kept"},
        ) as api:
            return api.messages.create(
                model="m",
                max_tokens=4,
                system=system,
                messages=[{"role": "user", "content": "List my files."}],
            )

    session("1c0")
    second = session("871")
    # The sessions part 45 characters into the system text: all after that is read again.
    assert second.usage.input_tokens > 4 * second.usage.cache_read_input_tokens, second.usage
    assert matched(server, "kept") == []


def test_a_rule_that_is_not_a_regular_expression_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", str(tmp_path / "no-model.gguf"), "--normalize", "(unclosed"])
    assert result.exit_code != 0
    assert "--normalize" in result.output
    assert "Traceback" not in result.output


def test_the_default_context_fits_agents_or_the_model_s_own(
    tiny_model_path: Path, gemma_model_path: Path
) -> None:
    assert SERVE_N_CTX >= 32768
    assert serve_context_size(tiny_model_path) == 4096  # the tiny model is trained for 4096
    assert serve_context_size(gemma_model_path) == 32768
    shown = subprocess.run(
        [sys.executable, "-m", "snapcache", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "default 32768" in shown.stdout
    assert "--parallel 4" in shown.stdout


def test_a_server_started_without_n_ctx_serves_the_model_s_trained_context(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "snapcache", "--cache-dir", str(tmp_path), "serve", str(tiny_model_path)]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--threads", "2", "--parallel", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1/messages"

    def ask(characters: int) -> tuple[int, Any]:
        # One token per byte: a prompt of about `characters` tokens.
        document = {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x" * characters}],
        }
        status, answer, _ = http_json("POST", url, json.dumps(document).encode())
        return status, answer

    try:
        deadline = time.monotonic() + 120
        while http_json("GET", f"http://127.0.0.1:{port}/v1/models")[0] != 200:
            assert process.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        status, answer = ask(3000)  # more than the tests' usual 2048, within the tiny model's 4096
        assert status == 200, answer
        status, answer = ask(5000)
        assert status == 400
        assert "--n-ctx" in answer["error"]["message"]
    finally:
        process.kill()
        process.wait(timeout=30)
