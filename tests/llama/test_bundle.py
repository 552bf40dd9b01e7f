"""Bundles: snapshots and their blocks exported to one file, imported into another store, restored as cold."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chat_support import GREEDY, N_CTX, SYSTEM, chat, chat_reply, cold_chat, context_of

from snapcache import export_bundle, import_bundle
from snapcache.key import BLOCK_TOKENS, block_keys
from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.stored.bundle import BundleError, BundleRefused, CorruptBundle
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

QUESTION = "Which tools can you use?"
_PRELUDE = struct.Struct("<8sHHI")


@dataclass(frozen=True)
class Warmed:
    """A store that warmed SYSTEM on the tiny model, and a bundle of that snapshot without a MAC."""

    directory: Path
    bundle: Path
    key: Any
    token_count: int
    fingerprint: str


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory, llama_factory: Any, tiny_model_path: Path) -> Warmed:
    root = tmp_path_factory.mktemp("warmed")
    llm = llama_factory(tiny_model_path, n_ctx=N_CTX)
    try:
        with SnapshotStore(root / "a", ram_bytes=0, disk_bytes=256 << 20) as store:
            cached = CachedLlama(llm, store)
            result = cached.warm(SYSTEM, priority=3)
            store.flush()
            report = export_bundle(store, [result.key], root / "system.snap", secret=b"")
        assert report.snapshots == (result.key,)
        assert report.blocks == result.token_count // BLOCK_TOKENS > 0
        assert not report.authenticated
        return Warmed(root / "a", report.path, result.key, result.token_count, cached.fingerprint)
    finally:
        llm.close()


@pytest.fixture(autouse=True)
def no_secret_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCACHE_SECRET", raising=False)


def _fresh_store(path: Path) -> SnapshotStore:
    return SnapshotStore(path, ram_bytes=16 << 20, disk_bytes=256 << 20)


def test_a_bundle_imported_into_a_fresh_store_restores_as_cold(warmed, tmp_path, make_llama, tiny_model_path):
    with _fresh_store(tmp_path / "b") as store:
        report = import_bundle(store, warmed.bundle, fingerprint=warmed.fingerprint)
        assert report.snapshots == (warmed.key,)
        assert len(report.stored) == 1 + warmed.token_count // BLOCK_TOKENS
        assert (report.skipped, report.dropped) == ((), ())
        assert report.model_fingerprints == (warmed.fingerprint,)
        [entry] = store.entries()
        assert (entry.key, entry.priority) == (warmed.key, 3)
        assert {row.priority for row in store.entries(blocks=True)} == {3}

        again = import_bundle(store, warmed.bundle, fingerprint=warmed.fingerprint)
        assert again.stored == ()
        assert set(again.skipped) == set(report.stored)

    # A new process on the importing side: its own store object and Llama.
    messages = chat(SYSTEM, QUESTION)
    with _fresh_store(tmp_path / "b") as store:
        restored = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, save=False)
        reply = chat_reply(restored.create_chat_completion(messages, **GREEDY))
        assert restored.last_restore is not None
        assert restored.last_restore.restored_tokens == warmed.token_count
        assert restored.last_restore.source == "disk"
        assert (reply, context_of(restored.llm)) == cold_chat(make_llama, tiny_model_path, messages)


def test_a_bundle_for_another_model_is_refused(warmed, tmp_path, make_llama, tiny_model_path_other_seed):
    other = model_fingerprint(make_llama(tiny_model_path_other_seed, n_ctx=N_CTX))
    assert other != warmed.fingerprint
    with _fresh_store(tmp_path / "b") as store:
        with pytest.raises(BundleRefused, match="another model"):
            import_bundle(store, warmed.bundle, fingerprint=other)
        assert store.entries(blocks=True) == []


def test_a_whole_state_round_trips(tmp_path, make_llama):
    """A recurrent model's state cannot be cut into blocks: the bundle carries it whole."""
    from tiny_model import write_tiny_model

    path = write_tiny_model(tmp_path / "mamba.gguf", "mamba")
    prompt = "Report: the heron waits by the river for the fish to come. " * 6
    with SnapshotStore(tmp_path / "a", ram_bytes=0, disk_bytes=64 << 20) as store:
        warmer = CachedLlama(make_llama(path, n_ctx=N_CTX), store)
        result = warmer.warm(prompt, raw=True)
        store.flush()
        report = export_bundle(store, [result.key], tmp_path / "mamba.snap")
    assert (report.snapshots, report.blocks) == ((result.key,), 0)

    with _fresh_store(tmp_path / "b") as store:
        imported = import_bundle(store, report.path, fingerprint=warmer.fingerprint)
        assert imported.stored == (result.key,)
        assert [row.key for row in store.entries(blocks=True)] == [result.key]  # no blocks
        restored = CachedLlama(make_llama(path, n_ctx=N_CTX), store, save=False)
        text = restored.create_completion(prompt + "Where?", **GREEDY)["choices"][0]["text"]
        assert restored.last_restore is not None
        assert restored.last_restore.restored_tokens == result.token_count
    cold = make_llama(path, n_ctx=N_CTX)
    assert (text, context_of(restored.llm)) == (
        cold.create_completion(prompt + "Where?", **GREEDY)["choices"][0]["text"],
        context_of(cold),
    )


