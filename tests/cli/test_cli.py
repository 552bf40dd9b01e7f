"""The `snapcache` command: store commands, doctor, and clean failures on bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from snapcache import SnapshotKey, SnapshotStore
from snapcache.key import BLOCK_TOKENS, as_token_array, block_keys
from snapcache_cli.app import app
from snapcache_cli.formatting import format_size, parse_age, parse_size

FINGERPRINT = "cafe" * 8
runner = CliRunner()


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


def run_module(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None):
    """The real command in a new process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "snapcache", *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def put(directory: Path, scope: str, token_count: int, priority: int = 0, state_size: int = 4000) -> str:
    """Store a snapshot of made-up state (the store works on any bytes) and return its key id."""
    tokens = list(range(1, token_count + 1))
    key = SnapshotKey.for_tokens(FINGERPRINT, scope, tokens)
    with SnapshotStore(directory) as store:
        store.put(key, tokens, os.urandom(state_size), priority=priority)
    return key.id


def listed(directory: Path | None = None) -> list[dict]:
    args = ["ls", "--json"] if directory is None else ["--cache-dir", str(directory), "ls", "--json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_clean_failure(result, *expected: str) -> str:
    """One line on stderr, a non-zero exit status, no traceback."""
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    stdout = result.stdout if isinstance(result.stdout, str) else result.stdout.decode()
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code != 0
    assert "Traceback" not in stderr + stdout
    # A library warning (a corrupt file removed) may come first; the error itself is one line.
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("snapcache: warning: ")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("snapcache: error: ")
    for text in expected:
        assert text in lines[0]
    return lines[0]


@pytest.fixture
def three(snapcache_dir: Path) -> dict[str, str]:
    """Three snapshots in the default cache directory: two scopes, two priorities."""
    return {
        "low": put(snapcache_dir, "default", 40, priority=0, state_size=40_000),
        "high": put(snapcache_dir, "agent-a", 20, priority=5, state_size=20_000),
        "other": put(snapcache_dir, "agent-a", 10, priority=0, state_size=10_000),
    }


# -- ls / inspect / rm -------------------------------------------------------------------------------


def test_ls_empty_cache_says_so():
    result = invoke("ls")
    assert result.exit_code == 0
    assert result.stdout.strip() == "no snapshots"
    assert listed() == []


def test_ls_lists_every_snapshot_as_json_and_as_a_table(three):
    rows = listed()
    assert {r["id"] for r in rows} == set(three.values())
    by_id = {r["id"]: r for r in rows}
    assert by_id[three["high"]]["scope"] == "agent-a"
    assert by_id[three["high"]]["priority"] == 5
    assert by_id[three["low"]]["token_count"] == 40
    assert by_id[three["low"]]["state_bytes"] == 40_000
    assert all(r["stored_bytes"] > 0 and r["model_fingerprint"] == FINGERPRINT for r in rows)

    table = invoke("ls").stdout.splitlines()
    assert table[0].split()[:4] == ["KEY", "SCOPE", "TOKENS", "PRIORITY"]
    assert {line.split()[0] for line in table[1:4]} == {i[:12] for i in three.values()}
    assert table[-1].startswith("3 snapshots")


def test_ls_scope_filters(three):
    result = invoke("ls", "--scope", "agent-a", "--json")
    assert {r["id"] for r in json.loads(result.stdout)} == {three["high"], three["other"]}
    assert invoke("ls", "--scope", "nobody").stdout.strip() == "no snapshots in scope 'nobody'"


def test_cache_dir_option_overrides_the_environment(tmp_path, snapcache_dir):
    elsewhere = tmp_path / "elsewhere"
    key_id = put(elsewhere, "default", 5)
    assert [r["id"] for r in listed(elsewhere)] == [key_id]
    assert listed() == []


def test_inspect_by_unique_prefix_verifies_and_prints_metadata(three):
    key_id = three["high"]
    result = invoke("inspect", key_id[:10], "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["id"] == key_id
    assert info["verified"] is True
    assert info["token_count"] == 20
    assert info["state_bytes"] == 20_000
    assert info["first_tokens"] == list(range(1, 17))

    text = invoke("inspect", key_id[:10]).stdout
    assert f"key:          {key_id}" in text
    assert "verified:     ok" in text


def test_inspect_of_a_corrupted_file_fails_cleanly(three, snapcache_dir):
    key_id = three["low"]
    files = [p for p in snapcache_dir.rglob("*") if p.is_file() and key_id in p.name]
    assert len(files) == 1
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    result = invoke("inspect", key_id)
    line = assert_clean_failure(result, key_id[:12], "could not be read or verified")
    assert "dropped" not in line  # the library decides whether a file goes; the warning says which
    assert "snapcache: warning: " in result.stderr
    assert {r["id"] for r in listed()} == {three["high"], three["other"]}


def test_ambiguous_prefix_is_a_clear_error(snapcache_dir):
    ids = [put(snapcache_dir, "default", n) for n in range(1, 40)]
    first = {i[0] for i in ids}
    shared = next(c for c in first if sum(i.startswith(c) for i in ids) > 1)
    line = assert_clean_failure(invoke("inspect", shared), "ambiguous")
    assert f"'{shared}'" in line


@pytest.mark.parametrize("args", [["inspect", "0000"], ["rm", "0000"], ["inspect", "not-hex"]])
def test_unknown_key_is_a_clear_error(three, args):
    assert_clean_failure(invoke(*args))


def test_rm_removes_only_the_named_snapshots(three):
    result = invoke("rm", three["low"][:12], three["other"], "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["removed"]) == {three["low"], three["other"]}
    assert [r["id"] for r in listed()] == [three["high"]]
    assert "removed" in invoke("rm", three["high"][:8]).stdout
    assert listed() == []


# -- prune / clear / stats ---------------------------------------------------------------------------


def test_prune_to_a_size_drops_lowest_priority_then_least_recently_used(three):
    rows = {r["id"]: r for r in listed()}
    keep_only_high = rows[three["high"]]["stored_bytes"] + 100
    dry = invoke("prune", "--max-bytes", str(keep_only_high), "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert set(json.loads(dry.stdout)["removed"]) == {three["low"], three["other"]}
    assert len(listed()) == 3

    result = invoke("prune", "--max-bytes", str(keep_only_high), "--json")
    report = json.loads(result.stdout)
    assert set(report["removed"]) == {three["low"], three["other"]}
    assert report["remaining"] == 1
    assert [r["id"] for r in listed()] == [three["high"]]


def test_prune_within_a_scope_leaves_other_scopes(three):
    result = invoke("prune", "--scope", "agent-a", "--max-bytes", "0", "--json")
    assert set(json.loads(result.stdout)["removed"]) == {three["high"], three["other"]}
    assert [r["id"] for r in listed()] == [three["low"]]


def wait_until_unused_for(directory: Path, seconds: float, timeout: float = 30) -> None:
    """Wait until every entry's recorded last use lies more than `seconds` in the past."""
    deadline = time.monotonic() + timeout
    while True:
        with SnapshotStore(directory) as store:
            last_use = max(entry.last_used_at for entry in store.entries(blocks=True))
        if time.time() - last_use > seconds:
            return
        assert time.monotonic() < deadline, "the entries' last use never aged"
        time.sleep(0.05)


def test_prune_older_than(three, snapcache_dir):
    # The condition prune applies, read from the store itself (uses are recorded in the background).
    wait_until_unused_for(snapcache_dir, 1.0)
    fresh = put(snapcache_dir, "default", 7)  # a second of slack before it counts as unused too
    result = invoke("prune", "--older-than", "1s")
    assert result.exit_code == 0, result.output
    assert "removed 3 snapshots" in result.stdout
    assert [r["id"] for r in listed()] == [fresh]
    assert "removed 0 snapshots" in invoke("prune", "--older-than", "7d").stdout


def test_prune_counts_shared_blocks_apart_from_snapshots(snapcache_dir):
    tokens = list(range(1, 2 * BLOCK_TOKENS + 2))
    with SnapshotStore(snapcache_dir) as store:
        for i, key in enumerate(block_keys(FINGERPRINT, "default", as_token_array(tokens), 2)):
            store.put(key, tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS], os.urandom(3000))
    put(snapcache_dir, "default", 30)
    dry = invoke("prune", "--max-bytes", "0", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would remove 1 snapshot and 2 shared blocks (" in dry.stdout
    assert "; 0 snapshots left (" in dry.stdout
    assert "removed 1 snapshot and 2 shared blocks" in invoke("prune", "--max-bytes", "0").stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["prune"], "--max-bytes"),
        (["prune", "--max-bytes", "lots"], "not a size"),
        (["prune", "--older-than", "yesterday"], "not an age"),
    ],
)
def test_prune_bad_arguments(args, expected):
    assert_clean_failure(invoke(*args), expected)


def test_clear_asks_first(three):
    declined = invoke("clear", input="n\n")
    assert declined.exit_code != 0
    assert "Remove all 3 snapshots" in declined.output
    assert len(listed()) == 3

    accepted = invoke("clear", input="y\n")
    assert accepted.exit_code == 0
    assert "removed 3 snapshots" in accepted.stdout
    assert listed() == []


def test_clear_yes_with_scope(three):
    result = invoke("clear", "--scope", "agent-a", "--yes")
    assert result.exit_code == 0
    assert "removed 2 snapshots" in result.stdout
    assert [r["id"] for r in listed()] == [three["low"]]


def test_stats_counts_scopes_and_bytes(three, snapcache_dir):
    result = invoke("stats", "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["snapshots"] == 3
    assert stats["scopes"] == {"default": 1, "agent-a": 2}
    assert stats["models"] == {FINGERPRINT: 3}
    assert stats["state_bytes"] == 70_000
    assert stats["tokens"] == 70
    assert stats["stored_bytes"] == sum(r["stored_bytes"] for r in listed())
    assert stats["store"]["disk_entries"] == 3
    assert Path(stats["cache_dir"]) == snapcache_dir

    text = invoke("stats").stdout
    assert "snapshots:       3" in text
    assert "agent-a (2), default (1)" in text


@pytest.fixture
def runtime_kept_to_itself(monkeypatch):
    """doctor given a llama.cpp whose libraries keep their C++ runtime to themselves: a GPU build that
    exports it fails doctor (tests/llama/test_cxx_runtime.py), whatever the cache directory holds."""
    from snapcache.llama.setup import cxx_runtime

    monkeypatch.setattr(cxx_runtime, "installed_libraries", lambda: [])


def test_commands_keep_and_report_the_budget_the_cache_was_opened_with(snapcache_dir, runtime_kept_to_itself):
    budget = 50 << 30  # larger than the store's default: the command must not shrink the cache to that
    key_id = put(snapcache_dir, "default", 12)
    with SnapshotStore(snapcache_dir, disk_bytes=budget):
        pass
    stats = json.loads(invoke("stats", "--json").stdout)
    assert stats["disk_budget_bytes"] == budget
    assert stats["store"]["disk_budget_bytes"] == budget
    assert "of 50.0 GiB budget" in invoke("stats").stdout
    for args in (["ls"], ["inspect", key_id], ["doctor"], ["prune", "--older-than", "7d"]):
        assert invoke(*args).exit_code == 0, args
    with SnapshotStore(snapcache_dir, disk_bytes=None) as store:
        assert store.stats().disk_budget_bytes == budget
        assert [e.key.id for e in store.entries()] == [key_id]


# -- doctor ------------------------------------------------------------------------------------------


def test_doctor_reports_llama_cpp_versions_and_the_cache_directory(snapcache_dir):
    """Reads this machine's llama.cpp on purpose. Its build decides one check: the C++ runtime check,
    which fails only on a GPU build whose libraries export their runtime; the rest is ok on any."""
    import llama_cpp

    result = invoke("doctor", "--json")
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    runtime = checks["C++ runtime"]["status"]
    assert runtime != "fail" or report["llama_cpp"]["gpu_offload"] is True
    assert report["ok"] is (runtime != "fail")
    assert result.exit_code == (0 if report["ok"] else 1), result.output
    assert report["versions"]["llama-cpp-python"] == llama_cpp.__version__
    assert report["llama_cpp"]["state_seq_version"] == llama_cpp.LLAMA_STATE_SEQ_VERSION
    assert report["llama_cpp"]["gpu_offload"] == bool(llama_cpp.llama_supports_gpu_offload())
    assert "CPU" in report["llama_cpp"]["backends"]
    assert Path(report["cache_dir"]) == snapcache_dir
    assert checks["permissions"]["status"] == "ok"
    assert checks["free disk"]["detail"].endswith(("B", "KiB", "MiB", "GiB", "TiB"))
    assert checks["store"]["status"] == "ok"
    assert checks["default model"]["status"] in {"ok", "warn"}
    assert checks["C++ runtime"]["status"] in {"ok", "warn", "fail"}
    assert checks["C++ runtime"]["detail"]

    text = invoke("doctor").stdout
    assert "llama.cpp system info:" in text
    assert "] C++ runtime: " in text
    assert f"cache directory:        {snapcache_dir}" in text


@pytest.mark.parametrize(
    ("buffer_type", "setting", "status", "detail"),
    [
        (None, None, "ok", "copied from plain host memory"),
        ("CPU", "2G", "ok", "through CPU memory, at most 2,048 MiB (SNAPCACHE_PINNED_MEMORY)"),
        ("CPU", "0", "ok", "turned off (SNAPCACHE_PINNED_MEMORY=0)"),
        ("CPU", "lots", "warn", "SNAPCACHE_PINNED_MEMORY ignored"),
        ("CPU", "4096T", "warn", "more than half of this machine's"),
    ],
)
def test_doctor_says_how_states_reach_a_gpu(monkeypatch, buffer_type, setting, status, detail):
    """The pinned-memory line of a GPU build (the device's host buffer type is injected here; the
    device suite reads a real one) names the memory states go through, and a setting that is no
    size or more than the machine can pin."""
    from snapcache.llama.state import host_memory
    from snapcache_cli.commands import doctor_backend

    found = None if buffer_type is None else host_memory.HostBufferType(0, buffer_type)
    monkeypatch.setattr(host_memory, "device_host_buffer_type", lambda: found)
    if setting is not None:
        monkeypatch.setenv(host_memory.PINNED_MEMORY_ENV, setting)
    check = doctor_backend.pinned_memory_check()
    assert check.status == status
    assert detail in check.detail


def _device(name: str, kind: str, description: str = "") -> Any:
    from snapcache.llama.state.ggml_devices import Device

    return Device(name, description, kind, 1 << 30, 80 << 30, f"{name}_Host" if kind == "gpu" else "")


@pytest.mark.parametrize(
    ("backends", "status", "detail"),
    [
        ([], "warn", "backend API was not found"),
        ([("CPU", [("CPU", "cpu")])], "ok", "CPU only; for a GPU, rebuild llama-cpp-python with"),
        ([("Vulkan", []), ("CPU", [("CPU", "cpu")])], "warn", "built for Vulkan, but found no GPU"),
        (
            [("CUDA", [("CUDA0", "gpu")]), ("CPU", [("CPU", "cpu")])],
            "ok",
            "CUDA: CUDA0: NVIDIA H200, 80.0 GiB",
        ),
    ],
)
def test_doctor_names_the_backend_and_a_gpu_build_that_found_no_gpu(backends, status, detail):
    from snapcache.llama.state.ggml_devices import Backend
    from snapcache_cli.commands import doctor_backend

    found = [
        Backend(name, tuple(_device(dev, kind, "NVIDIA H200" * (kind == "gpu")) for dev, kind in devices))
        for name, devices in backends
    ]
    check = doctor_backend.backend_check(found)
    assert (check.status, detail in check.detail) == (status, True), check.detail
    assert ("GGML_VK_VISIBLE_DEVICES" in check.detail) == (backends[:1] == [("Vulkan", [])])


@pytest.mark.parametrize(
    ("gpu_layers", "gpus", "n_layers", "place"),
    [
        (-1, [], None, "host memory (no GPU found"),
        (0, ["CUDA0"], 32, "host memory (no layer offloaded"),
        (-1, ["CUDA0"], 32, "CUDA0: NVIDIA H200, 80.0 GiB (every layer offloaded)"),
        (40, ["CUDA0"], 32, "(every layer offloaded)"),
        (10, ["CUDA0"], 32, "for the 10 of 32 layers offloaded, host memory for the rest"),
    ],
)
def test_the_k_v_cache_lives_where_its_layers_run(gpu_layers, gpus, n_layers, place):
    from snapcache.llama.state.ggml_devices import kv_cache_place

    devices = [_device(name, "gpu", "NVIDIA H200") for name in gpus]
    assert place in kv_cache_place(gpu_layers, devices, n_layers)


def test_doctor_fails_on_a_directory_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = invoke("--cache-dir", str(shared), "doctor", "--json")
    assert result.exit_code == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["permissions"]["status"] == "warn"
    assert checks["store"]["status"] == "fail"
    assert "writable by other users" in checks["store"]["detail"]


def test_doctor_creates_neither_the_directory_nor_the_index(tmp_path, runtime_kept_to_itself):
    missing = tmp_path / "not-yet" / "cache"
    result = invoke("--cache-dir", str(missing), "doctor", "--json")
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["permissions"]["status"] == "ok"
    assert checks["store"]["status"] == "ok"
    assert "no cache yet" in checks["store"]["detail"]
    assert not (tmp_path / "not-yet").exists()

    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    result = invoke("--cache-dir", str(empty), "doctor", "--json")
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["store"] == {"name": "store", "status": "ok", "detail": "no snapshots yet"}
    assert list(empty.iterdir()) == []


def test_doctor_counts_the_snapshots_of_an_existing_cache(three):
    checks = {c["name"]: c for c in json.loads(invoke("doctor", "--json").stdout)["checks"]}
    assert checks["store"]["status"] == "ok"
    detail = checks["store"]["detail"]
    assert re.fullmatch(r"opens; 3 snapshots; \S+ \w+ on disk for \S+ \w+ of state", detail)


def test_doctor_names_the_model_settings_that_states_are_found_under(monkeypatch):
    def model_settings(*options: str) -> dict[str, str]:
        checks = {c["name"]: c for c in json.loads(invoke(*options, "doctor", "--json").stdout)["checks"]}
        return checks["model settings"]

    monkeypatch.delenv("SNAPCACHE_KV_CACHE", raising=False)
    monkeypatch.delenv("SNAPCACHE_SWA_CACHE", raising=False)
    monkeypatch.delenv("SNAPCACHE_FLASH_ATTN", raising=False)
    monkeypatch.delenv("SNAPCACHE_GPU_LAYERS", raising=False)
    import llama_cpp

    all_or_none = -1 if llama_cpp.llama_supports_gpu_offload() else 0
    default = model_settings()
    assert default["status"] == "ok"
    assert default["detail"].startswith(
        "--kv-cache f16 (the default), --swa-cache window (the default), --flash-attn auto (the default), "
        f"--gpu-layers {all_or_none} (the default): "
    )
    assert model_settings(
        "--swa-cache", "full", "--kv-cache", "q8_0", "--flash-attn", "on", "--gpu-layers", "0"
    )["detail"].startswith("--kv-cache q8_0, --swa-cache full, --flash-attn on, --gpu-layers 0: ")
    monkeypatch.setenv("SNAPCACHE_SWA_CACHE", "full")
    assert "--swa-cache full," in model_settings()["detail"]


def test_doctor_says_how_the_disk_tier_stores_states_and_who_chose(monkeypatch):
    def compression(*options: str) -> dict[str, str]:
        checks = {c["name"]: c for c in json.loads(invoke(*options, "doctor", "--json").stdout)["checks"]}
        return checks["compression"]

    monkeypatch.delenv("SNAPCACHE_COMPRESSION", raising=False)
    default = compression()
    assert default["status"] == "ok"
    assert default["detail"].startswith("auto (the default): a model's states are stored raw where")
    assert compression("--compression", "zstd")["detail"].startswith("zstd (--compression): every state")
    monkeypatch.setenv("SNAPCACHE_COMPRESSION", "none")
    assert compression()["detail"].startswith("none ($SNAPCACHE_COMPRESSION): every state stored raw")
    assert compression("--compression", "auto")["detail"].startswith("auto (--compression)")
    monkeypatch.setenv("SNAPCACHE_COMPRESSION", "lz4")
    assert compression()["status"] == "fail"
    assert_clean_failure(invoke("ls"), "$SNAPCACHE_COMPRESSION: compression must be one of auto, zstd, none")


def test_an_unknown_compression_is_a_clean_error():
    result = invoke("--compression", "lz4", "ls")
    assert_clean_failure(result, "--compression must be one of auto, zstd, none")


@pytest.mark.skipif(os.name != "posix", reason="POSIX mode bits")
def test_doctor_judges_a_group_writable_directory_as_the_store_does(tmp_path):
    shared = tmp_path / "group"
    shared.mkdir()
    shared.chmod(0o770)
    assert_clean_failure(invoke("--cache-dir", str(shared), "ls"), "writable by other users")
    result = invoke("--cache-dir", str(shared), "doctor", "--json")
    assert result.exit_code == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["permissions"]["status"] == "warn"
    assert "writable by other users" in checks["permissions"]["detail"]
    assert checks["store"]["status"] == "fail"
    assert list(shared.iterdir()) == []


# -- bad input, as a user sees it --------------------------------------------------------------------


def test_unusable_cache_directory_is_one_line(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = run_module("--cache-dir", str(not_a_dir / "cache"), "ls")
    assert_clean_failure(result, "cache directory")


def test_insecure_cache_directory_is_one_line(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert_clean_failure(invoke("--cache-dir", str(shared), "ls"), "writable by other users")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_cache_directory_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert_clean_failure(run_module("--cache-dir", str(locked / "cache"), "ls"))


def test_missing_prompt_file(tmp_path):
    result = run_module("warm", str(tmp_path / "nope.txt"))
    assert_clean_failure(result, "prompt file not found")


def test_empty_prompt_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    assert_clean_failure(run_module("warm", str(empty)), "is empty")
    assert_clean_failure(run_module("warm", "-", stdin=b""), "standard input is empty")


def test_binary_prompt_file(tmp_path):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    assert_clean_failure(run_module("warm", str(binary)), "binary")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    assert_clean_failure(run_module("warm", str(latin1)), "not UTF-8")


def test_model_path_that_does_not_exist(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    result = run_module("warm", str(prompt), "--model", str(tmp_path / "missing.gguf"))
    assert_clean_failure(result, "model file not found", "--model")


def test_model_that_is_not_gguf(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    assert_clean_failure(run_module("warm", str(prompt), "--model", str(fake)), "not a GGUF")
    result = run_module("warm", str(prompt), env={"SNAPCACHE_MODEL": str(fake)})
    assert_clean_failure(result, "not a GGUF", "SNAPCACHE_MODEL")


def test_model_path_that_is_a_directory(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    assert_clean_failure(invoke("warm", str(prompt), "--model", str(tmp_path)), "not a file")


def test_unwritable_cache_directory_for_warm(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))  # never loaded: the store is opened first
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = run_module("--cache-dir", str(not_a_dir), "warm", str(prompt), "--model", str(model))
    assert_clean_failure(result, "cache directory", str(not_a_dir))


def test_no_model_anywhere_names_the_three_ways(tmp_path, monkeypatch):
    from snapcache.llama.setup import demo_model

    monkeypatch.delenv("SNAPCACHE_MODEL", raising=False)
    monkeypatch.setattr(demo_model, "default_model_path", lambda: None)  # the optional package is absent
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    line = assert_clean_failure(invoke("warm", str(prompt)), "--model", "SNAPCACHE_MODEL", "snapcache[demo]")
    assert line.startswith("snapcache: error: no model")


@pytest.mark.model
@pytest.mark.parametrize("command", ["warm", "bench"])
def test_a_system_prompt_too_short_to_cache_says_so(command, tiny_model_path, tmp_path, snapcache_dir):
    prompt = tmp_path / "short.txt"
    prompt.write_text("Be brief.", encoding="utf-8")
    result = invoke(command, str(prompt), "--model", str(tiny_model_path), "--n-ctx", "512")
    line = assert_clean_failure(result, "too short")
    assert "cannot render a system message" not in line  # the chat format renders it fine
    assert listed() == []


def test_usage_errors_exit_2_without_traceback():
    result = run_module("prune", "--max-bytes")
    assert result.returncode == 2
    assert b"Traceback" not in result.stderr


def test_python_dash_m_and_version():
    result = run_module("--version")
    assert result.returncode == 0
    assert result.stdout.decode().startswith("snapcache ")
    listing = run_module("ls", "--json")
    assert listing.returncode == 0
    assert json.loads(listing.stdout) == []


# -- the parsers and formatters the commands share ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500M", 500 << 20), ("2G", 2 << 30), ("1.5GiB", int(1.5 * (1 << 30))), ("1024", 1024), ("8k", 8192)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("2w", 1209600)]
)
def test_parse_age(text, expected):
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-1M", "12 parsecs"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_format_size():
    assert format_size(512) == "512 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(11_600_000) == "11.1 MiB"


# -- check -------------------------------------------------------------------------------------------


def damage(snapcache_dir: Path, key_id: str) -> Path:
    (path,) = (snapcache_dir / "snapshots").glob(f"{key_id}-*.snap")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def test_check_of_a_sound_cache_says_ok(three):
    result = invoke("check")
    assert result.exit_code == 0, result.output
    assert "indexed:         3 snapshots" in result.stdout
    assert "files verified:  all" in result.stdout
    assert "ok: the index and the files agree" in result.stdout
    report = json.loads(invoke("check", "--json").stdout)
    assert report["entries"] == 3
    assert report["problems"] == report["problems_left"] == 0


def test_check_reports_problems_and_exits_1_until_repaired(three, snapcache_dir):
    corrupt = damage(snapcache_dir, three["low"])
    (gone,) = (snapcache_dir / "snapshots").glob(f"{three['high']}-*.snap")
    gone.unlink()
    young_temp = snapcache_dir / "snapshots" / ".tmp-00000000000000ee.partial"
    young_temp.write_bytes(b"a write in flight")

    result = invoke("check", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["corrupt_files"] == [corrupt.name]
    assert report["missing_files"] == [three["high"]]
    assert report["temp_files"] == []  # younger than the grace period: a writer may own it
    assert report["problems"] == report["problems_left"] == 2
    assert report["repaired"] is False
    assert corrupt.exists()  # nothing changed without --repair

    text = invoke("check", "--grace", "0")
    assert text.exit_code == 1
    assert "3 problems found; `snapcache check --repair` removes them" in text.stdout

    repaired = invoke("check", "--repair", "--grace", "0", "--json")
    assert repaired.exit_code == 0, repaired.output
    report = json.loads(repaired.stdout)
    assert report["problems"] == 3
    assert report["problems_left"] == 0
    assert report["repaired"] is True
    assert not corrupt.exists()
    assert not young_temp.exists()
    assert {r["id"] for r in listed()} == {three["other"]}
    again = invoke("check")
    assert again.exit_code == 0, again.output


def test_check_without_verify_does_not_read_the_files(three, snapcache_dir):
    damage(snapcache_dir, three["low"])
    result = invoke("check", "--no-verify", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["corrupt_files"] == []


def test_check_exit_status_from_a_new_process(three, snapcache_dir):
    damage(snapcache_dir, three["other"])
    found = run_module("check")
    assert found.returncode == 1
    assert b"1 problem found" in found.stdout
    assert run_module("check", "--repair").returncode == 0
    assert run_module("check").returncode == 0


def test_doctor_points_to_check_when_the_index_and_files_disagree(three, snapcache_dir):
    (gone,) = (snapcache_dir / "snapshots").glob(f"{three['high']}-*.snap")
    gone.unlink()
    checks = {c["name"]: c for c in json.loads(invoke("doctor", "--json").stdout)["checks"]}
    assert checks["store"]["status"] == "warn"
    assert "snapcache check --repair" in checks["store"]["detail"]
