"""The `snapcache` command on real models: warm with the CLI, then a new process restores the snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from snapcache_cli.app import app

pytestmark = pytest.mark.model

EXAMPLE_PROMPT = Path(__file__).resolve().parents[2] / "examples" / "system_prompt.txt"
QUESTION = "Which tools can you use?"
runner = CliRunner()

# A chat in a fresh interpreter, as an application would run one after `snapcache warm`.
CHAT_IN_NEW_PROCESS = """
import json, sys
from snapcache import CachedLlama, SnapshotStore, load_llama

model, prompt_file, question, n_ctx = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
llm = load_llama(model, n_ctx=n_ctx, n_threads=2)
with SnapshotStore() as store:
    cached = CachedLlama(llm, store)
    messages = [
        {"role": "system", "content": open(prompt_file, encoding="utf-8").read()},
        {"role": "user", "content": question},
    ]
    cached.create_chat_completion(messages=messages, max_tokens=4, temperature=0.0)
    restore = cached.last_restore
    prompt = llm.detokenize(llm.input_ids[: restore.prompt_tokens].tolist(), special=True)
    print(json.dumps({
        "restored": restore.restored_tokens,
        "prompt": restore.prompt_tokens,
        "prompt_text": prompt.decode("utf-8", "replace"),
    }))