def _manifest_end(data: bytes) -> int:
    return _PRELUDE.size + _PRELUDE.unpack_from(data)[3]


def _damaged(data: bytes, how: str) -> bytes:
    end = _manifest_end(data)
    if how == "cut in the prelude":
        return data[:10]
    if how == "cut in the manifest":
        return data[: end // 2]
    if how == "cut in an entry":
        return data[: (end + len(data)) // 2]
    if how == "one byte short":
        return data[:-1]
    if how == "one byte more":
        return data + b"\0"
    position = {
        "flipped magic": 2,
        "flipped manifest": end - 40,
        "flipped digest": end + 3,
        "flipped entry": (end + len(data)) // 2,
        "flipped last byte": len(data) - 1,
    }[how]
    flipped = bytearray(data)
    flipped[position] ^= 0x10
    return bytes(flipped)


DAMAGE = [
    "cut in the prelude",
    "cut in the manifest",
    "cut in an entry",
    "one byte short",
    "one byte more",
    "flipped magic",
    "flipped manifest",
    "flipped digest",
    "flipped entry",
    "flipped last byte",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_bundle_is_refused_and_nothing_is_stored(warmed, tmp_path, how):
    damaged = tmp_path / "damaged.snap"
    damaged.write_bytes(_damaged(warmed.bundle.read_bytes(), how))
    with _fresh_store(tmp_path / "b") as store:
        with pytest.raises(CorruptBundle, match=r"damaged\.snap"):
            import_bundle(store, damaged, fingerprint=warmed.fingerprint)
        assert store.entries(blocks=True) == []


def _forged(data: bytes) -> bytes:
    """The bundle with one manifest field changed and its SHA-256 digest made to match again."""
    end = _manifest_end(data)
    manifest = json.loads(data[_PRELUDE.size : end])
    manifest["created_at"] += 1.0
    text = json.dumps(manifest, separators=(",", ":")).encode()
    magic, version, flags, _ = _PRELUDE.unpack_from(data)
    head = _PRELUDE.pack(magic, version, flags, len(text)) + text
    return head + hashlib.sha256(head).digest() + data[end + 32 :]


def test_the_mac_decides_when_the_importer_has_a_secret(warmed, tmp_path):
    with SnapshotStore(warmed.directory, ram_bytes=0) as source:
        signed = export_bundle(source, [warmed.key], tmp_path / "signed.snap", secret="team secret")
    assert signed.authenticated
    forged = tmp_path / "forged.snap"
    forged.write_bytes(_forged(signed.path.read_bytes()))

    with _fresh_store(tmp_path / "b") as store:
        with pytest.raises(BundleRefused, match="carries no MAC"):
            import_bundle(store, warmed.bundle, secret="team secret")
        with pytest.raises(BundleRefused, match="MAC mismatch"):
            import_bundle(store, signed.path, secret="another secret")
        with pytest.raises(BundleRefused, match="MAC mismatch"):
            import_bundle(store, forged, secret="team secret")
        assert store.entries(blocks=True) == []

        report = import_bundle(store, signed.path, secret="team secret")
        assert report.authenticated
        assert report.snapshots == (warmed.key,)
        assert store.held_priority(warmed.key) == 3


def test_the_secret_comes_from_the_environment(warmed, tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPCACHE_SECRET", "from the environment")
    with _fresh_store(tmp_path / "b") as store, pytest.raises(BundleRefused, match="carries no MAC"):
        import_bundle(store, warmed.bundle)
    with SnapshotStore(warmed.directory, ram_bytes=0, secret=b"") as source:  # its files have no MAC
        signed = export_bundle(source, [warmed.key], tmp_path / "signed.snap")
    assert signed.authenticated
    with _fresh_store(tmp_path / "b") as store:
        assert import_bundle(store, signed.path).authenticated


def test_an_importer_without_a_secret_accepts_a_signed_bundle_unverified(warmed, tmp_path):
    with SnapshotStore(warmed.directory, ram_bytes=0) as source:
        signed = export_bundle(source, [warmed.key], tmp_path / "signed.snap", secret="team secret")
    with _fresh_store(tmp_path / "b") as store:
        report = import_bundle(store, signed.path)
    assert not report.authenticated
    assert report.snapshots == (warmed.key,)


def test_export_refuses_keys_it_cannot_export(warmed, tmp_path):
    from snapcache import InvalidArgument
    from snapcache.key import SnapshotKey

    target = tmp_path / "out.snap"
    with SnapshotStore(warmed.directory, ram_bytes=0) as source:
        with pytest.raises(InvalidArgument, match="no snapshot keys"):
            export_bundle(source, [], target)
        absent = SnapshotKey.for_tokens(warmed.fingerprint, "default", [1, 2, 3])
        with pytest.raises(InvalidArgument, match="not in the store"):
            export_bundle(source, [absent], target)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file left behind


# -- the command line -------------------------------------------------------------------------------


def run_cli(*args: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SNAPCACHE_DIR": str(cache_dir)}
    env.pop("SNAPCACHE_SECRET", None)
    return subprocess.run(
        [sys.executable, "-m", "snapcache", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _clean_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("snapcache: error: ")
    for word in words:
        assert word in lines[0]


def test_cli_export_and_import(tmp_path, tiny_model_path, tiny_model_path_other_seed):
    prompt = tmp_path / "system.txt"
    prompt.write_text(SYSTEM, encoding="utf-8")
    a, b = tmp_path / "a", tmp_path / "b"
    model = str(tiny_model_path)
    warm = run_cli("warm", str(prompt), "--model", model, "--n-ctx", "2048", "--json", cache_dir=a)
    assert warm.returncode == 0, warm.stderr
    key = json.loads(warm.stdout)["key"]

    bundle = tmp_path / "system.snap"
    exported = run_cli("export", key[:10], "-o", str(bundle), "--json", cache_dir=a)
    assert exported.returncode == 0, exported.stderr
    report = json.loads(exported.stdout)
    assert report["snapshots"] == [key]
    assert report["file_bytes"] == bundle.stat().st_size

    imported = run_cli("import", str(bundle), "--model", model, "--json", cache_dir=b)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["snapshots"] == [key]
    listed = run_cli("ls", "--json", cache_dir=b)
    assert [row["id"] for row in json.loads(listed.stdout)] == [key]

    text = run_cli("import", str(bundle), "--model", model, cache_dir=b)
    assert text.returncode == 0, text.stderr
    assert "held already" in text.stdout

    damaged = tmp_path / "damaged.snap"
    damaged.write_bytes(_damaged(bundle.read_bytes(), "flipped entry"))
    truncated = tmp_path / "truncated.snap"
    truncated.write_bytes(bundle.read_bytes()[:-100])
    c = tmp_path / "c"
    _clean_error(run_cli("import", str(damaged), "--model", model, cache_dir=c), "checksum")
    _clean_error(run_cli("import", str(truncated), "--model", model, cache_dir=c), "truncated")
    missing = run_cli("import", str(tmp_path / "missing.snap"), "--model", model, cache_dir=c)
    _clean_error(missing, "no bundle")
    wrong_model = run_cli("import", str(bundle), "--model", str(tiny_model_path_other_seed), cache_dir=c)
    _clean_error(wrong_model, "another model")
    listed = run_cli("ls", "--json", cache_dir=c)
    assert json.loads(listed.stdout) == []

    _clean_error(run_cli("export", "ffff", "-o", str(tmp_path / "x.snap"), cache_dir=a), "no snapshot")
    _clean_error(run_cli("export", key, "-o", str(tmp_path / "no" / "x.snap"), cache_dir=a))


def test_exporting_a_record_whose_block_is_gone_names_the_missing_block(
    warmed: Warmed, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    shutil.copytree(warmed.directory, directory)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=256 << 20) as store:
        snapshot = store.get(warmed.key)
        assert snapshot is not None
        blocks = block_keys(warmed.key.model_fingerprint, warmed.key.scope, snapshot.tokens, 2)
        assert store.remove(blocks[1])
        with pytest.raises(BundleError, match=r"lacks block 2 of its"):
            export_bundle(store, [warmed.key], tmp_path / "out.snap", secret=b"")
    assert not (tmp_path / "out.snap").exists()
