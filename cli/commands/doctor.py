"""`snapcache doctor`: what this machine's llama.cpp can do, and whether the cache directory is usable."""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import snapcache

from ..formatting import format_size, render_pairs
from ..settings import COMPRESSION_ENV, Settings, settings_of
from .doctor_backend import backend_checks
from .report_check import Check, Status

if TYPE_CHECKING:
    from snapcache.admin import DirectoryReport, LibraryLinkage

_PACKAGES = (
    "snapcache",
    "llama-cpp-python",
    "numpy",
    "blosc2",
    "xxhash",
    "blake3",
    "zstandard",
    "platformdirs",
    "typer",
    # `snapcache serve` (the server extra); "not installed" is fine without it.
    "fastapi",
    "uvicorn",
    "prometheus-client",
    # the remote tier (the remote extra)
    "redis",
)
LOW_DISK_BYTES = 1 << 30


def doctor(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Report llama.cpp's build and backend, library versions and the cache directory's health."""
    from snapcache.admin import read_cpu_flags

    settings = settings_of(ctx)
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": _versions(),
        "llama_cpp": _llama_cpp_info(),
    }
    directory = _cache_directory(settings)
    # The library's own rules, checked without creating anything.
    found = snapcache.SnapshotStore.inspect_directory(directory)
    cpu_flags = read_cpu_flags()  # the CPU both build checks judge
    checks = [
        *_directory_checks(found),
        _store_check(settings, found),
        _compression_check(settings),
        _model_settings_check(settings),
        _exactness_check(directory, info["llama_cpp"]),
        *_remote_check(settings),
        _model_check(),
        *backend_checks(info["llama_cpp"], settings.gpu_layers),
        amx_check(info["llama_cpp"]["system_info"], cpu_flags),
        cxx_runtime_check(info["llama_cpp"], cpu_flags),
    ]
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        payload = info | {
            "cache_dir": str(directory),
            "checks": [asdict(c) for c in checks],
            "ok": not failed,
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print_report(info, directory, checks)
    if failed:
        raise typer.Exit(1)


def _print_report(info: dict[str, Any], directory: Path, checks: list[Check]) -> None:
    llama = info["llama_cpp"]
    pairs = [("python", f"{info['python']} on {info['platform']}")]
    pairs += [(name, version) for name, version in info["versions"].items()]
    pairs += [
        (
            "llama.cpp state format",
            f"seq state v{llama['state_seq_version']}, session v{llama['session_version']}",
        ),
        ("backends", ", ".join(llama["backends"]) or "-"),
        ("GPU offload", "supported" if llama["gpu_offload"] else "not supported: no GPU found"),
        ("mmap", "supported" if llama["mmap"] else "not supported"),
        ("cache directory", str(directory)),
    ]
    pairs.append(("llama.cpp system info", llama["system_info"]))
    typer.echo(render_pairs(pairs))
    typer.echo("checks:")
    for check in checks:
        typer.echo(f"  [{check.status:>4}] {check.name}: {check.detail}")


def _versions() -> dict[str, str]:
    found = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = snapcache.__version__ if name == "snapcache" else "not installed"
    return found


def _llama_cpp_info() -> dict[str, Any]:
    from snapcache.admin import llama_cpp_build

    from ..model_source import quiet_llama_cpp

    quiet_llama_cpp()
    return llama_cpp_build()


def _cache_directory(settings: Settings) -> Path:
    if settings.cache_dir is not None:
        return settings.cache_dir
    return snapcache.SnapshotStore.default_directory()


def _directory_checks(found: DirectoryReport) -> list[Check]:
    """Permissions as the store judges them, and free space."""
    directory, problems = found.path, found.problems
    if problems:
        # An insecure directory is the user's to judge (SNAPCACHE_ALLOW_SHARED_DIR=1 trusts it);
        # the store check below fails on it either way.
        status: Status = "warn" if all(p.insecure for p in problems) else "fail"
        checks = [Check("permissions", status, "; ".join(p.message for p in problems))]
    elif directory.is_dir():
        mode = directory.stat().st_mode
        checks = [Check("permissions", "ok", f"{stat.filemode(mode)} ({oct(stat.S_IMODE(mode))})")]
    else:
        checks = [Check("permissions", "ok", f"not created yet; {_existing_ancestor(directory)} is writable")]
    usage = shutil.disk_usage(_existing_ancestor(directory))
    free: Status = "warn" if usage.free < LOW_DISK_BYTES else "ok"
    checks.append(Check("free disk", free, f"{format_size(usage.free)} free of {format_size(usage.total)}"))
    return checks


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _store_check(settings: Settings, found: DirectoryReport) -> Check:
    """Whether the store opens, what it holds, and whether its index and files agree; a directory
    or index not there yet is left so."""
    from ..command_errors import describe

    if found.problems:
        return Check("store", "fail", found.problems[0].message)
    if not found.exists:
        return Check("store", "ok", "no cache yet; the first `snapcache warm` creates it")
    if not found.indexed:
        files = found.snapshot_files
        if not files:
            return Check("store", "ok", "no snapshots yet")
        return Check("store", "ok", f"{_plural(files, 'snapshot file')}, indexed when the store next opens")
    try:
        with settings.open_store() as store:
            entries = store.entries()
            count = len({e.key.id for e in entries})
            report = store.check(repair=False)  # the index against the files, without reading them
    except (snapcache.SnapcacheError, OSError) as exc:
        return Check("store", "fail", describe(exc))
    if not report.ok:
        return Check(
            "store",
            "warn",
            f"opens; {_plural(count, 'snapshot')}; {_plural(report.problems, 'problem')} between the "
            "index and the files: run `snapcache check --repair`",
        )
    on_disk = [e for e in entries if e.tier == "disk"]
    stored, state = sum(e.nbytes for e in on_disk), sum(e.state_bytes for e in on_disk)
    held = f"; {format_size(stored)} on disk for {format_size(state)} of state" if state else ""
    return Check("store", "ok", f"opens; {_plural(count, 'snapshot')}{held}")


_COMPRESSION_MEANS = {
    "auto": "a model's states are stored raw where zstd saves under a quarter of them (f16 K/V), "
    "read at the disk's speed; others compressed",
    "zstd": "every state compressed (zstd)",
    "none": "every state stored raw",
}


def _compression_check(settings: Settings) -> Check:
    """How the disk tier stores states, and where that setting came from."""
    if settings.compression is not None:
        setting, source = settings.compression, "--compression"
    elif os.environ.get(COMPRESSION_ENV):
        setting, source = os.environ[COMPRESSION_ENV], f"${COMPRESSION_ENV}"
    else:
        setting, source = "auto", "the default"
    means = _COMPRESSION_MEANS.get(setting)
    if means is None:
        return Check("compression", "fail", f"{setting!r} ({source}) is not one of auto, zstd, none")
    return Check("compression", "ok", f"{setting} ({source}): {means}; every file reads under any setting")


def _model_settings_check(settings: Settings) -> Check:
    """The K/V and sliding-window caches every command loads a model with: part of a state's fingerprint."""
    from snapcache.admin import DEFAULT_SWA_CACHE, default_gpu_layers

    def named(option: str, given: str | None, default: str) -> str:
        return f"{option} {given}" if given is not None else f"{option} {default} (the default)"

    caches = [
        named("--kv-cache", settings.kv_cache, "f16"),
        named("--swa-cache", settings.swa_cache, DEFAULT_SWA_CACHE),
        named("--flash-attn", settings.flash_attn, "auto"),
        named(
            "--gpu-layers",
            None if settings.gpu_layers is None else str(settings.gpu_layers),
            str(default_gpu_layers()),
        ),
    ]
    return Check(
        "model settings",
        "ok",
        f"{', '.join(caches)}: a state is found only under the settings it was saved with (`snapcache why` "
        "names a difference)",
    )


def _exactness_check(directory: Path, llama: dict[str, Any]) -> Check:
    """What `auto`, the default, chooses: from the probes noted in the cache directory, and the build."""
    from snapcache.admin import FingerprintNotes

    probed = list(FingerprintNotes(directory).alignments().values())
    exact = sum(value is not None for value in probed)
    found = (
        f"of the {len(probed)} model settings probed here, {exact} restore exactly and "
        f"{len(probed) - exact} inexactly (no prompt split point kept their results bit for bit)"
        if probed
        else "no model probed here yet"
    )
    expected = (
        "a GPU build: expect inexact restores where layers run on the GPU"
        if llama["gpu_offload"]
        else "llama.cpp runs on the CPU: exact, as long as flash attention stays off over an F16 K/V cache"
    )
    return Check(
        "exactness",
        "ok",
        f"auto (the default; --exact insists, --inexact restores at any token): {expected}; {found}",
    )


def _remote_check(settings: Settings) -> list[Check]:
    """The remote tier, when --remote or SNAPCACHE_REMOTE names one: reachable, and what it holds."""
    from ..command_errors import describe

    url = settings.remote or os.environ.get("SNAPCACHE_REMOTE") or None
    if url is None:
        return []
    try:
        with snapcache.SnapshotStore(None, ram_bytes=1, remote=url) as store:
            stats = store.remote_stats()
    except (snapcache.SnapcacheError, OSError) as exc:
        return [Check("remote tier", "fail", describe(exc))]
    if stats is None:
        return []
    if not stats.reachable:
        return [Check("remote tier", "fail", f"{stats.url} does not answer")]
    held = "-" if stats.used_bytes is None else format_size(stats.used_bytes)
    unsigned = not os.environ.get("SNAPCACHE_SECRET")
    secret = "; no SNAPCACHE_SECRET: values are not authenticated" if unsigned else ""
    status: Status = "ok" if secret == "" else "warn"
    return [
        Check(
            "remote tier",
            status,
            f"{stats.url} (prefix {stats.prefix}): {stats.entries} values, {held} of "
            f"{format_size(stats.budget_bytes)}{secret}",
        )
    ]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _model_check() -> Check:
    """Which model `warm` and `bench` use without --model; the demo model is not assembled here."""
    from snapcache.admin import DEMO_MODEL_NAME, DEMO_PACKAGE

    from ..command_errors import CliError
    from ..model_source import MODEL_ENV, ModelChoice, check_gguf

    configured = os.environ.get(MODEL_ENV)
    if configured:
        try:
            check_gguf(ModelChoice(Path(configured).expanduser(), MODEL_ENV))
        except CliError as exc:
            return Check("default model", "warn", exc.message)
        return Check("default model", "ok", f"{configured} (from {MODEL_ENV})")
    try:
        version = metadata.version(DEMO_PACKAGE)
    except metadata.PackageNotFoundError:
        return Check(
            "default model", "warn", "none: pass --model, set SNAPCACHE_MODEL, or install snapcache[demo]"
        )
    return Check(
        "default model",
        "ok",
        f"demo model {DEMO_MODEL_NAME} ({DEMO_PACKAGE} {version})",
    )


def amx_check(system_info: str, cpu_flags: frozenset[str]) -> Check:
    """Whether llama.cpp's AMX kernels, which crash on Q4_K models, would run on a CPU with `cpu_flags`
    (/proc/cpuinfo's; none where unknown), and the fix."""
    from snapcache.admin import amx_condition, amx_rebuild_command

    condition = amx_condition(system_info, cpu_flags)
    if condition.crashes:
        return Check(
            "AMX kernels",
            "warn",
            "this llama.cpp has AMX kernels and this CPU runs them; they crash on Q4_K models "
            "(llama.cpp #20824), so snapcache loads models without extra buffer types (slower prompt "
            f"reads). Fix: {amx_rebuild_command(cpu_flags)}",
        )
    if condition.compiled:
        return Check("AMX kernels", "ok", "compiled in, unused: this CPU has no AMX")
    return Check("AMX kernels", "ok", "not compiled in")


def cxx_runtime_check(
    llama: dict[str, Any], cpu_flags: frozenset[str], libraries: list[LibraryLinkage] | None = None
) -> Check:
    """Whether a llama.cpp library exports its own C++ runtime's `__once_proxy`, which crashes GPU decodes.

    The fix it names is the rebuild for a CPU with `cpu_flags`: on one with AMX it leaves AMX out too.
    """
    from snapcache.admin import cxx_runtime_rebuild_command, installed_libraries

    try:
        found = installed_libraries() if libraries is None else libraries
        exporting = [lib.path.name for lib in found if lib.exports_once_proxy]
        fix = cxx_runtime_rebuild_command(llama["system_info"], cpu_flags) if exporting else ""
    except (OSError, ValueError) as exc:
        return Check("C++ runtime", "warn", f"could not read llama.cpp's libraries: {exc}")
    if exporting:
        # Only GPU processes were seen to crash: cuBLAS and NCCL bring the system's libstdc++ in.
        return Check(
            "C++ runtime",
            "fail" if llama["gpu_offload"] else "warn",
            f"the C++ runtime linked into {', '.join(exporting)} is exported (std::call_once's "
            "__once_proxy); with a library that loads libstdc++.so.6 (cuBLAS, blosc2's ndindex) the first "
            f"GPU decode segfaults. Fix: {fix}",
        )
    if not found:
        return Check("C++ runtime", "ok", "not checked: no ELF libraries in llama_cpp/lib")
    if any(lib.shared_runtime for lib in found):
        return Check("C++ runtime", "ok", "llama.cpp uses the shared C++ runtime")
    return Check("C++ runtime", "ok", "llama.cpp keeps its own C++ runtime to itself")
