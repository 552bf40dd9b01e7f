"""llama.cpp libraries that export their own C++ runtime's `__once_proxy` are found, and doctor names the fix.

Shared objects compiled here with the system C compiler stand in for the three cases: one that
defines and exports `__once_proxy` (a runtime linked in statically and exported), one that only
calls it (resolved from libstdc++.so.6), one that keeps its definition hidden (`--exclude-libs`).
The installed llama.cpp is read for real. The CPU the rebuild is named for is given as its flags,
one without AMX (`EPYC`) and one with (`AMX_CPU`): on a CPU with AMX the fix names its instruction
sets too, so the tests compare the set of CMake options, not their order.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest
from typer.testing import CliRunner

from snapcache.llama.setup import amx, build_flags, cxx_runtime
from snapcache.llama.setup.cxx_runtime import (
    EXCLUDE_LIBS,
    LibraryLinkage,
    exporting_libraries,
    libraries_in,
    library_linkage,
    rebuild_command,
)
from snapcache_cli.app import app
from snapcache_cli.commands.doctor import cxx_runtime_check

COMPILER = shutil.which("cc") or shutil.which("gcc")
needs_compiler = pytest.mark.skipif(
    COMPILER is None or not sys.platform.startswith("linux"), reason="needs a C compiler building ELF"
)

SOURCES = {
    "libexports.so": "void __once_proxy(void) {}\nint exported_value = 1;\n",
    "libcalls.so": "extern void __once_proxy(void);\nvoid run_once(void) { __once_proxy(); }\n",
    "libhidden.so": '__attribute__((visibility("hidden"))) void __once_proxy(void) {}\n'
    "void run_once(void) { __once_proxy(); }\n",
}
CUDA_INFO = "CPU : SSE3 = 1 | AVX2 = 1 | REPACK = 1 | CUDA : ARCHS = 900 | USE_GRAPHS = 1 | "
CPU_INFO = "CPU : SSE3 = 1 | AVX2 = 1 | REPACK = 1 | "
EPYC = frozenset(["sse3", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"])
AMX_CPU = EPYC | {"amx_tile", "amx_int8", "amx_bf16"}
CPUS = pytest.mark.parametrize("cpu_flags", [EPYC, AMX_CPU], ids=["cpu without AMX", "cpu with AMX"])


def cmake_options(command: str) -> set[str]:
    """The options in a rebuild command's `CMAKE_ARGS="..."`, each named once."""
    match = re.search(r'CMAKE_ARGS="([^"]*)"', command)
    assert match is not None, command
    options = match.group(1).split()
    assert len(options) == len(set(options)), options
    return set(options)


def expected_options(cpu_flags: frozenset[str], *backend: str) -> set[str]:
    """The fix for a CPU with `cpu_flags`: the backend's option and `--exclude-libs`, and on a CPU
    with AMX the instruction sets the AMX check's own rebuild names (AMX left out)."""
    if not build_flags.has_amx(cpu_flags):
        return {*backend, EXCLUDE_LIBS}
    return {*backend, EXCLUDE_LIBS} | cmake_options(amx.rebuild_command(cpu_flags))


def compile_library(folder: Path, name: str, source: str, *extra: str) -> Path:
    c_file = folder / f"{name}.c"
    c_file.write_text(source)
    output = folder / name
    assert COMPILER is not None
    subprocess.run(
        [COMPILER, "-shared", "-fPIC", "-o", str(output), str(c_file), *extra],
        check=True,
        capture_output=True,
    )
    c_file.unlink()
    return output


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("libs")
    for name, source in SOURCES.items():
        compile_library(folder, name, source, f"-Wl,-soname,{name}")
    return folder


@needs_compiler
def test_only_the_library_that_defines_and_exports_once_proxy_is_flagged(libraries):
    assert exporting_libraries(libraries) == [libraries / "libexports.so"]
    assert {lib.path.name for lib in libraries_in(libraries)} == set(SOURCES)


