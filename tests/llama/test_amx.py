"""llama.cpp's AMX kernels crash on Q4_K models: the build leaves them out, the loader keeps away.

The build's choice is checked on fake /proc/cpuinfo texts (with and without AMX) and a named
architecture; the installed llama.cpp is checked for real. The run-time guard's decision is checked on
fake system-info strings and CPU flags, and the loader is given the decision it acts on; what it does
then (a model loaded with or without extra buffer types) runs the real llama.cpp. Two tests read this
machine on purpose, and say so: the installed build, and doctor's line about it.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest
from typer.testing import CliRunner

from snapcache import CachedLlama, SnapshotStore, load_llama, model_fingerprint
from snapcache.llama.exactness.fingerprint import llama_system_info
from snapcache.llama.setup import amx, build_flags, loader
from snapcache.llama.setup.amx import AmxCondition, amx_condition, rebuild_command
from snapcache_cli.app import app
from snapcache_cli.commands.doctor import amx_check

REPO = Path(__file__).resolve().parents[2]
BUILD_FLAGS = REPO / "snapcache" / "llama" / "setup" / "build_flags.py"

# Flags of the two kinds of machine seen: an Intel Sapphire Rapids Xeon and an AMD EPYC (Zen 4).
SAPPHIRE_RAPIDS = (
    "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt avx f16c bmi1 avx2 bmi2 avx512f avx512dq "
    "avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_fp16 "
    "amx_bf16 amx_tile amx_int8"
)
EPYC = (
    "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt avx f16c bmi1 avx2 bmi2 avx512f avx512dq "
    "avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni"
)
INFO_WITH_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "
INFO_WITHOUT_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | REPACK = 1 | "


def cpuinfo_text(flags: str) -> str:
    one = f"vendor_id\t: GenuineIntel\nflags\t\t: {flags}\n"
    return f"processor\t: 0\n{one}\nprocessor\t: 1\n{one}"


def flags_of(text: str) -> frozenset[str]:
    return frozenset(text.split())


def printed_flags(tmp_path: Path, flags: str, machine: str = "x86_64", **env: str) -> str:
    """What `build_flags.py flags` prints for a machine with these CPU flags (a fresh process)."""
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo_text(flags))
    environ = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"} | env
    result = subprocess.run(
        [sys.executable, str(BUILD_FLAGS), "flags", "--cpuinfo", str(fake), "--machine", machine],
        capture_output=True,
        text=True,
        env=environ,
        check=True,
    )
    return result.stdout.strip()


# --- the build -------------------------------------------------------------------------------------


def test_cpu_flags_are_read_from_a_cpuinfo_text():
    assert build_flags.cpu_flags(cpuinfo_text("avx2 amx_int8")) == {"avx2", "amx_int8"}
    assert build_flags.cpu_flags("processor : 0\n") == frozenset()


def test_an_amx_cpu_is_built_without_native_and_without_amx(tmp_path):
    args = printed_flags(tmp_path, SAPPHIRE_RAPIDS).split()
    assert "-DGGML_NATIVE=OFF" in args
    # The CPU's other kernels stay: they are what the exactness facts were measured on.
    for option in ("AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI", "AVX_VNNI", "FMA", "F16C"):
        assert f"-DGGML_{option}=ON" in args
    assert not [arg for arg in args if "AMX" in arg and arg.endswith("=ON")]
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)


def test_a_cpu_without_amx_keeps_the_native_build(tmp_path):
    assert printed_flags(tmp_path, EPYC) == ""


def test_an_instruction_set_the_cpu_lacks_is_turned_off():
    args = build_flags.cmake_args_for("x86_64", flags_of("sse4_2 avx avx2 fma f16c bmi2 amx_tile")).split()
    assert "-DGGML_AVX2=ON" in args
    assert "-DGGML_AVX512=OFF" in args
    assert "-DGGML_AVX_VNNI=OFF" in args


def test_amx_flags_on_another_architecture_change_nothing(tmp_path):
    assert build_flags.cmake_args_for("aarch64", flags_of(SAPPHIRE_RAPIDS)) == ""
    assert printed_flags(tmp_path, SAPPHIRE_RAPIDS, machine="aarch64") == ""
    assert printed_flags(tmp_path, SAPPHIRE_RAPIDS, machine="AMD64").startswith("-DGGML_NATIVE=OFF ")


def test_the_users_cmake_args_win(tmp_path):
    assert printed_flags(tmp_path, SAPPHIRE_RAPIDS, CMAKE_ARGS="-DGGML_CUDA=on") == "-DGGML_CUDA=on"


def test_a_wheel_is_kept_per_flags_and_per_cpu_for_a_native_build():
    epyc, spr = flags_of(EPYC), flags_of(SAPPHIRE_RAPIDS)
    key = build_flags.build_key
    cuda = "-DGGML_CUDA=on"
    assert key("0.3.36", "", "cp311", "x86_64", epyc) != key("0.3.36", cuda, "cp311", "x86_64", epyc)
    assert key("0.3.36", "", "cp311", "x86_64", epyc) != key("0.3.36", "", "cp311", "x86_64", spr)
    assert key("0.3.36", "", "cp311", "x86_64", epyc) != key("0.3.37", "", "cp311", "x86_64", epyc)
    assert key("0.3.36", "", "cp311", "x86_64", epyc) != key("0.3.36", "", "cp312", "x86_64", epyc)
    explicit = build_flags.cmake_args_for("x86_64", spr)
    # With explicit flags the CPU is in the flags already: another CPU asking for them shares the wheel.
    assert key("0.3.36", explicit, "cp311", "x86_64", spr) == key("0.3.36", explicit, "cp311", "x86_64", epyc)


def test_no_wheel_is_kept_when_pips_cache_is_off(tmp_path):
    assert build_flags.wheel_cache_root({"PIP_NO_CACHE_DIR": "1"}) is None
    root = build_flags.wheel_cache_root({"XDG_CACHE_HOME": str(tmp_path)})
    assert root is not None
    assert root.is_relative_to(tmp_path)


def test_the_makefile_builds_llama_cpp_python_through_build_flags(tmp_path):
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "-n", "-B", f"VENV={venv}", "install"], cwd=REPO, capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    build = [i for i, line in enumerate(lines) if "build_flags.py install" in line]
    editable = [i for i, line in enumerate(lines) if "pip install" in line and "-e" in line]
    assert build
    assert editable
    # llama-cpp-python is built before the project's own install could build it with pip's defaults.
    assert build[0] < editable[0]


def test_the_installed_llama_cpp_is_the_build_chosen_for_this_machine():
    """Reads this machine's CPU and installed llama.cpp on purpose: the Makefile's wheel of this
    machine's flags, with no AMX kernels unless the user's CMAKE_ARGS chose the build (they win).

    On a CPU without AMX the native build has none; on one with AMX the build leaves them out.
    """
    flags = build_flags.read_cpu_flags()
    if not os.environ.get("CMAKE_ARGS", "").strip():
        assert "AMX_INT8 = 1" not in llama_system_info()
        assert not amx_condition().crashes
    marker = Path(sys.prefix) / ".llama-cpp-python-build"
    if not marker.exists():
        pytest.skip("llama-cpp-python was not installed by the Makefile (no build marker in this venv)")
    args = build_flags.chosen_cmake_args(os.environ, platform.machine(), flags)
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    expected = build_flags.build_key(
        build_flags.LLAMA_CPP_PYTHON_VERSION, args, python_tag, platform.machine(), flags
    )
    assert marker.read_text().strip() == expected


# --- the run-time guard ----------------------------------------------------------------------------


def test_the_guard_decides_from_the_system_info_and_the_cpu():
    amx_cpu, plain_cpu = flags_of(SAPPHIRE_RAPIDS), flags_of(EPYC)
    assert amx_condition(INFO_WITH_AMX, amx_cpu).crashes
    assert not amx_condition(INFO_WITH_AMX, plain_cpu).crashes
    assert amx_condition(INFO_WITH_AMX, plain_cpu).compiled
    assert not amx_condition(INFO_WITHOUT_AMX, amx_cpu).crashes
    assert not amx_condition("CPU : AMX_INT8 = 0 | ", amx_cpu).crashes
    # Where the CPU's flags cannot be read, a build with AMX compiled in is taken to run it.
    assert amx_condition(INFO_WITH_AMX, frozenset()).crashes


def test_the_rebuild_command_keeps_the_cpus_kernels_and_skips_pips_cache():
    command = rebuild_command(flags_of(SAPPHIRE_RAPIDS))
    assert "-DGGML_NATIVE=OFF" in command
    assert "-DGGML_AVX512=ON" in command
    assert "AMX" not in command
    assert "--no-cache-dir" in command
    assert "--force-reinstall" in command
    assert "llama-cpp-python==" in command


@pytest.fixture
def amx_crashes(monkeypatch):
    """This process taken for one whose llama.cpp runs AMX kernels; the warning not yet given."""
    condition = AmxCondition(compiled=True, cpu_has_amx=True)
    monkeypatch.setattr(loader, "amx_condition", lambda: condition)
    monkeypatch.setattr(amx, "amx_condition", lambda: condition)
    monkeypatch.setattr(amx, "_warned", amx.threading.Event())


def greedy_tokens(llm, prompt: str, n: int = 12) -> list[int]:
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0)
    return llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False, special=True)


def test_where_amx_would_crash_the_loader_leaves_out_extra_buffers(tiny_model_path, amx_crashes, caplog):
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        guarded = load_llama(tiny_model_path, n_ctx=256, n_threads=2)
    try:
        assert guarded.model_params.use_extra_bufts is False
        assert any("extra buffer types" in r.getMessage() for r in caplog.records)
        # llama.cpp's defaults are left as they were for the next Llama anyone builds.
        assert llama_cpp.llama_model_default_params().use_extra_bufts is True
        plain = load_llama(tiny_model_path, n_ctx=256, n_threads=2, use_extra_bufts=True)
        try:
            assert plain.model_params.use_extra_bufts is True
            # Another way of computing: another fingerprint, so neither restores the other's states.
            assert model_fingerprint(guarded) != model_fingerprint(plain)
            assert greedy_tokens(guarded, "The cat sat on") == greedy_tokens(plain, "The cat sat on")
        finally:
            plain.close()
    finally:
        guarded.close()


@pytest.mark.parametrize(
    "condition",
    [AmxCondition(compiled=False, cpu_has_amx=True), AmxCondition(compiled=True, cpu_has_amx=False)],
    ids=["not compiled in", "a cpu without AMX"],
)
def test_elsewhere_the_loader_keeps_extra_buffers(tiny_model_path, condition, monkeypatch):
    monkeypatch.setattr(loader, "amx_condition", lambda: condition)
    llm = load_llama(tiny_model_path, n_ctx=256, n_threads=2)
    try:
        assert llm.model_params.use_extra_bufts is True
    finally:
        llm.close()


def test_a_llama_loaded_elsewhere_with_amx_gets_one_warning(tiny_model_path, tmp_path, amx_crashes, caplog):
    llm = llama_cpp.Llama(model_path=str(tiny_model_path), n_ctx=256, n_threads=2, verbose=False)
    try:
        with caplog.at_level(logging.WARNING, logger="snapcache"), SnapshotStore(None) as store:
            CachedLlama(llm, store, scope="a")
            CachedLlama(llm, store, scope="b")
        warnings = [r for r in caplog.records if "may crash" in r.getMessage()]
        assert len(warnings) == 1
        assert "--no-cache-dir" in warnings[0].getMessage()
    finally:
        llm.close()


def test_a_llama_without_extra_buffers_gets_no_warning(tiny_model_path, amx_crashes, caplog):
    llm = load_llama(tiny_model_path, n_ctx=256, n_threads=2)
    try:
        with caplog.at_level(logging.WARNING, logger="snapcache"), SnapshotStore(None) as store:
            CachedLlama(llm, store)
        assert not [r for r in caplog.records if "may crash" in r.getMessage()]
    finally:
        llm.close()


@pytest.mark.model
@pytest.mark.gemma
def test_gemma_without_extra_buffers_restores_exactly(gemma_model_path, tmp_path):
    """What an AMX machine runs by default: Gemma Q4_K_M unrepacked, restored token for token as cold."""
    system = "You are Desk, a careful assistant for a small office. " * 20
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name two colours."}]

    def reply(llm) -> str:
        out = llm.create_chat_completion(messages=messages, max_tokens=16, temperature=0.0)
        return str(out["choices"][0]["message"]["content"])

    cold_llm = load_llama(gemma_model_path, n_ctx=1024, n_threads=2, use_extra_bufts=False)
    try:
        cold = reply(cold_llm)
    finally:
        cold_llm.close()
    with SnapshotStore(tmp_path / "cache") as store:
        writer = load_llama(gemma_model_path, n_ctx=1024, n_threads=2, use_extra_bufts=False)
        try:
            CachedLlama(writer, store).warm(system)
        finally:
            writer.close()
        reader = load_llama(gemma_model_path, n_ctx=1024, n_threads=2, use_extra_bufts=False)
        try:
            cached = CachedLlama(reader, store)
            restored = reply(cached)
            assert cached.last_restore is not None
            assert cached.last_restore.restored_tokens > 0
        finally:
            reader.close()
    assert restored == cold


# --- the doctor ------------------------------------------------------------------------------------


def test_doctor_names_the_condition_and_the_fix():
    check = amx_check(INFO_WITH_AMX, flags_of(SAPPHIRE_RAPIDS))
    assert check.status == "warn"
    assert "llama.cpp #20824" in check.detail
    assert "CMAKE_ARGS=" in check.detail
    assert "--no-cache-dir" in check.detail
    assert amx_check(INFO_WITH_AMX, flags_of(EPYC)).status == "ok"
    assert amx_check(INFO_WITHOUT_AMX, flags_of(SAPPHIRE_RAPIDS)).detail == "not compiled in"


def test_doctor_reports_this_machines_amx_line():
    """Reads this machine's CPU and llama.cpp on purpose: doctor's line is the check of those two,
    ok wherever the guard finds no crash (the Makefile's build, on any CPU), the fix where it does."""
    info, flags = llama_system_info(), build_flags.read_cpu_flags()
    check = amx_check(info, flags)
    result = CliRunner().invoke(app, ["doctor"])
    lines = [line for line in result.output.splitlines() if "AMX kernels" in line]
    assert lines == [f"  [{check.status:>4}] AMX kernels: {check.detail}"]
    if amx_condition(info, flags).crashes:
        assert check.status == "warn"
    else:
        assert check.status == "ok"
        assert check.detail in ("not compiled in", "compiled in, unused: this CPU has no AMX")
