"""How to build llama-cpp-python on this machine so that it runs: the CMake flags, and a wheel kept per flags.

llama.cpp's default build (`GGML_NATIVE`, `-march=native`) compiles its AMX kernels on an Intel CPU
that has AMX (Sapphire Rapids and later), and `ggml_backend_amx_mul_mat` segfaults on the first
decode of a Q4_K model there (llama.cpp issue #20824). On such a CPU the build turns `GGML_NATIVE`
off and names every instruction set the CPU has except AMX, so AVX2, AVX-512 and the repacked
kernels stay. Every other machine keeps llama.cpp's native build. A `CMAKE_ARGS` the user set
(`-DGGML_CUDA=on`, `-DGGML_METAL=on`, ...) wins over both.

pip's wheel cache keys a source build by name and version alone, so a wheel built with other flags
would come back. `install` builds with `--no-cache-dir` and keeps the wheel in a folder named by a
hash of everything the build depended on (version, flags, Python, the CPU for a native build, and
any source guard applied).

`install --backend vulkan` builds for ggml's Vulkan backend (`-DGGML_VULKAN=on` beside the CPU's
flags). llama.cpp's `ggml-vulkan.cpp` sets the validation layer's options with `vk::LayerSettingEXT`,
which Vulkan headers have only from 1.3.261 (Debian 12 ships 1.3.239). Where the headers found are
older, the build applies one guard to the unpacked source (`guard_layer_settings`): the instance is
created without those options, as it is anyway when no validation layer is installed. Nothing else
of llama.cpp changes, and the repository ships none of its sources.

Standard library only: the Makefile runs it (`python snapcache/llama/setup/build_flags.py install`) before
anything else is installed. `python snapcache/llama/setup/build_flags.py` prints the flags it would use
(`--cpuinfo` and `--machine` ask about another machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CPUINFO = Path("/proc/cpuinfo")
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})

# /proc/cpuinfo flag -> ggml's CMake option, for a build with GGML_NATIVE=OFF.
GGML_OPTIONS = (
    ("sse4_2", "GGML_SSE42"),
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)
_X86_64 = frozenset({"x86_64", "amd64"})

BACKENDS = ("cpu", "vulkan")
VULKAN_OPTION = "-DGGML_VULKAN=on"
_VULKAN_ON = re.compile(r"-DGGML_VULKAN(?::BOOL)?=(ON|1|TRUE|YES|Y)\b", re.IGNORECASE)
# The first Vulkan headers with VK_EXT_layer_settings (vk::LayerSettingEXT).
LAYER_SETTINGS_HEADER = 261
VULKAN_SOURCE = Path("vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp")
# The lines of ggml_vk_instance_init that need VK_EXT_layer_settings: from the first to the last.
_SETTINGS_FIRST = "    VkBool32 enable_best_practice = layer_settings;\n"
_SETTINGS_LAST = re.compile(
    r"^    vk::InstanceCreateInfo instance_create_info\((.*), &layer_setting_info\);\n", re.MULTILINE
)
LAYER_SETTINGS_GUARD = "layer-settings-guard-1"
# Debian's packages a Vulkan build and its tests need: the headers and loader, the shader compiler
# and SPIR-V's headers, and Mesa's drivers (lavapipe, a Vulkan device that computes on the CPU).
VULKAN_DEBIAN_PACKAGES = ("libvulkan-dev", "glslc", "spirv-headers", "mesa-vulkan-drivers")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (empty where it has none)."""
    for line in cpuinfo.splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: Path = CPUINFO) -> frozenset[str]:
    """This machine's CPU flags, or none where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        return cpu_flags(path.read_text(errors="replace"))
    except OSError:
        return frozenset()


def has_amx(flags: frozenset[str]) -> bool:
    """Whether the CPU reports any of Intel's AMX extensions."""
    return bool(flags & AMX_FLAGS)


