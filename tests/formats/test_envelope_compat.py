"""The bytes each format writes are pinned: snapshot, pack and bundle files from fixed inputs, with and
without a secret, hash to digests taken once from the code before the checked envelope was shared,
and read back. A change to any written byte fails here before it reaches a user's cache."""

from __future__ import annotations

import hashlib
import io

import blake3
import numpy as np
import pytest

from snapcache.formats import bundle_file, codec, pack_file, snapshot_file
from snapcache.formats.codec import ZSTD
from snapcache.key import BLOCK_TOKENS, SnapshotKey, block_keys
from snapcache.snapshot import Snapshot

SECRET = b"envelope-compat-secret"
CREATED_AT = 1_764_115_200.25
STORE_ID = "compat-store"

# sha256 of each file, computed once with the formats as they were before the envelope was shared
# (the compressed payloads of python-blosc2 4.x included: a codec upgrade that changes them fails here too).
SNAPSHOT_SHA256 = {
    "plain": "294dbb25428735daf88b1036000872e6448fe5054825a55800fd151dd43b0059",
    "mac": "4dbc74cfaa2f4eaa0f70f54a776fd987050c019825e7c4ba0a674046a102f632",
}
SNAPSHOT_NO_LOGITS_SHA256 = {
    "plain": "a6a870b632ec34b5ef0a01127d378423452d1e5c14f9fc6119ae4df0216a0527",
    "mac": "2ddae665a4ede480760713e5620125011f52634d42a250364ac8cfba1c769c2a",
}
PACK_SHA256 = {
    "plain": "344ec4f7f3425cc7a00756ab52633f560bc24eec45c354b076b79f481a623f88",
    "mac": "99021f2e4490480faa10605f6e805cb3794b22c24984dc6dc545afb7d6f796e7",
}
BUNDLE_SHA256 = {
    "plain": "7e09d32a48f3645f627ee8bef6676199d3e8e3c74127582ca2357286e25db67e",
    "mac": "e145cc88d96d28217546c2f7941a23e4cc12fef2228e3e11f9c8c6403f7707c4",
}


def mac_secret_of(name: str) -> bytes | None:
    return snapshot_file.mac_key(SECRET) if name == "mac" else None


def state_bytes(seed: int, size: int) -> bytes:
    """KV-like float16 values: compressible, but not trivially."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size // 2) * np.linspace(0.1, 2.0, size // 2)
    return values.astype(np.float16).tobytes()


def whole_snapshot(*, logits: bool) -> Snapshot:
    tokens = (np.arange(100, dtype=np.int32) * 37 + 5) % 32_000
    key = SnapshotKey.for_tokens("compat-model", "agent-a", tokens)
    row = np.linspace(-3.0, 3.0, 64, dtype=np.float32) if logits else None
    return Snapshot(key, tokens, state_bytes(11, 40_000), logits=row, priority=3, created_at=CREATED_AT)


def blocks() -> list[Snapshot]:
    tokens = (np.arange(3 * BLOCK_TOKENS, dtype=np.int32) * 101 + 7) % 32_000
    keys = block_keys("compat-model", "agent-a", tokens, 3)
    return [
        Snapshot(
            key,
            tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS],
            state_bytes(20 + i, 8_192),
            priority=1,
            created_at=CREATED_AT,
        )
        for i, key in enumerate(keys)
    ]


def joined(parts: tuple[object, ...]) -> bytes:
    return b"".join(bytes(memoryview(part).cast("B")) for part in parts)  # type: ignore[arg-type]


def snapshot_file_bytes(snapshot: Snapshot, mac_secret: bytes | None) -> bytes:
    encoded = snapshot_file.encode(snapshot, store_id=STORE_ID, state_codec=ZSTD, mac_secret=mac_secret)
    data = joined(encoded.parts)
    assert len(data) == encoded.size
    return data


def pack_bytes(mac_secret: bytes | None) -> bytes:
    encoded = pack_file.encode_pack(blocks(), store_id=STORE_ID, state_codec=ZSTD, mac_secret=mac_secret)
    data = joined(encoded.parts)
    assert len(data) == encoded.size == sum(encoded.shares)
    return data


def bundle_bytes(mac_secret: bytes | None) -> bytes:
    """A bundle as export_bundle lays it out: the head, then each entry's snapshot file."""
    snapshots = [whole_snapshot(logits=False), *blocks()]
    entries: list[bundle_file.ManifestEntry] = []
    body: list[bytes] = []
    offset = 0
    for snapshot in snapshots:
        data = snapshot_file_bytes_for_bundle(snapshot)
        entries.append(
            bundle_file.ManifestEntry(
                key=snapshot.key,
                kind="block" if snapshot.key.is_block else "whole",
                priority=snapshot.priority,
                state_bytes=len(bytes(snapshot.state)),
                offset=offset,
                length=len(data),
                file_blake3=blake3.blake3(data).hexdigest(),
                content_blake3=bundle_file.content_digest(snapshot),
            )
        )
        body.append(data)
        offset += len(data)
    manifest = bundle_file.Manifest(
        snapcache_version="0.0.0-compat",
        state_seq_version=1,
        model_fingerprints=("compat-model",),
        created_at=CREATED_AT,
        entries=tuple(entries),
    )
    return bundle_file.encode_head(manifest, mac_secret) + b"".join(body)


