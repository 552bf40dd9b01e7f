"""schemathesis against a real `snapcache serve`: requests generated from the server's own
/openapi.json, valid and invalid, each answered with a 2xx or a documented 4xx in JSON, never a 5xx.

The quick test runs schemathesis's examples and coverage phases with a fixed seed; the `fuzz` test
adds its random fuzzing phase for SNAPCACHE_FUZZ_SECONDS (default 120). Both run schemathesis's own
command line in a new process, with this module as its hooks module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from server_process import ServerProcess, http_json, running_server

pytestmark = [pytest.mark.model, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
QUICK_SEED = 34
# The tiny model's answers are random bytes, and llama-cpp-python's streaming decoder retries every
# prefix of the bytes it cannot decode yet at each token: cubic in a stream's length (a 250-token
# stream of them takes over a minute). Streamed answers are kept short; long answers are generated
# unstreamed, where the same bytes cost little.
STREAMED_TOKENS = 16


# The Messages and Responses routes read every answer as a stream (to match stop sequences as the
# text comes): their answers are kept short, streamed or not.
ALWAYS_STREAMED = ("/v1/messages", "/v1/responses")


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Cap the length of streamed answers (see STREAMED_TOKENS); other requests go as generated."""
    body = case.body
    if not isinstance(body, dict):
        return
    if body.get("stream") is True or case.path in ALWAYS_STREAMED:
        for name in ("max_tokens", "max_output_tokens"):
            limit = body.get(name)
            if isinstance(limit, int) and not isinstance(limit, bool) and limit > STREAMED_TOKENS:
                body[name] = STREAMED_TOKENS


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server whose answers stay short: a 512-token context, 16 tokens unless a request asks."""
    home = tmp_path_factory.mktemp("schema")
    with running_server(
        tiny_model_path, home / "cache", home / "server.log", "--max-tokens-default", "16", n_ctx=512
    ) as running:
        # The first completion measures the model's alignment; let it not count against the run.
        body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        assert http_json("POST", running.api_url + "/chat/completions", body)[0] == 200
        yield running


def run_schemathesis(server: ServerProcess, report: Path, *, phases: str, seed: int, seconds: int) -> str:
    """schemathesis's output; the test fails if it found anything."""
    command = [
        *("run", f"{server.base_url}/openapi.json", "--phases", phases, "--checks", CHECKS),
        *("--seed", str(seed), "--max-time", str(seconds), "--request-timeout", "60", "--workers", "1"),
        *("--no-color", "--generation-database", "none", "--report", "junit", "--report-dir", str(report)),
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


def test_examples_and_coverage_find_no_server_error(server: ServerProcess, tmp_path: Path) -> None:
    output = run_schemathesis(
        server, tmp_path / "report", phases="examples,coverage", seed=QUICK_SEED, seconds=90
    )
    for phase in ("Examples", "Coverage"):
        assert re.search(rf"✅\s+{phase}", output), output[-3000:]
    cases = generated_cases(output)
    print(f"schemathesis examples and coverage: {cases} cases, none failed")
    assert cases >= 500, "fewer cases than the schema gives: was the run cut short?"


@pytest.mark.fuzz
def test_fuzzing_finds_no_server_error(server: ServerProcess, tmp_path: Path) -> None:
    seconds = int(os.environ.get("SNAPCACHE_FUZZ_SECONDS", "120"))
    seed = int(os.environ.get("SNAPCACHE_FUZZ_SEED", str(QUICK_SEED)))
    output = run_schemathesis(server, tmp_path / "report", phases="fuzzing", seed=seed, seconds=seconds)
    cases = generated_cases(output)
    print(f"schemathesis fuzzing, seed {seed}, {seconds} s: {cases} cases, none failed")
    assert cases >= 100