def cmake_args_for(machine: str, flags: frozenset[str]) -> str:
    """The CMAKE_ARGS snapcache builds llama.cpp with: none (native) unless an x86-64 CPU has AMX."""
    if machine.lower() not in _X86_64 or not has_amx(flags):
        return ""
    return " ".join(
        [*instruction_set_options(flags), "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    )


def instruction_set_options(flags: frozenset[str]) -> list[str]:
    """A build without GGML_NATIVE that turns on exactly the instruction sets in `flags` (AMX aside)."""
    options = ["-DGGML_NATIVE=OFF"]
    options += [f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in GGML_OPTIONS]
    return options


def chosen_cmake_args(environ: Mapping[str, str], machine: str, flags: frozenset[str]) -> str:
    """The user's CMAKE_ARGS when set, else `cmake_args_for` this machine."""
    explicit = environ.get("CMAKE_ARGS", "").strip()
    return explicit if explicit else cmake_args_for(machine, flags)


def backend_cmake_args(cmake_args: str, backend: str) -> str:
    """`cmake_args` with the backend's own option added (none for the CPU; a user's wins)."""
    if backend == "cpu" or "GGML_VULKAN" in cmake_args:
        return cmake_args
    return f"{cmake_args} {VULKAN_OPTION}".strip()


def vulkan_header_version(environ: Mapping[str, str]) -> int | None:
    """VK_HEADER_VERSION of the Vulkan headers CMake will find ($VULKAN_SDK's first), or None."""
    folders = [Path(environ["VULKAN_SDK"]) / "include"] if environ.get("VULKAN_SDK") else []
    folders += [Path("/usr/include"), Path("/usr/local/include")]
    for folder in folders:
        try:
            header = (folder / "vulkan" / "vulkan_core.h").read_text(errors="replace")
        except OSError:
            continue
        match = re.search(r"^#define VK_HEADER_VERSION (\d+)", header, re.MULTILINE)
        if match:
            return int(match.group(1))
    return None


def builds_vulkan(cmake_args: str) -> bool:
    """Whether a build with these CMake arguments has ggml's Vulkan backend (`--backend vulkan`, or a
    user's own CMAKE_ARGS)."""
    return _VULKAN_ON.search(cmake_args) is not None


def source_guard(header_version: int | None) -> str | None:
    """The guard a Vulkan build applies to llama.cpp's source with these headers, or None."""
    if header_version is None or header_version >= LAYER_SETTINGS_HEADER:
        return None
    return LAYER_SETTINGS_GUARD


def guard_layer_settings(source: str) -> str:
    """ggml-vulkan.cpp with its layer settings compiled only where the headers have them; ValueError
    where the lines are not as expected (another llama.cpp), so that no build goes on half-guarded."""
    first = source.find(_SETTINGS_FIRST)
    last = _SETTINGS_LAST.search(source, first) if first >= 0 else None
    if last is None:
        raise ValueError(
            "ggml-vulkan.cpp: the instance's layer settings are not where this guard expects them"
        )
    plain = f"    vk::InstanceCreateInfo instance_create_info({last.group(1)});\n"
    return (
        source[:first]
        + f"#if VK_HEADER_VERSION >= {LAYER_SETTINGS_HEADER}\n"
        + source[first : last.end()]
        + "#else\n"
        + plain
        + "#endif\n"
        + source[last.end() :]
    )


def build_key(
    version: str,
    cmake_args: str,
    python_tag: str,
    machine: str,
    flags: frozenset[str],
    guard: str | None = None,
) -> str:
    """A name for one build: what went into it; a native build depends on the CPU as well."""
    native = "GGML_NATIVE=OFF" not in cmake_args
    parts: dict[str, object] = {
        "version": version,
        "cmake_args": cmake_args,
        "python": python_tag,
        "machine": machine,
        "cpu": sorted(flags) if native else None,
    }
    if guard is not None:
        parts["guard"] = guard
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def wheel_cache_root(environ: Mapping[str, str]) -> Path | None:
    """Where built wheels are kept; None when the user turned pip's cache off (PIP_NO_CACHE_DIR)."""
    if environ.get("PIP_NO_CACHE_DIR", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return None
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "snapcache" / "llama-cpp-python-wheels"


def install(python: str, environ: Mapping[str, str], *, quiet: bool = True, backend: str = "cpu") -> str:
    """Build (or take from the kept wheels) llama-cpp-python for this machine and `backend`, and
    install it into `python`."""
    flags = read_cpu_flags()
    machine = platform.machine()
    cmake_args = backend_cmake_args(chosen_cmake_args(environ, machine, flags), backend)
    guard = source_guard(vulkan_header_version(environ)) if builds_vulkan(cmake_args) else None
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    key = build_key(LLAMA_CPP_PYTHON_VERSION, cmake_args, python_tag, machine, flags, guard)
    marker = Path(sys.prefix) / ".llama-cpp-python-build"
    if marker.exists() and marker.read_text().strip() == key:
        return key
    root = wheel_cache_root(environ)
    wheel = _kept_wheel(root / key) if root is not None else None
    with tempfile.TemporaryDirectory(prefix="snapcache-llama-build-") as scratch:
        if wheel is None:
            wheel = _build_wheel(python, environ, cmake_args, Path(scratch), guard=guard, quiet=quiet)
            if root is not None:
                wheel = _keep(wheel, root / key)
        pip_quiet = ["--quiet"] if quiet else []
        subprocess.run(
            [python, "-m", "pip", "install", *pip_quiet, "--no-deps", "--force-reinstall", str(wheel)],
            check=True,
        )
    marker.write_text(key + "\n")
    return key


def _kept_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob("llama_cpp_python-*.whl")) if folder.is_dir() else []
    return wheels[0] if wheels else None


def _build_wheel(
    python: str, environ: Mapping[str, str], cmake_args: str, scratch: Path, *, guard: str | None, quiet: bool
) -> Path:
    described = cmake_args or "llama.cpp's native build"
    print(f"Building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({described}); it takes several minutes...")
    env = dict(environ)
    env["CMAKE_ARGS"] = cmake_args
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    pip_quiet = ["--quiet"] if quiet else []
    requirement = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    if guard is not None:
        requirement = str(_guarded_source(python, scratch, pip_quiet))
    command = [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(scratch / "wheel")]
    subprocess.run([*command, *pip_quiet, requirement], check=True, env=env)
    wheel = _kept_wheel(scratch / "wheel")
    if wheel is None:
        raise SystemExit("pip wheel finished without a llama-cpp-python wheel")
    return wheel


def _guarded_source(python: str, scratch: Path, pip_quiet: list[str]) -> Path:
    """llama-cpp-python's source distribution, unpacked under `scratch` with the layer-settings guard."""
    download = scratch / "sdist"
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary=:all:",
            *pip_quiet,
            "-d",
            str(download),
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
        ],
        check=True,
    )
    archive = next(download.glob("llama_cpp_python-*.tar.gz"), None)
    if archive is None:
        raise SystemExit("pip download finished without llama-cpp-python's source distribution")
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(scratch / "source", filter="data")
        else:  # pragma: no cover - Pythons before the extraction filters
            tar.extractall(scratch / "source")
    root = next((scratch / "source").iterdir())
    vulkan = root / VULKAN_SOURCE
    vulkan.write_text(guard_layer_settings(vulkan.read_text()))
    before = f"Vulkan headers before 1.3.{LAYER_SETTINGS_HEADER}"
    print(f"Applied {LAYER_SETTINGS_GUARD} to {VULKAN_SOURCE} ({before})")
    return root


