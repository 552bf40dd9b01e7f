"""llama.cpp libraries that export their own copy of the C++ runtime crash a GPU process: find them.

A llama.cpp linked with libstdc++ statically (a compiler whose runtime is an archive) and without
`--exclude-libs` exports that copy's symbols, `__once_proxy` among them. cuBLAS, NCCL and C++
extensions such as ndindex (which blosc2 imports) load the system's libstdc++.so.6; their
`std::call_once` then binds to the llama library's `__once_proxy` while setting the other copy's
thread-local `__once_call`, and the process segfaults on the first GPU decode. The libraries'
dynamic symbol tables are read here (64-bit little-endian ELF; anything else counts as not
exporting), without loading them. The fix is a rebuild: `rebuild_command()`.
"""

from __future__ import annotations

import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import llama_cpp

from snapcache.llama.setup.amx import pip_rebuild_command
from snapcache.llama.setup.build_flags import has_amx, instruction_set_options, read_cpu_flags
from snapcache.llama.setup.build_info import llama_system_info

__all__ = [
    "ONCE_PROXY",
    "LibraryLinkage",
    "exporting_libraries",
    "installed_libraries",
    "libraries_in",
    "library_linkage",
    "rebuild_command",
]

ONCE_PROXY = "__once_proxy"
EXCLUDE_LIBS = "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL"
SHARED_RUNTIME = "libstdc++.so.6"
# The GPU backends' names in llama.cpp's system info (`CUDA : ARCHS = 900 | ...`), and their build options.
_GPU_OPTIONS = {
    "CUDA": "-DGGML_CUDA=on",
    "ROCm": "-DGGML_HIP=on",
    "Vulkan": "-DGGML_VULKAN=on",
    "SYCL": "-DGGML_SYCL=on",
    "MUSA": "-DGGML_MUSA=on",
}

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_DYNAMIC = struct.Struct("<qQ")
_SHT_DYNAMIC, _SHT_DYNSYM = 6, 11
_DT_NEEDED, _DT_SONAME = 1, 14
_EXPORTED_BINDINGS = frozenset({1, 2, 10})  # GLOBAL, WEAK, GNU_UNIQUE
_EXPORTED_VISIBILITIES = frozenset({0, 3})  # DEFAULT, PROTECTED


@dataclass(frozen=True, slots=True)
class LibraryLinkage:
    """A shared library: does it define and export `__once_proxy`, does it need libstdc++.so.6, its SONAME."""

    path: Path
    exports_once_proxy: bool
    shared_runtime: bool
    soname: str = ""


def library_linkage(path: Path) -> LibraryLinkage | None:
    """What `path`'s dynamic section says; None when it is no 64-bit little-endian ELF or cannot be read."""
    try:
        with path.open("rb") as file:
            return _linkage(path, file)
    except (OSError, ValueError, IndexError, struct.error):
        return None


def libraries_in(directory: Path) -> list[LibraryLinkage]:
    """The shared libraries (`*.so*`) in `directory`, each once under its shortest name.

    A wheel installs `libggml.so`, `libggml.so.0` and `libggml.so.0.25.3` as three copies of one
    library: they are told apart by their SONAME.
    """
    try:
        candidates = sorted(directory.glob("*.so*"), key=lambda p: (len(p.name), p.name))
    except OSError:
        return []
    found, seen = [], set()
    for candidate in candidates:
        if not candidate.is_file():
            continue
        linkage = library_linkage(candidate)
        if linkage is None:
            continue
        identity = linkage.soname or str(candidate.resolve())
        if identity not in seen:
            seen.add(identity)
            found.append(linkage)
    return found


def exporting_libraries(directory: Path) -> list[Path]:
    """The libraries in `directory` that define and export `__once_proxy` themselves."""
    return [lib.path for lib in libraries_in(directory) if lib.exports_once_proxy]


def installed_libraries() -> list[LibraryLinkage]:
    """The installed llama_cpp's libraries (`llama_cpp/lib`); none off Linux."""
    if not sys.platform.startswith("linux"):
        return []
    return libraries_in(Path(llama_cpp.__file__).parent / "lib")


def rebuild_command(system_info: str | None = None, cpu_flags: frozenset[str] | None = None) -> str:
    """The pip command that rebuilds this llama-cpp-python keeping its C++ runtime's symbols to itself.

    It keeps the build's GPU backend, and on a CPU with AMX leaves AMX out as `amx.rebuild_command` does.
    """
    info = llama_system_info() if system_info is None else system_info
    options = [option for name, option in _GPU_OPTIONS.items() if re.search(rf"(?:^|\|)\s*{name} :", info)]
    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    if has_amx(flags):
        options += instruction_set_options(flags)
    options.append(EXCLUDE_LIBS)
    return pip_rebuild_command(options)


def _linkage(path: Path, file: BinaryIO) -> LibraryLinkage | None:
    header = file.read(_ELF_HEADER.size)
    # ELF magic, 64-bit (class 2), little-endian (data 1)
    if len(header) < _ELF_HEADER.size or header[:6] != b"\x7fELF\x02\x01":
        return None
    fields = _ELF_HEADER.unpack(header)
    section_offset, entry_size, count = fields[6], fields[11], fields[12]
    if count == 0 or entry_size < _SECTION.size:
        return None  # no section headers (stripped with them): unknown
    file.seek(section_offset)
    table = _read(file, entry_size * count)
    sections = [_SECTION.unpack_from(table, i * entry_size) for i in range(count)]

    def contents(index: int) -> bytes:
        section = sections[index]
        file.seek(section[4])
        return _read(file, section[5])

    exports, needed, soname = False, [], ""
    for index, section in enumerate(sections):
        kind, link = section[1], section[6]
        if kind == _SHT_DYNSYM:
            exports = exports or _defines(contents(index), contents(link), ONCE_PROXY)
        elif kind == _SHT_DYNAMIC:
            names = _dynamic_names(contents(index), contents(link))
            needed += names.get(_DT_NEEDED, [])
            soname = soname or next(iter(names.get(_DT_SONAME, [])), "")
    return LibraryLinkage(path, exports, SHARED_RUNTIME in needed, soname)


def _read(file: BinaryIO, size: int) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise ValueError("ELF section runs past the end of the file")
    return data


def _string(strings: bytes, offset: int) -> bytes:
    return strings[offset : strings.index(b"\0", offset)]


def _defines(symbols: bytes, strings: bytes, name: str) -> bool:
    wanted = name.encode()
    usable = len(symbols) - len(symbols) % _SYMBOL.size
    for st_name, info, other, shndx, _, _ in _SYMBOL.iter_unpack(symbols[:usable]):
        # shndx 0 is an undefined symbol: resolved from another object, such as libstdc++.so.6
        if shndx == 0 or info >> 4 not in _EXPORTED_BINDINGS or other & 3 not in _EXPORTED_VISIBILITIES:
            continue
        if _string(strings, st_name) == wanted:
            return True
    return False


def _dynamic_names(dynamic: bytes, strings: bytes) -> dict[int, list[str]]:
    """The libraries a dynamic section needs and its own name, by tag (DT_NEEDED, DT_SONAME)."""
    usable = len(dynamic) - len(dynamic) % _DYNAMIC.size
    names: dict[int, list[str]] = {}
    for tag, value in _DYNAMIC.iter_unpack(dynamic[:usable]):
        if tag == 0:  # DT_NULL ends the section
            break
        if tag in (_DT_NEEDED, _DT_SONAME):
            names.setdefault(tag, []).append(_string(strings, value).decode("utf-8", "replace"))
    return names
