"""Where snapshots live by default, and making sure nobody else can write there."""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from snapcache.disk.files import FILES_DIR, INDEX_NAME, PACK_SUFFIX, SNAPSHOT_SUFFIX
from snapcache.errors import InsecureDirectory, StoreUnavailable

ENV_DIR = "SNAPCACHE_DIR"
ENV_ALLOW_SHARED = "SNAPCACHE_ALLOW_SHARED_DIR"
_TRUE = frozenset({"1", "true", "yes", "on"})


def default_cache_dir() -> Path:
    """$SNAPCACHE_DIR if set, else the per-user cache directory of the platform."""
    configured = os.environ.get(ENV_DIR)
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir("snapcache"))


@dataclass(frozen=True, slots=True)
class DirProblem:
    """Why `prepare_cache_dir` would refuse a directory; `insecure` marks the InsecureDirectory cases."""

    message: str
    insecure: bool = False


def shared_dir_allowed_by_env() -> bool:
    return os.environ.get(ENV_ALLOW_SHARED, "").strip().lower() in _TRUE


def prepare_cache_dir(path: Path, allow_shared: bool = False) -> Path:
    """Create `path` (and missing parents) with mode 0700 and check that it is ours alone.

    Snapshots are fed to llama.cpp, which parses them in C++; a directory other users can write to
    would let them plant files. Raises InsecureDirectory for such a directory unless `allow_shared`
    (or SNAPCACHE_ALLOW_SHARED_DIR=1), and StoreUnavailable when the directory cannot be used.
    """
    path = Path(path).expanduser()
    try:
        _make_dirs(path)
        info = path.stat()
    except OSError as exc:
        raise StoreUnavailable(f"cannot use cache directory {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StoreUnavailable(f"cannot use cache directory {path}: not a directory")
    if not (allow_shared or shared_dir_allowed_by_env()):
        insecure = _privacy_problem(path, info)
        if insecure is not None:
            raise InsecureDirectory(insecure)
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreUnavailable(f"cannot use cache directory {path}: not writable")
    return path


def inspect_cache_dir(path: Path, allow_shared: bool = False) -> list[DirProblem]:
    """What would stop `prepare_cache_dir(path)` from succeeding, found without creating anything.

    An empty list means the directory is usable as it stands, or can be created: a missing
    directory is fine when its nearest existing ancestor is a writable directory.
    """
    path = Path(path).expanduser()
    try:
        info = path.stat()
    except FileNotFoundError:
        return _creation_problems(path)
    except OSError as exc:
        return [DirProblem(f"cannot use cache directory {path}: {exc.strerror or exc}")]
    if not stat.S_ISDIR(info.st_mode):
        return [DirProblem(f"cannot use cache directory {path}: not a directory")]
    problems = []
    if not (allow_shared or shared_dir_allowed_by_env()):
        insecure = _privacy_problem(path, info)
        if insecure is not None:
            problems.append(DirProblem(insecure, insecure=True))
    if not os.access(path, os.W_OK | os.X_OK):
        problems.append(DirProblem(f"cannot use cache directory {path}: not writable"))
    return problems


@dataclass(frozen=True, slots=True)
class DirectoryReport:
    """What a cache directory holds, and what would stop a store from opening there.

    Found without creating or changing anything: `exists` is False for a directory not made yet,
    `indexed` tells whether it has a snapshot index, `snapshot_files` counts the snapshot and pack files
    (those an index will be rebuilt from when there is none).
    """

    path: Path
    problems: tuple[DirProblem, ...]
    exists: bool
    indexed: bool
    snapshot_files: int

    @property
    def usable(self) -> bool:
        """True when a store can open here (or create the directory)."""
        return not self.problems


def inspect_store_dir(path: Path, allow_shared: bool = False) -> DirectoryReport:
    """`inspect_cache_dir`, plus what the directory holds."""
    path = Path(path).expanduser()
    problems = tuple(inspect_cache_dir(path, allow_shared))
    folder = path / FILES_DIR
    try:
        count = sum(1 for name in os.listdir(folder) if name.endswith((SNAPSHOT_SUFFIX, PACK_SUFFIX)))
    except OSError:  # absent, or unreadable: the problems say why when it matters
        count = 0
    return DirectoryReport(path, problems, path.is_dir(), (path / INDEX_NAME).is_file(), count)


def _creation_problems(path: Path) -> list[DirProblem]:
    existing = path.parent
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return [DirProblem(f"cannot create cache directory {path}: {existing} is not a directory")]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [DirProblem(f"cannot create cache directory {path}: {existing} is not writable")]
    return []


def _make_dirs(path: Path) -> None:
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            directory.mkdir(mode=0o700)


def _privacy_problem(path: Path, info: os.stat_result) -> str | None:
    """Why `path` is not ours alone, or None; shared by `prepare_cache_dir` and `inspect_cache_dir`."""
    if os.name != "posix":  # Windows has no POSIX mode bits; the user profile is private there
        return None
    if info.st_uid != os.getuid():
        return (
            f"cache directory {path} belongs to another user (uid {info.st_uid}); use a directory "
            "of your own, or pass allow_shared_dir=True (SNAPCACHE_ALLOW_SHARED_DIR=1) to trust it"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"cache directory {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run `chmod go-w {path}`, or pass allow_shared_dir=True "
            "(SNAPCACHE_ALLOW_SHARED_DIR=1) to trust it"
        )
    return None