@needs_compiler
def test_copies_of_one_library_count_once_under_their_shortest_name(libraries, tmp_path):
    for name in ("libexports.so", "libexports.so.0", "libexports.so.0.1.2"):
        shutil.copy(libraries / "libexports.so", tmp_path / name)
    assert exporting_libraries(tmp_path) == [tmp_path / "libexports.so"]


def test_files_that_are_not_64_bit_elf_count_as_not_exporting(tmp_path):
    (tmp_path / "libtext.so").write_text("not a library")
    (tmp_path / "libtruncated.so").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(20))
    # section headers said to lie far past the end of the file
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01", 3, 62, 1, 0, 0, 1 << 40, 0, 64, 56, 0, 64, 3, 2
    )
    (tmp_path / "libwide.so").write_bytes(header)
    (tmp_path / "libstripped.so").write_bytes(header[:60] + bytes(4))
    assert library_linkage(tmp_path / "libtext.so") is None
    assert library_linkage(tmp_path / "libtruncated.so") is None
    assert library_linkage(tmp_path / "libwide.so") is None
    assert library_linkage(tmp_path / "libstripped.so") is None
    assert library_linkage(tmp_path / "missing.so") is None
    assert exporting_libraries(tmp_path) == []
    assert exporting_libraries(tmp_path / "no such folder") == []