"""


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "snapcache", *args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=600,
        check=False,
    )


def chat_in_new_process(model: Path, prompt_file: Path, n_ctx: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", CHAT_IN_NEW_PROCESS, str(model), str(prompt_file), QUESTION, str(n_ctx)],
        capture_output=True,
        timeout=600,
        check=True,
    )
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


def listed() -> list[dict]:
    result = runner.invoke(app, ["ls", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def short_prompt(tmp_path: Path) -> Path:
    path = tmp_path / "system.txt"
    # About 1,150 tokens of the tiny model's byte vocabulary: the question is a small part of a chat.
    path.write_text("You are a terse assistant. Answer in one line.\n" * 24, encoding="utf-8")
    return path


def test_warm_stores_a_snapshot_a_new_process_restores(tiny_model_path, short_prompt):
    result = run_module(
        "warm", str(short_prompt), "--model", str(tiny_model_path), "--n-ctx", "2048", "--json"
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""  # llama.cpp's own log stays off the terminal
    report = json.loads(result.stdout)
    assert report["from_cache"] is False
    assert report["token_count"] > len(short_prompt.read_text()) // 2  # byte-level vocabulary
    assert report["state_bytes"] > 0
    assert 0 < report["stored_bytes"] <= report["state_bytes"] + 4096

    [entry] = listed()
    assert entry["id"] == report["key"]
    assert entry["scope"] == "default"
    assert entry["token_count"] == report["token_count"]

    chat = chat_in_new_process(tiny_model_path, short_prompt, n_ctx=2048)
    assert chat["restored"] >= 0.95 * chat["prompt"]
    assert chat["restored"] == report["token_count"]


def test_warm_again_is_served_from_the_cache(tiny_model_path, short_prompt):
    args = ["warm", str(short_prompt), "--model", str(tiny_model_path), "--n-ctx", "2048", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["from_cache"] is True
    assert json.loads(second.stdout)["key"] == json.loads(first.stdout)["key"]
    assert len(listed()) == 1


def test_gpu_layers_are_a_setting_and_a_bad_count_a_clean_error(tiny_model_path, short_prompt):
    """--gpu-layers reaches the model (0 on this build is its default, so the state is found again
    under it); a count below -1 is refused before llama.cpp sees it."""
    args = ["warm", str(short_prompt), "--model", str(tiny_model_path), "--n-ctx", "2048", "--json"]
    first = runner.invoke(app, ["--gpu-layers", "0", *args])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, args, env={"SNAPCACHE_GPU_LAYERS": "0"})
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["from_cache"] is True
    refused = runner.invoke(app, ["--gpu-layers", "-2", *args])
    assert refused.exit_code != 0
    assert "--gpu-layers must be -1 (all), 0 (none) or a number of layers, got -2" in refused.output
    assert "Traceback" not in refused.output


def test_warm_text_output_scope_priority_and_stdin(tiny_model_path, short_prompt):
    text = short_prompt.read_text()
    result = runner.invoke(
        app,
        ["warm", "-", "--model", str(tiny_model_path), "--scope", "agent-a", "--priority", "7", "--raw"],
        input=text,
    )
    assert result.exit_code == 0, result.output
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert lines["scope"].strip() == "agent-a (priority 7)"
    [entry] = listed()
    assert lines["key"].strip() == entry["id"]
    assert entry["priority"] == 7
    assert entry["scope"] == "agent-a"
    assert "read in" in lines["tokens"]


def test_model_from_the_environment(tiny_model_path, short_prompt):
    result = run_module("warm", str(short_prompt), "--json", env={"SNAPCACHE_MODEL": str(tiny_model_path)})
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["model"] == str(tiny_model_path)


def test_prompt_longer_than_the_context(tiny_model_path, tmp_path):
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("x" * 2000, encoding="utf-8")
    result = run_module("warm", str(long_prompt), "--model", str(tiny_model_path), "--n-ctx", "256")
    assert result.returncode == 1
    assert b"Traceback" not in result.stderr
    line = result.stderr.decode().strip()
    assert line.startswith("snapcache: error: the prompt is ")
    assert "--n-ctx" in line
    assert len(line.splitlines()) == 1
    assert listed() == []


def test_a_gguf_llama_cpp_cannot_load_is_one_line(tiny_model_path, short_prompt, tmp_path):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_model_path.read_bytes()[:4096])
    result = run_module("warm", str(short_prompt), "--model", str(truncated))
    assert result.returncode == 1
    assert result.stderr.decode().startswith("snapcache: error: llama.cpp could not load")
    assert len(result.stderr.decode().strip().splitlines()) == 1


def test_inspect_and_rm_a_warmed_snapshot(tiny_model_path, short_prompt):
    warmed = runner.invoke(app, ["warm", str(short_prompt), "--model", str(tiny_model_path), "--json"])
    key = json.loads(warmed.stdout)["key"]
    info = json.loads(runner.invoke(app, ["inspect", key[:8], "--json"]).stdout)
    assert info["verified"] is True
    assert info["token_count"] == json.loads(warmed.stdout)["token_count"]
    assert runner.invoke(app, ["rm", key[:8]]).exit_code == 0
    assert listed() == []


def test_bench_reports_cold_and_warm_and_matching_outputs(tiny_model_path, short_prompt, snapcache_dir):
    result = runner.invoke(
        app, ["bench", str(short_prompt), "--model", str(tiny_model_path), "--max-tokens", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["cold_ttft_s"] > 0
    assert report["warm_ttft_s"] > 0
    assert report["speedup"] == pytest.approx(report["cold_ttft_s"] / report["warm_ttft_s"])
    assert report["outputs_match"] is True
    assert report["cold_output"] == report["warm_output"]
    assert report["restored_tokens"] > 0
    assert report["prompt_tokens"] > report["restored_tokens"]
    assert not snapcache_dir.exists() or listed() == []  # bench leaves the user's cache alone


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_default_model_warm_then_new_process_restores(gemma_model_path, monkeypatch):
    monkeypatch.delenv("SNAPCACHE_MODEL", raising=False)
    result = run_module("warm", str(EXAMPLE_PROMPT), "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    report = json.loads(result.stdout)
    assert Path(report["model"]) == gemma_model_path
    assert report["token_count"] > 1000

    chat = chat_in_new_process(gemma_model_path, EXAMPLE_PROMPT, n_ctx=4096)
    # Gemma 3's template: the system prompt opens the first user turn, the model's turn ends the prompt.
    system = EXAMPLE_PROMPT.read_text(encoding="utf-8")
    assert chat["prompt_text"].startswith("<bos><start_of_turn>user\n" + system[:200])
    assert chat["prompt_text"].endswith(f"{QUESTION}<end_of_turn>\n<start_of_turn>model\n")
    assert chat["restored"] >= 0.95 * chat["prompt"]
    assert chat["restored"] <= report["token_count"]


def test_warm_inexact_keeps_its_snapshot_apart_from_exact_ones(tiny_model_path, short_prompt):
    base = ["warm", str(short_prompt), "--model", str(tiny_model_path), "--n-ctx", "2048", "--json"]
    inexact = runner.invoke(app, [*base, "--inexact"])
    assert inexact.exit_code == 0, inexact.output
    exact = runner.invoke(app, base)
    assert exact.exit_code == 0, exact.output
    # The same prompt, two fingerprints: the exact warm did not find the inexact state.
    assert json.loads(exact.stdout)["from_cache"] is False
    assert json.loads(exact.stdout)["key"] != json.loads(inexact.stdout)["key"]
    assert len(listed()) == 2

    with_server = runner.invoke(app, [*base[:2], "--inexact", "--server", "http://127.0.0.1:9"])
    assert with_server.exit_code != 0
    assert "--inexact belong to the server" in with_server.output


def test_kv_cache_keeps_its_snapshots_apart_and_every_command_finds_its_own(
    wide_heads_model_path, short_prompt
):
    base = ["warm", str(short_prompt), "--model", str(wide_heads_model_path), "--n-ctx", "2048", "--json"]
    quantized = runner.invoke(app, [*base, "--kv-cache", "q8_0"])  # a global option after the command
    assert quantized.exit_code == 0, quantized.output
    assert json.loads(quantized.stdout)["from_cache"] is False
    again = runner.invoke(app, ["--kv-cache", "q8_0", *base])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["from_cache"] is True
    from_env = runner.invoke(app, base, env={"SNAPCACHE_KV_CACHE": "q8_0"})
    assert from_env.exit_code == 0, from_env.output
    assert json.loads(from_env.stdout)["key"] == json.loads(quantized.stdout)["key"]
    assert json.loads(from_env.stdout)["from_cache"] is True
    plain = runner.invoke(app, base)  # F16: another fingerprint, so the quantized state is not used
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["from_cache"] is False
    assert json.loads(plain.stdout)["key"] != json.loads(quantized.stdout)["key"]
    assert len(listed()) == 2


def test_swa_cache_keeps_its_snapshots_apart_and_why_names_it(tmp_path, short_prompt):
    from tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny-gemma2.gguf", "gemma2")
    base = ["warm", str(short_prompt), "--model", str(model), "--n-ctx", "2048", "--json"]
    full = runner.invoke(app, [*base, "--swa-cache", "full"])
    assert full.exit_code == 0, full.output
    assert json.loads(full.stdout)["from_cache"] is False
    again = runner.invoke(app, base, env={"SNAPCACHE_SWA_CACHE": "full"})
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["from_cache"] is True
    # the default, window: another fingerprint, which `why` names
    why = runner.invoke(app, ["why", str(short_prompt), "--model", str(model), "--n-ctx", "2048"])
    assert why.exit_code == 0, why.output
    assert "--swa-cache" in why.output, why.output
    window = runner.invoke(app, base)
    assert window.exit_code == 0, window.output
    assert json.loads(window.stdout)["from_cache"] is False
    assert json.loads(window.stdout)["key"] != json.loads(full.stdout)["key"]
    assert json.loads(runner.invoke(app, [*base, "--swa-cache", "window"]).stdout)["from_cache"] is True


def test_an_unknown_swa_cache_is_one_line(wide_heads_model_path, short_prompt):
    result = run_module(
        "--swa-cache", "half", "warm", str(short_prompt), "--model", str(wide_heads_model_path)
    )
    assert result.returncode != 0
    message = result.stderr.decode().strip()
    assert message == "snapcache: error: --swa-cache must be one of full, window, got 'half'"


def test_an_unknown_kv_cache_is_one_line(wide_heads_model_path, short_prompt):
    result = run_module("--kv-cache", "f32", "warm", str(short_prompt), "--model", str(wide_heads_model_path))
    assert result.returncode != 0
    message = result.stderr.decode().strip()
    assert message == "snapcache: error: --kv-cache must be one of f16, q8_0, q4_0, got 'f32'"
