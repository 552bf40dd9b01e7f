"""The cache directory is ours alone: 0700 dirs, 0600 files, exclusive temp files, shared dirs refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from reliability_workers.payload import FINGERPRINT, SCOPE, state_for, tokens_for

from snapcache import (
    InsecureDirectory,
    SnapcacheError,
    SnapshotKey,
    SnapshotStore,
    StoreUnavailable,
)
from snapcache.disk import cache_dir

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


def fill(store: SnapshotStore, count: int = 5) -> None:
    for index in range(count):
        tokens = tokens_for(index)
        store.put(SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens), tokens, state_for(tokens))
    store.flush()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@posix_only
@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_directories_are_0700_and_files_0600(tmp_path: Path, umask: int) -> None:
    directory = tmp_path / "a" / "b" / "cache"
    old = os.umask(umask)
    try:
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20) as store:
            fill(store)
            # While the store is open its SQLite journal files exist too: check those as well.
            modes = {p: (mode(p), p.is_dir()) for p in [directory, *directory.rglob("*")]}
    finally:
        os.umask(old)
    for name in ("a", "a/b"):
        assert mode(tmp_path / name) == 0o700, name
    loose = {
        str(p.relative_to(tmp_path)): oct(bits)
        for p, (bits, is_dir) in modes.items()
        if bits & ~(0o700 if is_dir else 0o600)
    }
    assert loose == {}
    assert any(p.suffix == ".snap" for p in modes)


@posix_only
def test_temp_files_are_created_exclusively_and_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "cache"
    opened: list[tuple[str, int, int]] = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, *args, **kwargs):
        if str(directory) in os.fsdecode(path) and flags & (os.O_WRONLY | os.O_RDWR):
            opened.append((os.fsdecode(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20, background_writes=False) as store:
        fill(store, 3)
    writes = [entry for entry in opened if "snapshots" in entry[0]]
    assert len(writes) >= 3
    for path, flags, file_mode in writes:
        assert flags & os.O_CREAT, f"{path} opened without O_CREAT"
        assert flags & os.O_EXCL, f"{path} opened without O_EXCL"
        assert file_mode & 0o077 == 0, f"{path} created with mode {oct(file_mode)}"
        assert not Path(path).name.endswith(".snap"), "the final name is written only by rename"


@posix_only
def test_a_planted_symlink_is_never_followed_for_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """O_EXCL refuses an existing name: a symlink planted under a temp file's name cannot redirect a write."""
    directory = tmp_path / "cache"
    target = tmp_path / "victim.txt"
    target.write_text("precious")
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20, background_writes=False) as store:
        fill(store, 1)
        planted = sorted(p for p in (directory / "snapshots").iterdir())
        # Make every name the writer could pick exist already as a symlink to the victim.
        import secrets

        monkeypatch.setattr(secrets, "token_hex", lambda n=None: "0" * (2 * (n or 16)))
        for name in (".tmp-" + "0" * 16 + ".partial",):
            (directory / "snapshots" / name).symlink_to(target)
        tokens = tokens_for(9)
        store.put(SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens), tokens, state_for(tokens))
        assert store.stats().write_errors == 1
        assert planted
    assert target.read_text() == "precious"


@posix_only
@pytest.mark.parametrize("bits", [0o777, 0o770, 0o1777, 0o720, 0o702], ids=oct)
def test_a_directory_others_can_write_is_refused(tmp_path: Path, bits: int) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(bits)
    with pytest.raises(InsecureDirectory) as exc_info:
        SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20)
    exc = exc_info.value
    assert isinstance(exc, SnapcacheError)
    assert isinstance(exc, PermissionError)
    assert isinstance(exc, StoreUnavailable)
    message = str(exc)
    assert str(directory) in message
    assert "chmod" in message
    assert "allow_shared_dir" in message
    assert not (directory / "snapshots").exists(), "nothing is written into a refused directory"
    assert not (directory / "index.sqlite3").exists()


@posix_only
def test_the_opt_in_accepts_a_shared_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o777)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20, allow_shared_dir=True) as store:
        fill(store, 2)
        assert len(store.entries()) == 2
    monkeypatch.setenv("SNAPCACHE_ALLOW_SHARED_DIR", "1")
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20) as store:
        assert len(store.entries()) == 2


@posix_only
def test_the_default_directory_is_checked_too(snapcache_dir: Path) -> None:
    snapcache_dir.mkdir(parents=True)
    snapcache_dir.chmod(0o777)
    with pytest.raises(InsecureDirectory):
        SnapshotStore(ram_bytes=1 << 20, disk_bytes=1 << 20)
    snapcache_dir.chmod(0o700)
    with SnapshotStore(ram_bytes=1 << 20, disk_bytes=1 << 20) as store:
        assert store.directory == snapcache_dir


@posix_only
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root"
)
def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(InsecureDirectory) as exc_info:
        SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 20)
    assert "another user" in str(exc_info.value)


def test_a_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(StoreUnavailable) as exc_info:
        SnapshotStore(path, ram_bytes=0, disk_bytes=1 << 20)
    assert str(path) in str(exc_info.value)


@posix_only
@pytest.mark.parametrize("bits", [0o777, 0o770, 0o720, 0o702], ids=oct)
def test_inspect_reports_what_prepare_refuses_without_creating(tmp_path: Path, bits: int) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(bits)
    problems = cache_dir.inspect_cache_dir(directory)
    assert [p.insecure for p in problems] == [True]
    with pytest.raises(InsecureDirectory) as exc_info:
        cache_dir.prepare_cache_dir(directory)
    assert problems[0].message == str(exc_info.value)
    assert cache_dir.inspect_cache_dir(directory, allow_shared=True) == []
    assert list(directory.iterdir()) == []


def test_inspect_accepts_a_missing_directory_and_creates_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "cache"
    assert cache_dir.inspect_cache_dir(directory) == []
    assert list(tmp_path.iterdir()) == []
    private = tmp_path / "mine"
    private.mkdir(mode=0o700)
    assert cache_dir.inspect_cache_dir(private) == []


def test_inspect_reports_a_file_in_the_way(tmp_path: Path) -> None:
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    for target in (path, path / "cache"):
        problems = cache_dir.inspect_cache_dir(target)
        assert len(problems) == 1
        assert not problems[0].insecure
        assert "not a directory" in problems[0].message.lower()
        with pytest.raises(StoreUnavailable):
            cache_dir.prepare_cache_dir(target)


@posix_only
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_inspect_reports_a_parent_it_cannot_write(tmp_path: Path) -> None:
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o500)
    try:
        problems = cache_dir.inspect_cache_dir(parent / "cache")
        assert len(problems) == 1
        assert "not writable" in problems[0].message
        with pytest.raises(StoreUnavailable):
            cache_dir.prepare_cache_dir(parent / "cache")
    finally:
        parent.chmod(0o700)