@needs_compiler
def test_a_truncated_library_counts_as_not_exporting(libraries, tmp_path):
    whole = (libraries / "libexports.so").read_bytes()
    (tmp_path / "libcut.so").write_bytes(whole[: len(whole) // 2])
    assert exporting_libraries(tmp_path) == []


def test_the_installed_llama_cpp_is_judged():
    """Reads this machine's installed llama.cpp on purpose: whatever its libraries, a CPU build's check
    is ok, or warns where they export their runtime (the CPU given, as its rebuild's flags only)."""
    found = cxx_runtime.installed_libraries()
    assert isinstance(found, list)
    if sys.platform.startswith("linux"):
        names = {lib.path.name for lib in found}
        assert any(name.startswith("libllama") for name in names), names
        assert all(lib.soname for lib in found)
        # the libraries link the C++ runtime somehow: shared, or static and (after the fix) hidden
        check = cxx_runtime_check({"gpu_offload": False, "system_info": CPU_INFO}, EPYC, found)
        exports = any(lib.exports_once_proxy for lib in found)
        assert check.status == ("warn" if exports else "ok")


def test_the_rebuild_keeps_the_gpu_backend_and_hides_the_runtime():
    gpu = rebuild_command(CUDA_INFO, EPYC)
    assert gpu.startswith('CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL" ')
    assert "pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python==" in gpu
    cpu = rebuild_command(CPU_INFO, EPYC)
    assert cpu.startswith('CMAKE_ARGS="-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL" ')
    # on a CPU with AMX the rebuild leaves AMX out too, as the AMX check's rebuild does
    amx_cpu = rebuild_command(CPU_INFO, AMX_CPU)
    assert "-DGGML_NATIVE=OFF" in amx_cpu
    assert "--exclude-libs,ALL" in amx_cpu
    assert cmake_options(amx_cpu) == expected_options(AMX_CPU)
    assert cmake_options(rebuild_command(CUDA_INFO, AMX_CPU)) == expected_options(AMX_CPU, "-DGGML_CUDA=on")


def test_the_options_an_amx_cpu_adds_leave_amx_out_and_keep_its_kernels():
    options = expected_options(AMX_CPU, "-DGGML_CUDA=on")
    kept = {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON"}
    assert {"-DGGML_CUDA=on", EXCLUDE_LIBS} | kept <= options
    assert not [option for option in options if "AMX" in option and not option.endswith("=OFF")]
    assert expected_options(EPYC, "-DGGML_CUDA=on") == {"-DGGML_CUDA=on", EXCLUDE_LIBS}


@needs_compiler
@CPUS
def test_doctor_fails_on_a_gpu_build_warns_on_a_cpu_build_and_names_the_fix(libraries, cpu_flags):
    found = libraries_in(libraries)
    gpu = cxx_runtime_check({"gpu_offload": True, "system_info": CUDA_INFO}, cpu_flags, found)
    assert gpu.status == "fail"
    assert "libexports.so" in gpu.detail
    assert "libcalls.so" not in gpu.detail
    assert "Fix: CMAKE_ARGS=" in gpu.detail
    assert cmake_options(gpu.detail) == expected_options(cpu_flags, "-DGGML_CUDA=on")
    cpu = cxx_runtime_check({"gpu_offload": False, "system_info": CPU_INFO}, cpu_flags, found)
    assert cpu.status == "warn"
    assert "-DGGML_CUDA" not in cpu.detail
    assert cmake_options(cpu.detail) == expected_options(cpu_flags)

    fixed = [lib for lib in found if not lib.exports_once_proxy]
    ok = cxx_runtime_check({"gpu_offload": True, "system_info": CUDA_INFO}, cpu_flags, fixed)
    assert ok.status == "ok"
    # the compiled stand-ins need no libstdc++.so.6: their runtime, if any, is their own
    assert ok.detail == "llama.cpp keeps its own C++ runtime to itself"
    assert cxx_runtime_check({"gpu_offload": True, "system_info": CUDA_INFO}, cpu_flags, []).status == "ok"


@CPUS
def test_doctor_names_both_rebuilds_for_the_cpu_flags_it_reads(monkeypatch, cpu_flags):
    """`snapcache doctor` judges the CPU flags it reads (a stand-in reader here) in the AMX check and in
    this one; the build is a stand-in too: CPU only, AMX kernels compiled in, its runtime exported."""
    monkeypatch.setattr(build_flags, "read_cpu_flags", lambda path=build_flags.CPUINFO: cpu_flags)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: f"{CPU_INFO}AMX_INT8 = 1 | ".encode())
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: False)
    exporting = LibraryLinkage(Path("libllama.so"), exports_once_proxy=True, shared_runtime=False)
    monkeypatch.setattr(cxx_runtime, "installed_libraries", lambda: [exporting])
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    runtime = checks["C++ runtime"]
    assert runtime["status"] == "warn"
    assert "libllama.so" in runtime["detail"]
    assert cmake_options(runtime["detail"]) == expected_options(cpu_flags)
    amx_line = checks["AMX kernels"]
    if build_flags.has_amx(cpu_flags):
        assert amx_line["status"] == "warn"
        assert amx_line["detail"].endswith(f"Fix: {amx.rebuild_command(cpu_flags)}")
    else:
        assert amx_line["status"] == "ok"
        assert amx_line["detail"] == "compiled in, unused: this CPU has no AMX"


CALL_ONCE = """#include <mutex>
static std::once_flag flag;
static int value;
extern "C" int run_once() { std::call_once(flag, [] { value = 1; }); return value; }
"""


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++")
def test_a_statically_linked_runtime_is_flagged_until_linked_with_exclude_libs(tmp_path):
    """The case itself: std::call_once with libstdc++ linked in, exported by default, hidden by the fix."""
    builds = {
        "libstatic.so": ["-static-libstdc++"],
        "libexcluded.so": ["-static-libstdc++", "-Wl,--exclude-libs,ALL"],
        "libshared.so": [],
    }
    for name, flags in builds.items():
        source = tmp_path / "once.cpp"
        source.write_text(CALL_ONCE)
        result = subprocess.run(
            ["g++", "-shared", "-fPIC", "-o", str(tmp_path / name), str(source), *flags], capture_output=True
        )
        if result.returncode != 0:
            pytest.skip(f"g++ cannot link {name}: {result.stderr.decode(errors='replace')[-200:]}")
        source.unlink()
    found = {lib.path.name: lib for lib in libraries_in(tmp_path)}
    assert exporting_libraries(tmp_path) == [tmp_path / "libstatic.so"]
    assert found["libshared.so"].shared_runtime
    assert not found["libexcluded.so"].shared_runtime
