"""The snapshot file format: version 2 written and checked before decoding, version 1 still read."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from snapcache.disk.disk_tier import FILES_DIR, INDEX_NAME, DiskTier
from snapcache.errors import CorruptSnapshot
from snapcache.formats import codec, snapshot_file
from snapcache.formats.codec import ZSTD
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
PRELUDE = snapshot_file.PRELUDE
MB = 1 << 20

# What the format-1 fixtures hold: written by snapcache 0.1.0's encode from these values.
V1_TOKENS = np.arange(1, 33, dtype=np.int32)
V1_KEY = SnapshotKey.for_tokens("format-v1-model", "default", V1_TOKENS)
V1_STORE_ID = "format-v1-store"
V1_SECRET = b"format-v1-secret"


def v1_state() -> bytes:
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((64, 64)) * np.linspace(0.1, 2.0, 64)
    return rows.astype(np.float16).tobytes()


def v1_file(name: str) -> bytes:
    return (DATA / f"format-v1-{name}.snap").read_bytes()


def secret_of(name: str) -> bytes | None:
    return snapshot_file.mac_key(V1_SECRET) if name == "mac" else None


def make_snapshot(seed: int = 1, state_bytes: int = 300_000) -> Snapshot:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 32_000, 40, dtype=np.int32)
    values = rng.standard_normal(state_bytes // 2) * 0.5
    state = values.astype(np.float16).tobytes()
    key = SnapshotKey.for_tokens("fp", "default", tokens)
    return Snapshot(key, tokens, state, logits=rng.standard_normal(100).astype(np.float32), priority=2)


def encoded(snapshot: Snapshot, mac_secret: bytes | None = None) -> bytes:
    parts = snapshot_file.encode(snapshot, store_id="s", state_codec=ZSTD, mac_secret=mac_secret).parts
    return b"".join(bytes(part) for part in parts)


def split(data: bytes) -> tuple[int, int, dict[str, Any], bytes]:
    """Version, flags, header and what follows the header digest (no MAC) of a file."""
    _, version, flags, length = PRELUDE.unpack_from(data)
    header = json.loads(data[PRELUDE.size : PRELUDE.size + length])
    return version, flags, header, data[PRELUDE.size + length + 32 :]


def rewritten(
    data: bytes, *, version: int | None = None, edit: Callable[[dict[str, Any]], None] = id
) -> bytes:
    """`data` with its header edited and its header digest recomputed, as anyone can (no secret)."""
    old_version, flags, header, body = split(data)
    edit(header)
    raw = json.dumps(header, separators=(",", ":")).encode()
    head = (
        PRELUDE.pack(snapshot_file.MAGIC, old_version if version is None else version, flags, len(raw)) + raw
    )
    return head + hashlib.sha256(head).digest() + body


def payload_offset(header: dict[str, Any], data: bytes) -> int:
    return len(data) - int(header["payload_bytes"])


# -- format 1, as snapcache 0.1.0 wrote it -----------------------------------------------------------


@pytest.mark.parametrize("name", ["plain", "mac"])
def test_a_format_1_file_decodes_to_its_snapshot(name: str) -> None:
    data = v1_file(name)
    assert PRELUDE.unpack_from(data)[1] == 1
    snapshot = snapshot_file.decode(data, key=V1_KEY, store_id=V1_STORE_ID, mac_secret=secret_of(name))
    assert bytes(snapshot.state) == v1_state()
    assert np.array_equal(snapshot.tokens, V1_TOKENS)
    assert snapshot.priority == 3
    if name == "mac":
        assert snapshot.logits is not None
        assert np.array_equal(snapshot.logits, np.linspace(-1, 1, 50, dtype=np.float32))


def test_a_format_1_file_under_another_secret_is_a_mac_mismatch() -> None:
    with pytest.raises(snapshot_file.MacMismatch):
        snapshot_file.decode(v1_file("mac"), key=V1_KEY, store_id=V1_STORE_ID, mac_secret=None)


@pytest.mark.parametrize("name", ["plain", "mac"])
def test_a_damaged_format_1_file_is_refused(name: str) -> None:
    data = bytearray(v1_file(name))
    data[-200] ^= 0x04  # inside the zstd frame
    with pytest.raises(CorruptSnapshot):
        snapshot_file.decode(bytes(data), key=V1_KEY, store_id=V1_STORE_ID, mac_secret=secret_of(name))


@pytest.mark.parametrize("name", ["plain", "mac"])
def test_a_format_1_file_in_a_store_directory_is_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """An upgrade keeps what 0.1.0 stored: the index rebuilt from the files serves both formats."""
    directory = tmp_path / "cache"
    secret = V1_SECRET if name == "mac" else None
    tier = DiskTier(directory, 64 * MB, secret=secret)
    fresh = make_snapshot()
    assert tier.put(fresh)
    store_id = tier._store_id
    tier.close()
    # The store id is part of the head; rewriting it needs the secret when there is one.
    _, version, flags, _ = PRELUDE.unpack_from(v1_file(name))
    _, _, header, rest = split(v1_file(name))
    header["store_id"] = store_id
    raw = json.dumps(header, separators=(",", ":")).encode()
    head = PRELUDE.pack(snapshot_file.MAGIC, version, flags, len(raw)) + raw
    checks = hashlib.sha256(head).digest()
    if secret is not None:
        import hmac

        checks += hmac.digest(snapshot_file.mac_key(secret), head, "sha256")
        rest = rest[32:]
    (directory / FILES_DIR / f"{V1_KEY.id}-{'0' * 12}.snap").write_bytes(head + checks + rest)
    (directory / INDEX_NAME).unlink()
    with caplog.at_level(logging.WARNING, logger="snapcache"):
        tier = DiskTier(directory, 64 * MB, secret=secret)
    assert "2 snapshot(s) recovered" in caplog.text
    old = tier.get(V1_KEY)
    assert old is not None
    assert bytes(old.state) == v1_state()
    new = tier.get(fresh.key)
    assert new is not None
    assert bytes(new.state) == bytes(fresh.state)
    assert tier.check(repair=False, verify=True, grace_seconds=0).ok
    tier.close()


# -- format 2 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [None, b"k"])
def test_new_files_are_format_2_with_the_digest_their_mode_needs(secret: bytes | None) -> None:
    snapshot = make_snapshot()
    mac_secret = None if secret is None else snapshot_file.mac_key(secret)
    data = encoded(snapshot, mac_secret)
    _, version, flags, length = PRELUDE.unpack_from(data)
    header = json.loads(data[PRELUDE.size : PRELUDE.size + length])
    assert version == snapshot_file.FORMAT_VERSION == 2
    assert header["codec"] == {"name": "blosc2-zstd", "level": 1, "shuffle": 2}
    payload = data[len(data) - header["payload_bytes"] :]
    if secret is None:
        assert header["payload_xxh3"] == xxhash.xxh3_128_hexdigest(payload)
        assert "payload_blake3" not in header
    else:
        assert flags & snapshot_file.FLAG_MAC
        assert len(bytes.fromhex(header["payload_blake3"])) == 32
        assert "payload_xxh3" not in header
    back = snapshot_file.decode(data, key=snapshot.key, store_id="s", mac_secret=mac_secret)
    assert bytes(back.state) == bytes(snapshot.state)
    assert back.logits is not None
    assert snapshot.logits is not None
    assert np.array_equal(back.logits, snapshot.logits)


def test_a_state_of_several_chunks_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "CHUNK_BYTES", 64 << 10)
    snapshot = make_snapshot(state_bytes=300_002)  # four full chunks and a short one
    back = snapshot_file.decode(encoded(snapshot), key=snapshot.key, store_id="s", mac_secret=None)
    assert bytes(back.state) == bytes(snapshot.state)


@pytest.mark.parametrize("secret", [None, b"k"])
@pytest.mark.parametrize("where", ["first byte", "middle", "last byte"])
def test_a_damaged_payload_is_refused_before_it_is_decompressed(
    monkeypatch: pytest.MonkeyPatch, secret: bytes | None, where: str
) -> None:
    snapshot = make_snapshot()
    mac_secret = None if secret is None else snapshot_file.mac_key(secret)
    data = bytearray(encoded(snapshot, mac_secret))
    start = len(data) - len(codec.compress(snapshot.state))
    offset = {"first byte": start, "middle": (start + len(data)) // 2, "last byte": len(data) - 1}[where]
    data[offset] ^= 0x01
    calls: list[int] = []
    monkeypatch.setattr(codec, "decompress", lambda *a, **k: calls.append(1))
    with pytest.raises(CorruptSnapshot, match="payload checksum"):
        snapshot_file.decode(bytes(data), key=snapshot.key, store_id="s", mac_secret=mac_secret)
    assert calls == []


def lie_about_state_size(data: bytes, declared: int) -> bytes:
    """A forger's file: the chunk header declares `declared` bytes, and the digests say it is fine."""
    _, _, header, _ = split(data)
    start = payload_offset(header, data)
    forged = bytearray(data)
    forged[start + 4 : start + 8] = declared.to_bytes(4, "little", signed=True)
    payload = bytes(forged[start:])
    return rewritten(
        bytes(forged), edit=lambda h: h.__setitem__("payload_xxh3", xxhash.xxh3_128_hexdigest(payload))
    )


