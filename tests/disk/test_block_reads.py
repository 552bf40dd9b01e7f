"""Reading many blocks at once: one index query, the files decoded on the codec's threads, and each
answer what reading that key alone would give (damaged, absent and foreign files included)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest
from block_snapshots import block_snapshots

from snapcache.disk.disk_tier import FILES_DIR, DiskTier, Miss
from snapcache.formats import codec
from snapcache.formats import threads as _threads
from snapcache.key import SnapshotKey
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore


def file_of(tier: DiskTier, key: SnapshotKey) -> Path:
    row = tier._open_index().get(key.id)
    assert row is not None
    return tier.directory / FILES_DIR / row.file_name


def test_read_many_answers_each_key_as_read_would(tmp_path: Path) -> None:
    blocks = block_snapshots(12)
    other = DiskTier(tmp_path / "other", 1 << 26, secret=b"someone else")
    tier = DiskTier(tmp_path / "disk", 1 << 26, secret=b"ours")
    try:
        for block in blocks[:10]:
            assert tier.put(block)
        damaged = file_of(tier, blocks[3].key)
        data = bytearray(damaged.read_bytes())
        data[-100] ^= 0xFF
        damaged.write_bytes(data)
        # An intact file written under another secret: kept, but not served.
        assert other.put(blocks[5])
        foreign = file_of(other, blocks[5].key)
        file_of(tier, blocks[5].key).write_bytes(foreign.read_bytes())

        got = tier.read_many([b.key for b in blocks])

        assert len(got) == 12
        for i, found in enumerate(got):
            if i == 3:
                assert found is Miss.DISCARDED
            elif i == 5:
                assert found is Miss.UNAUTHENTICATED
            elif i >= 10:
                assert found is Miss.ABSENT
            else:
                assert isinstance(found, Snapshot)
                assert found.key == blocks[i].key
                assert bytes(found.state) == bytes(blocks[i].state)
        assert blocks[3].key not in tier  # damage is removed, as a read removes it
        assert blocks[5].key in tier  # another configuration's file stays
    finally:
        tier.close()
        other.close()


def test_the_index_is_asked_in_batches_beyond_the_parameter_limit(tmp_path: Path) -> None:
    blocks = block_snapshots(3)
    tier = DiskTier(tmp_path / "disk", 1 << 26)
    for block in blocks:
        assert tier.put(block)
    ids = [f"{i:064x}" for i in range(1_200)] + [b.key.id for b in blocks]
    rows = tier._open_index().get_many(ids)
    tier.close()
    assert sorted(rows) == sorted(b.key.id for b in blocks)


def test_get_blocks_stops_at_the_first_missing_block_and_promotes_the_rest(tmp_path: Path) -> None:
    blocks = block_snapshots(8)
    with SnapshotStore(tmp_path / "c", ram_bytes=0, disk_bytes=1 << 26) as store:
        for i, block in enumerate(blocks):
            if i != 5:
                store.put(block.key, block.tokens, block.state)
        store.flush()
    with SnapshotStore(tmp_path / "c", ram_bytes=1 << 24, disk_bytes=1 << 26) as store:
        got = store.get_blocks([b.key for b in blocks])
        assert [found.key for found, _ in got] == [b.key for b in blocks[:5]]
        assert all(tier == "disk" for _, tier in got)
        assert all(bytes(found.state) == bytes(b.state) for (found, _), b in zip(got, blocks, strict=False))
        again = store.get_blocks([b.key for b in blocks[:5]])
        assert [tier for _, tier in again] == ["ram"] * 5  # promoted by the first read
        assert store.get_block(blocks[5].key) is None


def test_parallel_map_keeps_order_and_raises_what_a_call_raised() -> None:
    seen_threads: set[str] = set()

    def square(x: int) -> int:
        seen_threads.add(threading.current_thread().name)
        return x * x

    assert _threads.map_in_parallel(square, list(range(101))) == [x * x for x in range(101)]
    assert _threads.map_in_parallel(square, []) == []

    def fail_on_seven(x: int) -> int:
        if x == 7:
            raise ValueError("seven")
        return x

    with pytest.raises(ValueError, match="seven"):
        _threads.map_in_parallel(fail_on_seven, list(range(10)))


def test_a_dealt_parallel_map_gives_item_k_to_thread_k_modulo_their_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "DEFAULT_THREADS", 2)
    ran_on: dict[int, str] = {}

    def square(x: int) -> int:
        ran_on[x] = threading.current_thread().name
        return x * x

    assert _threads.map_in_parallel(square, range(11), dealt=True) == [x * x for x in range(11)]
    assert len({ran_on[x] for x in range(0, 11, 2)}) == 1  # the even items on one thread
    assert len({ran_on[x] for x in range(1, 11, 2)}) == 1  # the odd ones on the other
    assert ran_on[0] != ran_on[1]
    assert _threads.map_in_parallel(square, [3], dealt=True) == [9]


def _map_in_child(queue: multiprocessing.Queue[list[int]]) -> None:
    queue.put(_threads.map_in_parallel(lambda x: x + 1, list(range(10))))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_forked_child_gets_its_own_decoding_threads() -> None:
    _threads.map_in_parallel(lambda x: x, list(range(10)))  # the parent's pool exists
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[list[int]] = context.Queue()
    child = context.Process(target=_map_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == list(range(1, 11))


# -- copying blocks out for a restore -------------------------------------------------------------------


class Copies:
    """What copy_blocks handed over, copied at once (the buffer is not the caller's to keep)."""

    def __init__(self) -> None:
        self.states: dict[int, bytes] = {}
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, index: int, state: memoryview) -> None:
        with self._lock:
            assert index not in self.states
            self.states[index] = bytes(state)
            self.threads.add(threading.current_thread().name)