def missing_debian_packages(packages: Sequence[str]) -> list[str]:
    """Those of `packages` dpkg does not list as installed (all of them where there is no dpkg)."""
    missing = []
    for package in packages:
        try:
            status = subprocess.run(
                ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
            ).stdout
        except OSError:
            status = ""
        if not status.endswith("install ok installed"):
            missing.append(package)
    return missing


def install_debian_packages(packages: Sequence[str]) -> int:
    """apt-get install those of `packages` not installed yet (through sudo where not root); 0 when
    all are there or were installed, 1 with the command to run where it cannot run it."""
    missing = missing_debian_packages(packages)
    if not missing:
        return 0
    apt = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    prefix = [] if os.geteuid() == 0 else (["sudo"] if shutil.which("sudo") else None)
    if shutil.which("apt-get") is None or prefix is None:
        print(f"Install these first: {' '.join(missing)} (on Debian or Ubuntu: sudo {' '.join(apt)})")
        return 1
    print(f"Installing Debian's {', '.join(missing)}...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*prefix, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*prefix, *apt[:2], "-qq", *apt[2:]], check=True, env=env)
    return 0


def _keep(wheel: Path, folder: Path) -> Path:
    """Move a built wheel into its folder whole (copy, then rename), so a reader never sees half of it."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / (wheel.name + ".partial")
    shutil.copyfile(wheel, partial)
    kept = folder / wheel.name
    os.replace(partial, kept)
    return kept


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command")
    flags_parser = sub.add_parser("flags", help="print the CMAKE_ARGS this machine builds with (the default)")
    flags_parser.add_argument("--cpuinfo", type=Path, default=CPUINFO, help="read the CPU's flags from here")
    flags_parser.add_argument(
        "--machine", default=platform.machine(), help="the architecture, as platform.machine() names it"
    )
    installer = sub.add_parser("install", help="build or reuse the wheel for these flags and install it")
    installer.add_argument("--verbose", action="store_true", help="show pip's and CMake's output")
    installer.add_argument(
        "--backend",
        choices=BACKENDS,
        default="cpu",
        help="ggml's backend beside the CPU's (default: cpu alone)",
    )
    packages = sub.add_parser(
        "debian-packages", help="apt-get install what a backend's build needs, if missing"
    )
    packages.add_argument("--backend", choices=BACKENDS, default="vulkan")
    args = parser.parse_args(argv)
    if args.command == "debian-packages":
        return install_debian_packages(VULKAN_DEBIAN_PACKAGES if args.backend == "vulkan" else ())
    if args.command == "install":
        install(sys.executable, os.environ, quiet=not args.verbose, backend=args.backend)
    else:
        cpuinfo = getattr(args, "cpuinfo", CPUINFO)
        machine = getattr(args, "machine", platform.machine())
        print(chosen_cmake_args(os.environ, machine, read_cpu_flags(cpuinfo)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
