"""Damaged, foreign, renamed or planted files and a damaged index: a miss or a rebuild, never wrong bytes."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability_workers.disk_files import files_of_key, garbage_inside, garbage_over
from reliability_workers.payload import FINGERPRINT, SCOPE, problem_with, query_for, state_for, tokens_for
from reliability_workers.procs import run_worker

from snapcache import SnapshotKey, SnapshotStore

DISK_BYTES = 4 << 20
RAM_BYTES = 1 << 20
# Snapshot numbers 0, 4, 8, ... share one token sequence: each is a prefix of the later ones.
INDICES = [0, 4, 8, 12, 16, 1, 2, 3]


def key_of(index: int) -> SnapshotKey:
    return SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens_for(index))


def fill(directory: Path, indices: list[int] = INDICES) -> None:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK_BYTES) as store:
        for index in indices:
            tokens = tokens_for(index)
            store.put(key_of(index), tokens, state_for(tokens))


def only_file(directory: Path, index: int) -> Path:
    files = files_of_key(directory, key_of(index).id)
    assert len(files) == 1, files
    return files[0]


def flip(offset_of: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        offset = offset_of(len(data))
        data[offset] ^= 0x10
        path.write_bytes(bytes(data))

    return damage


def truncate(size_of: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: size_of(len(data))])

    return damage


def append(extra: bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with open(path, "ab") as file:
            file.write(extra)

    return damage


FILE_DAMAGE = {
    "flip-magic": flip(lambda n: 0),
    "flip-version": flip(lambda n: 8),
    "flip-header-length": flip(lambda n: 13),
    "flip-header": flip(lambda n: 40),
    "flip-tokens": flip(lambda n: n // 3),
    "flip-payload": flip(lambda n: n // 2),
    "flip-last-byte": flip(lambda n: n - 1),
    "truncate-empty": truncate(lambda n: 0),
    "truncate-prelude": truncate(lambda n: 10),
    "truncate-half": truncate(lambda n: n // 2),
    "truncate-last-byte": truncate(lambda n: n - 1),
    "append-one-byte": append(b"\x00"),
    "append-4k": append(os.urandom(4096)),
    "replace-with-garbage": lambda path: path.write_bytes(os.urandom(path.stat().st_size)),
    "replace-with-zstd-bomb-header": lambda path: path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\xff" * 64),
}


def assert_serves_only_right_bytes(store: SnapshotStore, damaged: int) -> None:
    """The damaged snapshot is a miss; every other one is served with its exact bytes."""
    assert store.get(key_of(damaged)) is None
    for index in INDICES:
        if index == damaged:
            continue
        snap = store.get(key_of(index))
        assert snap is not None, f"undamaged snapshot {index} was lost"
        assert problem_with(snap) is None


@pytest.mark.parametrize("damage", FILE_DAMAGE.values(), ids=FILE_DAMAGE.keys())
def test_a_damaged_file_is_a_logged_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None]
) -> None:
    directory = tmp_path / "cache"
    fill(directory)
    victim = 8
    path = only_file(directory, victim)
    damage(path)
    with (
        caplog.at_level(logging.WARNING, logger="snapcache"),
        SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store,
    ):
        assert_serves_only_right_bytes(store, victim)
        assert not path.exists(), "the damaged file was left in place"
        assert key_of(victim) not in {row.key for row in store.entries()}
        assert store.check(repair=False).ok
    assert any(r.levelno >= logging.WARNING and r.name == "snapcache" for r in caplog.records)


@pytest.mark.parametrize("damage", ["flip-payload", "truncate-half", "append-one-byte"])
def test_lookup_falls_back_to_the_next_longest_good_prefix(tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "cache"
    fill(directory)
    # 0, 4, 8, 12 and 16 nest: damage the longest prefix of the query; the next one must serve it.
    lengths = {index: len(tokens_for(index)) for index in (0, 4, 8, 12, 16)}
    longest = max(lengths, key=lengths.__getitem__)
    runner_up = max((i for i in lengths if i != longest), key=lengths.__getitem__)
    FILE_DAMAGE[damage](only_file(directory, longest))
    query = query_for(longest, 5)
    with SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        snap = store.lookup(FINGERPRINT, SCOPE, query)
        assert snap is not None
        assert snap.key == key_of(runner_up)
        assert problem_with(snap, query) is None


def test_a_file_from_another_store_is_a_miss(tmp_path: Path) -> None:
    """Another store's file for the same key, with other state bytes, planted under our file name."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    fill(ours)
    victim = 12
    tokens = tokens_for(victim)
    with SnapshotStore(theirs, ram_bytes=0, disk_bytes=DISK_BYTES) as other:
        other.put(key_of(victim), tokens, b"\xee" * 3000)
    target = only_file(ours, victim)
    shutil.copyfile(only_file(theirs, victim), target)
    with SnapshotStore(ours, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        assert_serves_only_right_bytes(store, victim)
        assert (
            store.lookup(FINGERPRINT, SCOPE, query_for(victim, 3)) is None
            or problem_with(store.lookup(FINGERPRINT, SCOPE, query_for(victim, 3))) is None
        )


def test_a_whole_foreign_directory_copied_in_is_a_miss(tmp_path: Path) -> None:
    """Their snapshot files (valid for their store) dropped into ours with matching names: all misses."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    fill(ours)
    with SnapshotStore(theirs, ram_bytes=0, disk_bytes=DISK_BYTES) as other:
        for index in INDICES:
            other.put(key_of(index), tokens_for(index), b"\x5a" * (1000 + index))
    for index in INDICES:
        shutil.copyfile(only_file(theirs, index), only_file(ours, index))
    with SnapshotStore(ours, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        for index in INDICES:
            assert store.get(key_of(index)) is None
        assert store.lookup(FINGERPRINT, SCOPE, query_for(16, 3)) is None


def test_a_file_moved_to_another_keys_name_is_a_miss(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    fill(directory)
    moved, overwritten = 4, 8
    source, target = only_file(directory, moved), only_file(directory, overwritten)
    os.replace(source, target)
    with SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        assert store.get(key_of(overwritten)) is None
        assert store.get(key_of(moved)) is None  # its file is gone
        for index in INDICES:
            if index in (moved, overwritten):
                continue
            snap = store.get(key_of(index))
            assert snap is not None
            assert problem_with(snap) is None
        query = query_for(16, 2)
        snap = store.lookup(FINGERPRINT, SCOPE, query)
        assert snap is not None
        assert problem_with(snap, query) is None


def test_a_file_copied_under_another_keys_name_is_a_miss(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    fill(directory)
    shutil.copyfile(only_file(directory, 0), only_file(directory, 1))
    with SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        assert_serves_only_right_bytes(store, 1)


def _truncate_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _truncate_empty(path: Path) -> None:
    path.write_bytes(b"")


INDEX_DAMAGE = {
    "garbage-over-index": garbage_over,
    "garbage-inside-index": garbage_inside,
    "truncated-index": _truncate_half,
    "empty-index": _truncate_empty,
    "index-replaced-by-directory": lambda path: (path.unlink(), path.mkdir()),
}


@pytest.mark.parametrize("damage", INDEX_DAMAGE.values(), ids=INDEX_DAMAGE.keys())
def test_a_damaged_index_is_rebuilt_and_serves_every_intact_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None]
) -> None:
    directory = tmp_path / "cache"
    fill(directory)
    index_files = [p for p in directory.iterdir() if p.is_file() and p.name.startswith("index")]
    assert index_files
    for extra in index_files:
        if extra.name.endswith(("-wal", "-shm")):
            extra.unlink()
    damage(directory / "index.sqlite3")
    with (
        caplog.at_level(logging.WARNING, logger="snapcache"),
        SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store,
    ):
        assert any("rebuilt the snapshot index" in r.getMessage() for r in caplog.records)
        for index in INDICES:
            snap = store.get(key_of(index))
            assert snap is not None, f"intact snapshot {index} was lost with the index"
            assert problem_with(snap) is None
            query = query_for(index, 4)
            snap = store.lookup(FINGERPRINT, SCOPE, query)
            assert snap is not None
            assert problem_with(snap, query) is None
        tokens = tokens_for(40)
        store.put(key_of(40), tokens, state_for(tokens))
        snap = store.get(key_of(40))
        assert snap is not None
        assert problem_with(snap) is None
        assert store.check(repair=False, verify=True).ok


def test_a_damaged_index_and_a_damaged_file_together(tmp_path: Path) -> None:
    """The rebuild reads every file's head: a damaged file is left out, the others are served."""
    directory = tmp_path / "cache"
    fill(directory)
    victim = 12
    FILE_DAMAGE["flip-header"](only_file(directory, victim))
    FILE_DAMAGE["truncate-half"](only_file(directory, 16))  # the head is intact: the size gives it away
    for extra in directory.glob("index.sqlite3-*"):
        extra.unlink()
    garbage_over(directory / "index.sqlite3")
    with SnapshotStore(directory, ram_bytes=RAM_BYTES, disk_bytes=DISK_BYTES) as store:
        assert {row.key for row in store.entries()} == {key_of(i) for i in INDICES if i not in (victim, 16)}
        for index in INDICES:
            snap = store.get(key_of(index))
            assert (snap is None) == (index in (victim, 16))
            assert snap is None or problem_with(snap) is None


# -- a real llama.cpp process restoring from damaged directories ------------------------------------

MODEL_FILE_DAMAGE = [
    "flip-header",
    "flip-tokens",
    "flip-payload",
    "truncate-half",
    "append-4k",
    "replace-with-garbage",
]


def _model_files(directory: Path) -> list[Path]:
    """The snapshot files of a prepared directory, shortest prefix first (sizes grow with tokens)."""
    files = [p for p in (directory / "snapshots").iterdir() if p.suffix == ".snap"]
    return sorted(files, key=lambda p: p.stat().st_size)


def _prepare_damaged(tmp_path: Path, model: Path) -> tuple[dict[str, Path], dict[str, set[int]], list[int]]:
    """Copies of one prepared store, each damaged one way; and which restore lengths each may serve."""
    base, foreign = tmp_path / "base", tmp_path / "foreign"
    lengths = run_worker("model_restore.py", "prepare", model, base, "-")["lengths"]
    run_worker("model_restore.py", "prepare", model, foreign, "-")
    short, long = lengths
    dirs: dict[str, Path] = {}
    allowed: dict[str, set[int]] = {}

    def copy(name: str) -> Path:
        dirs[name] = tmp_path / name
        shutil.copytree(base, dirs[name])
        return dirs[name]

    copy("undamaged")
    allowed["undamaged"] = {long}
    for kind in MODEL_FILE_DAMAGE:
        # The longest prefix is damaged: the shorter one (or nothing) may be served, never the damaged one.
        FILE_DAMAGE[kind](_model_files(copy(f"long-{kind}"))[1])
        allowed[f"long-{kind}"] = {short, 0}
        for path in _model_files(copy(f"both-{kind}")):
            FILE_DAMAGE[kind](path)
        allowed[f"both-{kind}"] = {0}
    target = _model_files(copy("foreign-file"))[1]
    shutil.copyfile(_model_files(foreign)[1], target)
    allowed["foreign-file"] = {short, 0}
    shorter, longer = _model_files(copy("renamed-file"))
    os.replace(shorter, longer)  # the short prefix's file now sits under the long prefix's name
    allowed["renamed-file"] = {0}
    for kind, damage in INDEX_DAMAGE.items():
        directory = copy(kind)
        for extra in directory.glob("index.sqlite3-*"):
            extra.unlink()
        damage(directory / "index.sqlite3")
        allowed[kind] = {long}  # rebuilt from the intact files
    return dirs, allowed, lengths


def _assert_answers_like_cold(model: Path, tmp_path: Path, kinds: list[str] | None = None) -> dict[str, int]:
    dirs, allowed, lengths = _prepare_damaged(tmp_path, model)
    names = list(dirs) if kinds is None else ["undamaged", *kinds]
    out = run_worker("model_restore.py", "answer", model, "-", *(dirs[name] for name in names))
    restored = {}
    for name, result in zip(names, out["results"], strict=True):
        assert result["tokens"] == out["cold"], f"{name}: the answer differs from a cold run"
        assert result["restored"] in allowed[name], f"{name}: restored {result['restored']} tokens"
        restored[name] = result["restored"]
    assert restored["undamaged"] == lengths[1]  # the restore path really ran
    print(f"\nrestored tokens per damaged directory (prompt {out['prompt_tokens']} tokens): {restored}")
    return restored


@pytest.mark.model
def test_a_real_model_process_answers_like_a_cold_run_from_damaged_stores(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    _assert_answers_like_cold(tiny_model_path, tmp_path)


@pytest.mark.model
@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_answers_like_a_cold_run_from_damaged_stores(tmp_path: Path, gemma_model_path: Path) -> None:
    # Gemma's prefill is slow on a small CPU: a few kinds of damage only (the tiny model covers them all).
    _assert_answers_like_cold(
        gemma_model_path, tmp_path, ["long-flip-payload", "both-truncate-half", "foreign-file"]
    )