def stored(tmp_path: Path, blocks: list[Snapshot], *, skip: int = -1) -> Path:
    with SnapshotStore(tmp_path / "c", ram_bytes=0, disk_bytes=1 << 26) as store:
        for i, block in enumerate(blocks):
            if i != skip:
                store.put(block.key, block.tokens, block.state)
    return tmp_path / "c"


def test_copy_blocks_hands_over_each_state_and_promotes_on_a_second_disk_read(tmp_path: Path) -> None:
    blocks = block_snapshots(8)
    keys = [b.key for b in blocks]
    with SnapshotStore(stored(tmp_path, blocks), ram_bytes=1 << 24, disk_bytes=1 << 26) as store:
        first = Copies()
        assert store.copy_blocks(keys, first) == ["disk"] * 8
        assert first.states == {i: bytes(b.state) for i, b in enumerate(blocks)}
        assert store.stats().ram_entries == 0  # a first read from disk fills no RAM
        second = Copies()
        assert store.copy_blocks(keys[:5], second) == ["disk"] * 5
        assert second.states == {i: bytes(b.state) for i, b in enumerate(blocks[:5])}
        assert store.stats().ram_entries == 5  # read from disk again: now worth a place in RAM
        third = Copies()
        assert store.copy_blocks(keys, third) == ["ram"] * 5 + ["disk"] * 3
        assert third.states == first.states


def test_copy_blocks_never_promotes_without_a_ram_tier(tmp_path: Path) -> None:
    blocks = block_snapshots(4)
    with SnapshotStore(stored(tmp_path, blocks), ram_bytes=0, disk_bytes=1 << 26) as store:
        for _ in range(3):
            copies = Copies()
            assert store.copy_blocks([b.key for b in blocks], copies) == ["disk"] * 4
            assert copies.states == {i: bytes(b.state) for i, b in enumerate(blocks)}


def test_copy_blocks_stops_at_the_first_missing_block(tmp_path: Path) -> None:
    blocks = block_snapshots(8)
    with SnapshotStore(stored(tmp_path, blocks, skip=5), ram_bytes=1 << 24, disk_bytes=1 << 26) as store:
        copies = Copies()
        assert store.copy_blocks([b.key for b in blocks], copies) == ["disk"] * 5
        assert [copies.states[i] for i in range(5)] == [bytes(b.state) for b in blocks[:5]]
        assert set(copies.states) <= set(range(8)) - {5}  # later blocks may be handed over too
        with pytest.raises(Exception, match="not the key of a block"):
            store.copy_blocks([SnapshotKey.for_tokens("fp-a", "default", [1, 2])], copies)


def test_an_exception_from_copy_is_raised_and_costs_no_stored_block(tmp_path: Path) -> None:
    blocks = block_snapshots(6)
    keys = [b.key for b in blocks]
    path = stored(tmp_path, blocks)

    def refuse_the_third(index: int, state: memoryview) -> None:
        if index == 2:
            raise ValueError("does not fit")

    with SnapshotStore(path, ram_bytes=1 << 24, disk_bytes=1 << 26) as store:
        with pytest.raises(ValueError, match="does not fit"):
            store.copy_blocks(keys, refuse_the_third)
        copies = Copies()
        assert store.copy_blocks(keys, copies) == ["disk"] * 6  # every file is still there
        assert copies.states == {i: bytes(b.state) for i, b in enumerate(blocks)}


class Kept:
    """What copy_blocks handed to `keep`: the views themselves, read only later."""

    def __init__(self) -> None:
        self.states: dict[int, memoryview] = {}

    def __call__(self, index: int, state: memoryview) -> None:
        assert index not in self.states
        self.states[index] = state


def test_copy_blocks_hands_the_blocks_ram_holds_to_keep_and_those_read_from_disk_to_copy(
    tmp_path: Path,
) -> None:
    blocks = block_snapshots(8)
    keys = [b.key for b in blocks]
    with SnapshotStore(stored(tmp_path, blocks), ram_bytes=1 << 24, disk_bytes=1 << 26) as store:
        for _ in range(2):  # read from disk twice: the first five are promoted into RAM
            assert store.copy_blocks(keys[:5], Copies()) == ["disk"] * 5
        copies, kept = Copies(), Kept()
        assert store.copy_blocks(keys, copies, keep=kept) == ["ram"] * 5 + ["disk"] * 3
        assert sorted(kept.states) == [0, 1, 2, 3, 4]
        assert sorted(copies.states) == [5, 6, 7]
        # Held on to after the call (and after a block is removed), the kept bytes are the blocks'.
        assert store.remove(keys[0])
        assert {i: bytes(v) for i, v in kept.states.items()} == {i: bytes(blocks[i].state) for i in range(5)}
        assert copies.states == {i: bytes(blocks[i].state) for i in range(5, 8)}


def test_blocks_read_from_disk_are_decoded_on_the_codecs_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the codec's two threads, given here: on one usable core the codec takes one."""
    monkeypatch.setattr(codec, "DEFAULT_THREADS", 2)
    blocks = block_snapshots(40)
    with SnapshotStore(stored(tmp_path, blocks), ram_bytes=0, disk_bytes=1 << 26) as store:
        copies = Copies()
        assert len(store.copy_blocks([b.key for b in blocks], copies)) == 40
    assert len(copies.threads) == 2
