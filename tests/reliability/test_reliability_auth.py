"""With a secret, every file carries a keyed MAC; files without a valid one are misses, never served."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import struct
from pathlib import Path

import pytest
from reliability_workers.disk_files import files_of_key, snapshot_files
from reliability_workers.payload import FINGERPRINT, SCOPE, problem_with, query_for, state_for, tokens_for

from snapcache import Snapshot, SnapshotKey, SnapshotStore
from snapcache.formats.codec import ZSTD
from snapcache.formats.snapshot_file import FLAG_MAC, encode, mac_key

INDICES = [0, 4, 8, 1]
DISK_BYTES = 4 << 20
PRELUDE = struct.Struct("<8sHHI")


def key_of(index: int) -> SnapshotKey:
    return SnapshotKey.for_tokens(FINGERPRINT, SCOPE, tokens_for(index))


def fill(directory: Path, secret: bytes | str | None) -> None:
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=DISK_BYTES, secret=secret) as store:
        for index in INDICES:
            tokens = tokens_for(index)
            store.put(key_of(index), tokens, state_for(tokens))


def served(directory: Path, secret: bytes | str | None = None) -> list[int]:
    """Which snapshots a fresh store with `secret` serves; every one served is checked byte for byte."""
    hits = []
    with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK_BYTES, secret=secret) as store:
        for index in INDICES:
            snap = store.get(key_of(index))
            if snap is not None:
                assert problem_with(snap) is None
                hits.append(index)
    return hits


def header_of(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    _magic, _version, flags, length = PRELUDE.unpack_from(data)
    return flags, json.loads(data[PRELUDE.size : PRELUDE.size + length])


def test_every_file_carries_a_mac_when_a_secret_is_set(tmp_path: Path) -> None:
    fill(tmp_path / "c", b"s3cret")
    files = [p for p in snapshot_files(tmp_path / "c") if p.suffix == ".snap"]
    assert len(files) == len(INDICES)
    assert all(header_of(p)[0] & FLAG_MAC for p in files)
    fill(tmp_path / "plain", None)
    assert not any(
        header_of(p)[0] & FLAG_MAC for p in snapshot_files(tmp_path / "plain") if p.suffix == ".snap"
    )


def test_the_same_secret_reads_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(tmp_path / "c", b"s3cret")
    assert served(tmp_path / "c", b"s3cret") == INDICES
    assert served(tmp_path / "c", "s3cret") == INDICES  # text secrets are their UTF-8 bytes
    monkeypatch.setenv("SNAPCACHE_SECRET", "s3cret")
    assert served(tmp_path / "c") == INDICES


@pytest.mark.parametrize(
    ("written_with", "read_with"),
    [(None, b"s3cret"), (b"other", b"s3cret"), (b"s3cret", b"s3cres"), (b"s3cret", None)],
    ids=["unsigned-read-with-secret", "other-secret", "one-letter-off", "signed-read-without-secret"],
)
def test_files_without_a_valid_mac_are_misses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, written_with: bytes | None, read_with: bytes | None
) -> None:
    directory = tmp_path / "c"
    fill(directory, written_with)
    files = {p: p.read_bytes() for p in snapshot_files(directory) if p.suffix == ".snap"}
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        assert served(directory, read_with) == []
        with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK_BYTES, secret=read_with) as store:
            assert store.lookup(FINGERPRINT, SCOPE, query_for(8, 4)) is None
            assert store.check(repair=True, verify=True).ok  # kept: not damage, another's files
    assert any("mac" in r.getMessage().lower() or "secret" in r.getMessage().lower() for r in caplog.records)
    # A reader configured otherwise leaves the files alone: their writer still reads every one.
    assert {p: p.read_bytes() for p in snapshot_files(directory) if p.suffix == ".snap"} == files
    assert served(directory, written_with) == INDICES


def test_a_misconfigured_reader_warns_once_per_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "c"
    fill(directory, b"s3cret")
    with (
        caplog.at_level(logging.WARNING, logger="snapcache"),
        SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK_BYTES, secret=b"wrong") as store,
    ):
        for _ in range(3):
            for index in INDICES:
                assert store.get(key_of(index)) is None
                assert store.lookup(FINGERPRINT, SCOPE, query_for(index, 2)) is None
    warned = [r.getMessage() for r in caplog.records if "MAC" in r.getMessage()]
    assert len(warned) == len(INDICES)
    assert len({message.split()[2] for message in warned}) == len(INDICES)  # one per file name


def test_the_environment_secret_guards_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapcache_dir: Path
) -> None:
    monkeypatch.setenv("SNAPCACHE_SECRET", "from-env")
    fill(snapcache_dir, None)  # an explicit None falls back to the environment's secret
    assert served(snapcache_dir, None) == INDICES
    assert served(snapcache_dir, b"from-env") == INDICES
    # A reader without the secret is refused, and leaves the files to the readers that have it.
    monkeypatch.delenv("SNAPCACHE_SECRET")
    assert served(snapcache_dir, None) == []
    assert served(snapcache_dir, b"from-env") == INDICES


def test_a_forged_file_with_valid_checksums_but_no_valid_mac_is_a_miss(tmp_path: Path) -> None:
    """An attacker who can write the directory, but lacks the secret, plants a well-formed file."""
    directory = tmp_path / "c"
    fill(directory, b"s3cret")
    victim = 4
    target = files_of_key(directory, key_of(victim).id)[0]
    _flags, header = header_of(target)
    tokens = tokens_for(victim)
    forged = Snapshot(key_of(victim), np_tokens(tokens), b"\x66" * 2048)
    for attacker_secret in (None, b"guess"):
        encoded = encode(
            forged,
            store_id=header["store_id"],
            state_codec=ZSTD,
            mac_secret=None if attacker_secret is None else mac_key(attacker_secret),
        )
        target.write_bytes(b"".join(bytes(memoryview(part)) for part in encoded.parts))
        with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK_BYTES, secret=b"s3cret") as store:
            assert store.get(key_of(victim)) is None
            query = query_for(victim, 2)
            snap = store.lookup(FINGERPRINT, SCOPE, query)
            assert snap is None or problem_with(snap, query) is None
        fill(directory, b"s3cret")
        target = files_of_key(directory, key_of(victim).id)[0]


def test_without_a_secret_the_same_forgery_would_be_read(tmp_path: Path) -> None:
    """Why the secret matters: checksums alone do not authenticate (the forgery above is well formed)."""
    directory = tmp_path / "c"
    fill(directory, None)
    victim = 4
    target = files_of_key(directory, key_of(victim).id)[0]
    _flags, header = header_of(target)
    forged = Snapshot(key_of(victim), np_tokens(tokens_for(victim)), b"\x66" * 2048)
    encoded = encode(forged, store_id=header["store_id"], state_codec=ZSTD, mac_secret=None)
    data = b"".join(bytes(memoryview(part)) for part in encoded.parts)
    target.write_bytes(data)
    record_sizes(directory, target, len(data), 2048)  # the forger can write the index too
    with SnapshotStore(directory, ram_bytes=1 << 20, disk_bytes=DISK_BYTES) as store:
        snap = store.get(key_of(victim))
    assert snap is not None
    assert bytes(snap.state) == b"\x66" * 2048


def np_tokens(tokens: object):
    from snapcache.key import as_token_array

    return as_token_array(tokens)  # type: ignore[arg-type]


# -- a real llama.cpp process: a forged file never reaches llama.cpp when a secret is set -------------


def _forge_longest(directory: Path, reader_secret: bytes | None) -> None:
    """Replace the longest snapshot's file by a well-formed one whose KV data is garbage.

    The forger can write the directory and the index, and read the files (they are not encrypted),
    but does not know the secret: the forgery carries no MAC.
    """
    from snapcache.formats.snapshot_file import decode

    files = sorted((directory / "snapshots").glob("*.snap"), key=lambda p: p.stat().st_size)
    target = files[-1]
    _flags, header = header_of(target)
    k = header["key"]
    key = SnapshotKey(k["model_fingerprint"], k["scope"], k["token_count"], k["prefix_hash"])
    original = decode(
        target.read_bytes(),
        key=key,
        store_id=header["store_id"],
        mac_secret=None if reader_secret is None else mac_key(reader_secret),
    )
    state = bytearray(original.state)
    keep = 16 + 24 * key.token_count + 64  # llama.cpp's header and cell list stay plausible
    rng = __import__("numpy").random.default_rng(7)
    state[keep:] = rng.bytes(len(state) - keep)
    forged = Snapshot(key, original.tokens, bytes(state), original.logits, original.priority)
    encoded = encode(forged, store_id=header["store_id"], state_codec=ZSTD, mac_secret=None)
    data = b"".join(bytes(memoryview(part)) for part in encoded.parts)
    target.write_bytes(data)
    record_sizes(directory, target, len(data))


def record_sizes(directory: Path, target: Path, file_bytes: int, state_bytes: int | None = None) -> None:
    """Write the sizes of a replaced file into the index, as a forger who can write it would."""
    with contextlib.closing(sqlite3.connect(directory / "index.sqlite3")) as conn, conn:
        conn.execute("UPDATE entries SET file_bytes = ? WHERE file_name = ?", (file_bytes, target.name))
        if state_bytes is not None:
            conn.execute("UPDATE entries SET state_bytes = ? WHERE file_name = ?", (state_bytes, target.name))


@pytest.mark.model
def test_a_forged_state_never_reaches_llama_cpp_when_a_secret_is_set(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    from reliability_workers.procs import run_worker

    directory = tmp_path / "signed"
    lengths = run_worker("model_restore.py", "prepare", tiny_model_path, directory, "s3cret")["lengths"]
    control = tmp_path / "control"
    shutil_copytree(directory, control)
    _forge_longest(directory, b"s3cret")
    out = run_worker("model_restore.py", "answer", tiny_model_path, "s3cret", control, directory)
    control_result, forged_result = out["results"]
    assert control_result["served"] == control_result["restored"] == lengths[1]
    assert control_result["tokens"] == out["cold"]
    # The forgery is a miss: the store serves the shorter snapshot, which restores.
    assert forged_result["served"] == forged_result["restored"] == lengths[0]
    assert forged_result["tokens"] == out["cold"]


@pytest.mark.model
def test_without_a_secret_a_forged_state_is_read_and_the_process_survives(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """Why the secret exists: checksums alone do not stop a forger. The process still must not crash."""
    from reliability_workers.procs import run_worker

    directory = tmp_path / "unsigned"
    lengths = run_worker("model_restore.py", "prepare", tiny_model_path, directory, "-")["lengths"]
    _forge_longest(directory, None)
    out = run_worker("model_restore.py", "answer", tiny_model_path, "-", directory)
    (result,) = out["results"]
    same = result["tokens"] == out["cold"]
    print(f"\nunsigned forgery: restored {result['restored']} tokens; answer equals cold: {same}")
    # The store hands the forgery to llama.cpp, which either refuses it (a cold prefill) or takes
    # its garbage; either way the process answers.
    assert result["served"] == lengths[1]
    assert result["restored"] in (0, lengths[1])
    assert len(result["tokens"]) > 0


def shutil_copytree(source: Path, target: Path) -> None:
    import shutil

    shutil.copytree(source, target)