@pytest.mark.parametrize("declared", [1 << 30, 300_000 + 2, 300_000 - 2, 0])
def test_a_chunk_that_lies_about_its_size_is_refused(declared: int) -> None:
    snapshot = make_snapshot()
    forged = lie_about_state_size(encoded(snapshot), declared)
    with pytest.raises(CorruptSnapshot, match="blosc2 chunk declares"):
        snapshot_file.decode(forged, key=snapshot.key, store_id="s", mac_secret=None)


def test_a_chunk_that_lies_about_its_size_is_a_logged_miss_in_a_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tier = DiskTier(tmp_path / "cache", 64 * MB, compression="zstd")
    snapshot = make_snapshot()
    assert tier.put(snapshot)
    (path,) = (tmp_path / "cache" / FILES_DIR).glob(f"{snapshot.key.id}-*.snap")
    path.write_bytes(lie_about_state_size(path.read_bytes(), 1 << 30))
    assert tier.get(snapshot.key) is None
    assert "blosc2 chunk declares" in caplog.text
    assert not path.exists()
    tier.close()


@pytest.mark.parametrize("version", [0, 3, 0xFFFF])
def test_an_unknown_format_version_is_refused(version: int) -> None:
    snapshot = make_snapshot()
    with pytest.raises(CorruptSnapshot, match=f"unsupported snapshot format version {version}"):
        snapshot_file.decode(
            rewritten(encoded(snapshot), version=version), key=snapshot.key, store_id="s", mac_secret=None
        )


def test_a_format_2_file_labelled_format_1_is_refused() -> None:
    snapshot = make_snapshot()
    with pytest.raises(CorruptSnapshot, match="unknown codec"):
        snapshot_file.decode(
            rewritten(encoded(snapshot), version=1), key=snapshot.key, store_id="s", mac_secret=None
        )


def test_a_format_1_file_labelled_format_2_is_refused() -> None:
    with pytest.raises(CorruptSnapshot, match="unknown codec"):
        snapshot_file.decode(
            rewritten(v1_file("plain"), version=2), key=V1_KEY, store_id=V1_STORE_ID, mac_secret=None
        )
