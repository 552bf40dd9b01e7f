"""Pack files: the blocks of one save in one file behind one checked header. Each block keeps a row
whose bytes are its share of the pack, so that the budget counts the bytes on disk; a damaged block
is a miss, never wrong bytes, and the pack goes with its last row."""

from __future__ import annotations

import dataclasses
import io
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from block_snapshots import block_snapshots

from snapcache.disk import index_schema
from snapcache.disk.disk_tier import PACK_MEMBERS, DiskTier, Miss
from snapcache.disk.files import FILES_DIR, INDEX_NAME, is_pack_name
from snapcache.errors import CorruptSnapshot
from snapcache.formats.codec import ZSTD
from snapcache.formats.pack_file import decode_member, encode_pack, read_member_tokens, read_pack_head
from snapcache.formats.snapshot_file import MacMismatch, mac_key
from snapcache.key import MAX_SCOPE_LENGTH, block_keys
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore


def pack_bytes(blocks: list[Snapshot], secret: bytes | None = None) -> bytes:
    encoded = encode_pack(
        blocks, store_id="s1", state_codec=ZSTD, mac_secret=None if secret is None else mac_key(secret)
    )
    data = b"".join(bytes(memoryview(part).cast("B")) for part in encoded.parts)
    assert len(data) == encoded.size == sum(encoded.shares)
    return data


def stored_files(tier: DiskTier) -> list[str]:
    return sorted(os.listdir(tier.directory / FILES_DIR))


def files_size(tier: DiskTier) -> int:
    return sum((tier.directory / FILES_DIR / name).stat().st_size for name in stored_files(tier))


def packed_and_damaged(tier: DiskTier, blocks: list[Snapshot], at: int) -> str:
    """Put `blocks` into one pack and flip its byte `at`; the pack's name."""
    tier.put_many(blocks)
    (name,) = stored_files(tier)
    path = tier.directory / FILES_DIR / name
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(data)
    return name


def test_a_pack_round_trips_every_block_and_checks_each_one() -> None:
    blocks = block_snapshots(5)
    data = pack_bytes(blocks)
    head = read_pack_head(io.BytesIO(data), len(data), mac_secret=None)
    assert [member.key for member in head.members] == [block.key for block in blocks]
    for block, member in zip(blocks, head.members, strict=True):
        got = decode_member(head, member, data[member.offset : member.offset + member.size])
        assert bytes(got.state) == bytes(block.state)
        assert np.array_equal(got.tokens, block.tokens)
    damaged = bytearray(data)
    member = head.members[2]
    damaged[member.offset + member.size - 7] ^= 1
    with pytest.raises(CorruptSnapshot, match="checksum"):
        decode_member(head, member, damaged[member.offset : member.offset + member.size])
    header_damaged = bytearray(data)
    header_damaged[40] ^= 1
    with pytest.raises(CorruptSnapshot):
        read_pack_head(io.BytesIO(header_damaged), len(data), mac_secret=None)
    with pytest.raises(CorruptSnapshot, match="bytes"):
        read_pack_head(io.BytesIO(data[:-1]), len(data) - 1, mac_secret=None)


