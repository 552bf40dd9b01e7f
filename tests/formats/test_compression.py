"""How a tier stores states (formats.compression): "auto" measures each model's states once and stores
them raw unless zstd saves a quarter; raw payloads read back exactly, are checked like compressed ones,
and files written under any setting read under every other."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import xxhash

from snapcache import CorruptSnapshot, InvalidArgument, Snapshot, SnapshotKey, SnapshotStore
from snapcache.disk.files import FILES_DIR
from snapcache.formats import codec, pack_file, snapshot_file
from snapcache.formats.codec import RAW_CODEC, ZSTD
from snapcache.formats.compression import CodecChoice, validate_compression
from snapcache.key import BLOCK_TOKENS, block_keys

TOKENS = list(range(1, 41))


def noise(n: int, seed: int = 0) -> bytes:
    """What zstd cannot shrink."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def half_zeros(n: int, seed: int = 0) -> bytes:
    """What zstd halves."""
    return noise(n // 2, seed) + bytes(n - n // 2)


def snapshot_of(state: bytes, fingerprint: str = "fp") -> Snapshot:
    key = SnapshotKey.for_tokens(fingerprint, "s", TOKENS)
    return Snapshot(key, np.asarray(TOKENS, dtype=np.int32), state)


def codec_names(directory: Path) -> list[str]:
    """The codec each file of a disk tier's folder names in its header."""
    names = []
    for path in sorted((directory / FILES_DIR).iterdir()):
        data = path.read_bytes()
        _magic, _version, _flags, length = snapshot_file.PRELUDE.unpack_from(data)
        header = json.loads(data[snapshot_file.PRELUDE.size : snapshot_file.PRELUDE.size + length])
        names.append(header["codec"]["name"])
    return names


def test_auto_stores_what_zstd_barely_shrinks_raw_and_keeps_zstd_where_it_pays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    choice = CodecChoice("auto")
    with caplog.at_level(logging.INFO, logger="snapcache.formats"):
        assert choice.for_state("noisy", noise(1 << 20)) == RAW_CODEC
        assert choice.for_state("sparse", half_zeros(1 << 20)) == ZSTD
    assert choice.chosen() == {"noisy": codec.RAW, "sparse": codec.NAME}
    assert "stored raw" in caplog.text
    assert "stored compressed" in caplog.text


def test_auto_judges_a_model_once() -> None:
    choice = CodecChoice("auto")
    assert choice.for_state("fp", noise(1 << 16)) == RAW_CODEC
    # The next state of that model is not measured again, whatever it holds.
    assert choice.for_state("fp", bytes(1 << 16)) == RAW_CODEC


def test_a_state_too_small_to_judge_a_model_by_is_judged_alone() -> None:
    choice = CodecChoice("auto")
    assert choice.for_state("fp", bytes(1000)) == ZSTD  # zeros: zstd saves nearly all
    assert choice.chosen() == {}
    assert choice.for_state("fp", noise(1 << 16)) == RAW_CODEC
    assert choice.chosen() == {"fp": codec.RAW}


def test_zstd_and_none_do_not_measure() -> None:
    assert CodecChoice("zstd").for_state("fp", noise(4096)) == ZSTD
    assert CodecChoice("none").for_state("fp", bytes(4096)) == RAW_CODEC
    assert CodecChoice("zstd").chosen() == {}


@pytest.mark.parametrize("bad", ["lz4", "", "AUTO", None, 1])
def test_an_unknown_compression_is_refused_by_name(bad: object, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="compression must be one of auto, zstd, none"):
        validate_compression(bad)
    if isinstance(bad, str) and bad:
        with pytest.raises(InvalidArgument, match="compression must be one of"):
            SnapshotStore(tmp_path, compression=bad)  # type: ignore[arg-type]


def test_the_environment_sets_the_store_s_compression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPCACHE_COMPRESSION", "zstd")
    with SnapshotStore(tmp_path / "a", ram_bytes=0) as store:
        assert store.compression == "zstd"
        store.put(snapshot_of(noise(4096)).key, TOKENS, noise(4096))
    assert codec_names(tmp_path / "a") == [codec.NAME]
    with SnapshotStore(tmp_path / "b", ram_bytes=0, compression="none") as store:
        assert store.compression == "none"
    monkeypatch.delenv("SNAPCACHE_COMPRESSION")
    with SnapshotStore(tmp_path / "c", ram_bytes=0) as store:
        assert store.compression == "auto"


def test_a_raw_file_holds_the_state_as_it_is_and_reads_back() -> None:
    state = half_zeros(50_000)
    encoded = snapshot_file.encode(snapshot_of(state), store_id="s", state_codec=RAW_CODEC, mac_secret=None)
    data = b"".join(bytes(memoryview(part)) for part in encoded.parts)
    assert data.endswith(state)  # the payload is the state itself
    decoded = snapshot_file.decode(data, key=snapshot_of(state).key, store_id="s", mac_secret=None)
    assert bytes(decoded.state) == state


def test_a_raw_state_read_into_a_buffer_is_a_view_of_what_was_read() -> None:
    state = noise(10_000)
    encoded = snapshot_file.encode(snapshot_of(state), store_id="s", state_codec=RAW_CODEC, mac_secret=None)
    data = bytearray(b"".join(bytes(memoryview(part)) for part in encoded.parts))
    decoded = snapshot_file.decode(
        data, key=snapshot_of(state).key, store_id="s", mac_secret=None, state_into=memoryview(bytearray(1))
    )
    assert bytes(decoded.state) == state
    data[-1] ^= 0xFF  # no copy was made: the state is the bytes read
    assert bytes(decoded.state)[-1] == state[-1] ^ 0xFF


def test_a_damaged_raw_payload_is_refused_before_it_is_used() -> None:
    state = noise(20_000)
    encoded = snapshot_file.encode(snapshot_of(state), store_id="s", state_codec=RAW_CODEC, mac_secret=None)
    data = bytearray(b"".join(bytes(memoryview(part)) for part in encoded.parts))
    data[-5_000] ^= 0x01
    with pytest.raises(CorruptSnapshot, match="payload checksum"):
        snapshot_file.decode(bytes(data), key=snapshot_of(state).key, store_id="s", mac_secret=None)


def test_a_raw_payload_of_another_size_than_its_state_is_refused() -> None:
    """A forger's file whose digests agree but whose raw payload is shorter than the state it
    declares: refused, never handed to llama.cpp short."""
    state = noise(20_000)
    encoded = snapshot_file.encode(snapshot_of(state), store_id="s", state_codec=RAW_CODEC, mac_secret=None)
    head, tokens, logits, payload = (bytes(memoryview(part)) for part in encoded.parts)
    _magic, version, _flags, length = snapshot_file.PRELUDE.unpack_from(head)
    header = json.loads(head[snapshot_file.PRELUDE.size : snapshot_file.PRELUDE.size + length])
    short = payload[:-100]
    header["payload_bytes"] = len(short)
    header["payload_xxh3"] = xxhash.xxh3_128_hexdigest(short)
    forged = snapshot_file.SNAPSHOT.head(version, header, None, too_large=CorruptSnapshot)
    with pytest.raises(CorruptSnapshot, match="raw payload is 19900 bytes, expected 20000"):
        snapshot_file.decode(
            forged + tokens + logits + short, key=snapshot_of(state).key, store_id="s", mac_secret=None
        )


def test_a_pack_of_raw_blocks_reads_back() -> None:
    tokens = list(range(1, 2 * BLOCK_TOKENS + 1))
    keys = block_keys("fp", "s", np.asarray(tokens, dtype=np.int32), 2)
    blocks = [
        Snapshot(
            key, np.asarray(tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS], dtype=np.int32), noise(3000, i)
        )
        for i, key in enumerate(keys)
    ]
    encoded = pack_file.encode_pack(blocks, store_id="s", state_codec=RAW_CODEC, mac_secret=None)
    data = b"".join(bytes(memoryview(part)) for part in encoded.parts)
    head = pack_file.parse_pack_head(data, len(data), mac_secret=None)
    assert head.state_codec == RAW_CODEC
    for block, member in zip(blocks, head.members, strict=True):
        got = pack_file.decode_member(head, member, data[member.offset : member.offset + member.size])
        assert bytes(got.state) == bytes(block.state)


@pytest.mark.parametrize("written", ["auto", "zstd", "none"])
@pytest.mark.parametrize("read", ["auto", "zstd", "none"])
def test_files_written_under_one_setting_read_under_every_other(
    tmp_path: Path, written: str, read: str
) -> None:
    states = {"noisy": noise(30_000), "sparse": half_zeros(30_000)}
    with SnapshotStore(tmp_path, ram_bytes=0, compression=written) as store:  # type: ignore[arg-type]
        for fingerprint, state in states.items():
            store.put(snapshot_of(state, fingerprint).key, TOKENS, state)
    expected = {"auto": [codec.RAW, codec.NAME], "zstd": [codec.NAME] * 2, "none": [codec.RAW] * 2}[written]
    assert sorted(codec_names(tmp_path)) == sorted(expected)
    with SnapshotStore(tmp_path, ram_bytes=0, compression=read) as store:  # type: ignore[arg-type]
        for fingerprint, state in states.items():
            found = store.get(snapshot_of(state, fingerprint).key)
            assert found is not None
            assert bytes(found.state) == state
