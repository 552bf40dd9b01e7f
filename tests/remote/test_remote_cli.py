"""The remote tier's budget from the command line: `--remote-budget` and SNAPCACHE_REMOTE_BUDGET."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the remote tier needs the redis client (snapcache[remote])")

from redis_server import running_redis
from typer.testing import CliRunner

from snapcache_cli.app import app

runner = CliRunner()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


def remote_budget(*args: str, env: dict[str, str] | None = None) -> int:
    result = runner.invoke(app, [*args, "stats", "--json"], env=env)
    assert result.exit_code == 0, result.output
    return int(json.loads(result.stdout)["remote"]["budget_bytes"])


def test_the_remote_budget_is_set_by_option_or_environment(tmp_path: Path, redis_url: str) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache"), "--remote", redis_url]
    assert remote_budget(*cache) == 4 << 30
    assert remote_budget(*cache, "--remote-budget", "2GiB") == 2 << 30
    assert remote_budget(*cache, env={"SNAPCACHE_REMOTE_BUDGET": "512M"}) == 512 << 20
    # The option wins over the environment, and may follow the command like the other global options.
    result = runner.invoke(
        app, [*cache, "stats", "--json", "--remote-budget", "1.5GiB"], env={"SNAPCACHE_REMOTE_BUDGET": "1G"}
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["remote"]["budget_bytes"] == int(1.5 * (1 << 30))


@pytest.mark.parametrize("value", ["lots", "-1G", "2XB"])
def test_a_bad_remote_budget_is_one_line(tmp_path: Path, redis_url: str, value: str) -> None:
    result = runner.invoke(
        app, ["--cache-dir", str(tmp_path), "--remote", redis_url, "--remote-budget", value, "stats"]
    )
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("snapcache: error: --remote-budget: not a size"), lines


def test_serve_refuses_a_bad_remote_budget_before_loading_a_model(tmp_path: Path, redis_url: str) -> None:
    command = [sys.executable, "-m", "snapcache", "--cache-dir", str(tmp_path), "serve", "no-such.gguf"]
    command += ["--remote", redis_url, "--remote-budget", "many"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "snapcache: error: --remote-budget: not a size: 'many' (examples: 500M, 2G, 1048576)"
    ]