class _ShortReads(io.RawIOBase):
    """An unbuffered file that returns at most `most` bytes a read, as a network filesystem may."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data = io.BytesIO(data)
        self._most = most

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._data.seek(offset, whence)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        chunk = self._data.read(min(len(buffer), self._most))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_a_pack_read_in_short_pieces_is_read_whole() -> None:
    blocks = block_snapshots(3)
    data = pack_bytes(blocks)
    head = read_pack_head(_ShortReads(data, most=7), len(data), mac_secret=None)  # type: ignore[arg-type]
    assert [member.key for member in head.members] == [block.key for block in blocks]
    member = head.members[1]
    tokens = read_member_tokens(_ShortReads(data, most=5), member)  # type: ignore[arg-type]
    assert np.array_equal(tokens, blocks[1].tokens)


def test_a_pack_under_another_secret_is_intact_but_not_served() -> None:
    blocks = block_snapshots(3)
    data = pack_bytes(blocks, secret=b"theirs")
    head = read_pack_head(io.BytesIO(data), len(data), mac_secret=mac_key(b"ours"))
    assert not head.authenticated
    member = head.members[0]
    with pytest.raises(MacMismatch):
        decode_member(head, member, data[member.offset : member.offset + member.size])
    ours = read_pack_head(io.BytesIO(data), len(data), mac_secret=mac_key(b"theirs"))
    assert bytes(decode_member(ours, member, data[member.offset :][: member.size]).state) == bytes(
        blocks[0].state
    )


def test_put_many_writes_runs_of_blocks_into_packs_that_read_back(tmp_path: Path) -> None:
    blocks = block_snapshots(PACK_MEMBERS + 6)
    tier = DiskTier(tmp_path, 1 << 30)
    try:
        assert tier.put_many(blocks) == [True] * len(blocks)
        names = stored_files(tier)
        assert len(names) == 2
        assert all(is_pack_name(name) for name in names)
        assert tier.used_bytes == files_size(tier)
        for block in blocks[::7]:
            assert bytes(tier.get(block.key).state) == bytes(block.state)  # type: ignore[union-attr]
        read = tier.read_many([block.key for block in blocks])
        assert [bytes(s.state) for s in read if isinstance(s, Snapshot)] == [bytes(b.state) for b in blocks]
        assert tier.check(verify=True).ok
    finally:
        tier.close()
    reopened = DiskTier(tmp_path, None)
    try:
        assert len(reopened) == len(blocks)
        assert np.array_equal(reopened.stored_tokens(blocks[9].key), blocks[9].tokens)  # type: ignore[arg-type]
    finally:
        reopened.close()


def test_a_damaged_block_is_a_miss_and_the_rest_of_its_pack_still_serves(tmp_path: Path) -> None:
    blocks = block_snapshots(6)
    tier = DiskTier(tmp_path, 1 << 30)
    try:
        name = packed_and_damaged(tier, blocks, -100)  # inside the last block's payload
        found = tier.read_many([block.key for block in blocks])
        assert found[5] is Miss.DISCARDED
        assert [bytes(s.state) for s in found[:5]] == [bytes(b.state) for b in blocks[:5]]  # type: ignore[union-attr]
        assert len(tier) == 5
        assert stored_files(tier) == [name]
        assert tier.used_bytes == files_size(tier)  # the dropped block's share went to another row
        assert tier.check(verify=True).ok
        for block in blocks[:5]:
            assert tier.remove(block.key)
            assert tier.used_bytes == files_size(tier)
        assert stored_files(tier) == []  # gone with its last row
    finally:
        tier.close()


def test_a_damaged_pack_header_makes_each_block_a_miss(tmp_path: Path) -> None:
    blocks = block_snapshots(4)
    tier = DiskTier(tmp_path, 1 << 30)
    try:
        packed_and_damaged(tier, blocks, 30)
        assert tier.read_many([block.key for block in blocks]) == [Miss.DISCARDED] * 4
        assert len(tier) == 0
        assert stored_files(tier) == []
    finally:
        tier.close()


def as_saved(blocks: list[Snapshot], when: float) -> list[Snapshot]:
    """`blocks` dated as SnapshotStore.put_many dates a save: the first as the most recent."""
    return [dataclasses.replace(block, created_at=when - i * 1e-6) for i, block in enumerate(blocks)]


def test_eviction_frees_whole_packs_from_a_prompts_end(tmp_path: Path) -> None:
    saves = [as_saved(block_snapshots(8, seed=seed), 1_700_000_000.0 + seed) for seed in (1, 2, 3)]
    probe = DiskTier(tmp_path / "probe", 1 << 30)
    probe.put_many(saves[0])
    save_bytes = probe.used_bytes
    probe.close()
    tier = DiskTier(tmp_path / "disk", int(save_bytes * 2.5))  # packs of 2 blocks: an eighth of it
    try:
        for save in saves:
            assert all(tier.put_many(save))
        evicted = tier.evictions
        assert evicted >= 4
        assert evicted % 2 == 0  # whole packs
        assert len(stored_files(tier)) == (24 - evicted) // 2
        held = [block.key in tier for block in saves[0]]
        assert held == [True] * (8 - evicted) + [False] * evicted  # the first save's last packs went
        assert all(block.key in tier for block in saves[1] + saves[2])
        assert tier.used_bytes == files_size(tier)
        assert tier.used_bytes <= tier.budget_bytes
    finally:
        tier.close()


def test_a_higher_priority_for_a_packed_block_is_recorded_in_place(tmp_path: Path) -> None:
    blocks = block_snapshots(4, priority=0)
    tier = DiskTier(tmp_path, 1 << 30)
    try:
        tier.put_many(blocks)
        before = stored_files(tier)
        raised = Snapshot(blocks[1].key, blocks[1].tokens, blocks[1].state, priority=5)
        assert tier.put(raised)
        assert stored_files(tier) == before
        assert tier.held_priority(blocks[1].key) == 5
        assert tier.held_priority(blocks[2].key) == 0
        # The pack now holds a priority-5 block: a priority-0 put cannot evict it.
        tier_bytes = tier.used_bytes
        tier.close()
        small = DiskTier(tmp_path, tier_bytes + 10)
        assert not small.put_many(block_snapshots(4, seed=9, priority=0))[0]
        assert stored_files(small) == before
        small.close()
    finally:
        tier.close()


def test_a_lost_index_is_rebuilt_from_packs(tmp_path: Path) -> None:
    blocks = block_snapshots(10)
    tier = DiskTier(tmp_path, 1 << 30, secret=b"s")
    tier.put_many(blocks[:7])
    tier.put(blocks[7])
    tier.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / (INDEX_NAME + suffix)).unlink(missing_ok=True)
    tier = DiskTier(tmp_path, None, secret=b"s")
    try:
        assert len(tier) == 8
        assert tier.used_bytes == files_size(tier)
        assert bytes(tier.get(blocks[4].key).state) == bytes(blocks[4].state)  # type: ignore[union-attr]
        assert tier.check(verify=True).ok
    finally:
        tier.close()


def test_an_index_of_schema_1_is_migrated_with_its_rows(tmp_path: Path) -> None:
    blocks = block_snapshots(3)
    tier = DiskTier(tmp_path, 1 << 30)
    for block in blocks:
        tier.put(block)
    generation = tier.data_version()
    tier.close()
    with sqlite3.connect(tmp_path / INDEX_NAME) as conn:  # back to how 0.1-0.3 laid it out
        conn.execute(
            index_schema.ENTRIES_TABLE.format(name="v1").replace(
                "file_name TEXT NOT NULL", "file_name TEXT NOT NULL UNIQUE"
            )
        )
        conn.execute("INSERT INTO v1 SELECT * FROM entries")
        conn.execute("DROP TABLE entries")
        conn.execute("ALTER TABLE v1 RENAME TO entries")
        conn.execute("UPDATE meta SET value = '1' WHERE name = 'schema_version'")
    tier = DiskTier(tmp_path, None)
    try:
        assert len(tier) == 3
        assert tier.data_version() == generation
        assert bytes(tier.get(blocks[2].key).state) == bytes(blocks[2].state)  # type: ignore[union-attr]
        assert tier.put_many(block_snapshots(4, seed=5)) == [True] * 4
    finally:
        tier.close()
    with sqlite3.connect(tmp_path / INDEX_NAME) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() == ("2",)


def test_the_store_writes_a_saves_blocks_into_packs(tmp_path: Path) -> None:
    blocks = block_snapshots(40)
    with SnapshotStore(tmp_path, ram_bytes=64 << 20, disk_bytes=1 << 30) as store:
        for block in blocks:
            store.put(block.key, block.tokens, block.state, block.priority)
        store.flush()
        names = os.listdir(tmp_path / FILES_DIR)
        assert len(names) < len(blocks) // 4  # a writer that lags behind the puts takes many at once
    with SnapshotStore(tmp_path, ram_bytes=64 << 20, disk_bytes=1 << 30) as store:
        got = store.get_blocks([block.key for block in blocks])
        assert [bytes(s.state) for s, _tier in got] == [bytes(b.state) for b in blocks]


@pytest.mark.parametrize("ram_bytes", [0, 64 << 20])
def test_put_many_queues_a_saves_blocks_for_one_pack(tmp_path: Path, ram_bytes: int) -> None:
    blocks = block_snapshots(PACK_MEMBERS + 2)
    with SnapshotStore(tmp_path, ram_bytes=ram_bytes, disk_bytes=1 << 30) as store:
        kept = store.put_many([(b.key, b.tokens, b.state, b.priority) for b in blocks])
        assert all(snapshot is not None for snapshot in kept)
        store.flush()
        assert len(os.listdir(tmp_path / FILES_DIR)) == 2  # 64 blocks, then 2
    with SnapshotStore(tmp_path, ram_bytes=0, disk_bytes=1 << 30) as store:
        got = store.get_blocks([block.key for block in blocks])
        assert [bytes(s.state) for s, _tier in got] == [bytes(b.state) for b in blocks]


@pytest.mark.parametrize("ram_bytes", [0, 64 << 20])
def test_a_saves_first_blocks_count_as_its_most_recently_used(tmp_path: Path, ram_bytes: int) -> None:
    blocks = block_snapshots(2 * PACK_MEMBERS + 5)
    with SnapshotStore(tmp_path, ram_bytes=ram_bytes, disk_bytes=1 << 30) as store:
        store.put_many([(b.key, b.tokens, b.state, b.priority) for b in blocks])
    with SnapshotStore(tmp_path, ram_bytes=0, disk_bytes=1 << 30) as store:  # the disk's rows alone
        used = {row.key: row.last_used_at for row in store.entries(blocks=True)}
    order = [used[block.key] for block in blocks]
    assert order == sorted(order, reverse=True)  # evicted from the prompt's end, pack by pack
    assert len(set(order)) == len(order)
    assert len(os.listdir(tmp_path / FILES_DIR)) == 3  # the runs stayed whole, whenever the writer woke


def test_blocks_whose_header_would_be_too_large_go_into_smaller_packs(tmp_path: Path) -> None:
    scope = "é" * MAX_SCOPE_LENGTH  # JSON writes each as an escape: 64 such keys overflow a header
    tokens = np.random.default_rng(3).integers(0, 32_000, 64 * PACK_MEMBERS, dtype=np.int32)
    keys = block_keys("fp-a", scope, tokens, PACK_MEMBERS)
    blocks = [Snapshot(key, tokens[64 * i : 64 * (i + 1)], bytes([i]) * 3000) for i, key in enumerate(keys)]
    tier = DiskTier(tmp_path, 1 << 30)
    try:
        assert tier.put_many(blocks) == [True] * len(blocks)
        assert len(stored_files(tier)) > 1
        assert tier.used_bytes == files_size(tier)
        read = tier.read_many(keys)
        assert [bytes(s.state) for s in read] == [bytes(b.state) for b in blocks]  # type: ignore[union-attr]
    finally:
        tier.close()


def test_a_block_given_twice_is_stored_once_and_the_budget_still_counts_the_files(tmp_path: Path) -> None:
    blocks = block_snapshots(5)
    tier = DiskTier(tmp_path, 1 << 30)
    try:
        assert all(tier.put_many([*blocks, blocks[2], blocks[3]]))
        assert len(tier) == 5
        assert tier.used_bytes == files_size(tier)
        assert all(isinstance(found, Snapshot) for found in tier.read_many([b.key for b in blocks]))
        assert tier.check(verify=True).ok
    finally:
        tier.close()