def snapshot_file_bytes_for_bundle(snapshot: Snapshot) -> bytes:
    encoded = snapshot_file.encode(
        snapshot,
        store_id=bundle_file.ENTRY_STORE_ID,
        state_codec=codec.ZSTD,
        mac_secret=None,
    )
    return joined(encoded.parts)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", ["plain", "mac"])
@pytest.mark.parametrize("logits", [True, False])
def test_snapshot_files_keep_their_bytes_and_read_back(name: str, logits: bool) -> None:
    snapshot = whole_snapshot(logits=logits)
    mac_secret = mac_secret_of(name)
    data = snapshot_file_bytes(snapshot, mac_secret)
    pinned = SNAPSHOT_SHA256 if logits else SNAPSHOT_NO_LOGITS_SHA256
    assert sha256(data) == pinned[name]

    back = snapshot_file.decode(data, key=snapshot.key, store_id=STORE_ID, mac_secret=mac_secret)
    assert bytes(back.state) == bytes(snapshot.state)
    assert np.array_equal(back.tokens, snapshot.tokens)
    assert (back.logits is None) == (not logits)
    if logits:
        assert np.array_equal(back.logits, snapshot.logits)
    assert (back.priority, back.created_at) == (3, CREATED_AT)

    header = snapshot_file.read_header(io.BytesIO(data), len(data), mac_secret=mac_secret)
    assert header.key == snapshot.key
    assert header.authenticated
    assert (header.store_id, header.file_bytes, header.state_bytes) == (STORE_ID, len(data), 40_000)
    # Read under the other configuration: intact, but not authenticated.
    other = snapshot_file.mac_key(SECRET) if mac_secret is None else None
    assert not snapshot_file.read_header(io.BytesIO(data), len(data), mac_secret=other).authenticated
    with pytest.raises(snapshot_file.MacMismatch):
        snapshot_file.decode(data, key=snapshot.key, store_id=STORE_ID, mac_secret=other)


@pytest.mark.parametrize("name", ["plain", "mac"])
def test_pack_files_keep_their_bytes_and_read_back(name: str) -> None:
    mac_secret = mac_secret_of(name)
    data = pack_bytes(mac_secret)
    assert sha256(data) == PACK_SHA256[name]

    head = pack_file.read_pack_head(io.BytesIO(data), len(data), mac_secret=mac_secret)
    assert head.authenticated
    assert head.has_mac == (name == "mac")
    assert (head.store_id, head.priority, head.created_at) == (STORE_ID, 1, CREATED_AT)
    for block, member in zip(blocks(), head.members, strict=True):
        assert member.key == block.key
        got = pack_file.decode_member(head, member, data[member.offset : member.offset + member.size])
        assert bytes(got.state) == bytes(block.state)
        assert np.array_equal(pack_file.read_member_tokens(io.BytesIO(data), member), block.tokens)
    other = snapshot_file.mac_key(SECRET) if mac_secret is None else None
    foreign = pack_file.read_pack_head(io.BytesIO(data), len(data), mac_secret=other)
    assert not foreign.authenticated
    member = foreign.members[0]
    with pytest.raises(snapshot_file.MacMismatch):
        pack_file.decode_member(foreign, member, data[member.offset : member.offset + member.size])


@pytest.mark.parametrize("name", ["plain", "mac"])
def test_bundle_files_keep_their_bytes_and_read_back(name: str) -> None:
    mac_secret = mac_secret_of(name)
    data = bundle_bytes(mac_secret)
    assert sha256(data) == BUNDLE_SHA256[name]

    head = bundle_file.read_head(io.BytesIO(data), len(data), mac_secret)
    assert head.has_mac == (name == "mac")
    assert head.authenticated == (name == "mac")
    manifest = head.manifest
    assert manifest.created_at == CREATED_AT
    assert head.entries_start + manifest.payload_bytes == len(data)
    snapshots = [whole_snapshot(logits=False), *blocks()]
    for snapshot, entry in zip(snapshots, manifest.entries, strict=True):
        assert entry.key == snapshot.key
        start = head.entries_start + entry.offset
        raw = data[start : start + entry.length]
        assert blake3.blake3(raw).hexdigest() == entry.file_blake3
        back = snapshot_file.decode(raw, key=entry.key, store_id=bundle_file.ENTRY_STORE_ID, mac_secret=None)
        assert bytes(back.state) == bytes(snapshot.state)
    # Without a secret a MAC is not checked; with one, a bundle without a MAC is refused.
    assert not bundle_file.read_head(io.BytesIO(data), len(data), None).authenticated
    if mac_secret is None:
        with pytest.raises(bundle_file.BundleRefused, match="carries no MAC"):
            bundle_file.read_head(io.BytesIO(data), len(data), snapshot_file.mac_key(SECRET))
    else:
        with pytest.raises(bundle_file.BundleRefused, match="MAC mismatch"):
            bundle_file.read_head(io.BytesIO(data), len(data), snapshot_file.mac_key(b"another"))
