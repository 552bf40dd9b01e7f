"""The reliability tests again, for states stored as shared 64-token blocks and records.

A real model saves and restores through CachedLlama while writers are killed, run side by side,
meet a full disk or a forger, and while records are damaged. Whatever a store then serves is byte
for byte what a cold read computes: every block it hands out, every record it assembles, and every
completion restored from it answers token for token as a cold one. A missing, damaged or forged
block or record is a miss or a shorter prefix.
"""

from __future__ import annotations

import errno
import io
import itertools
import json
import os
import random
import shutil
import sqlite3
import stat
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from reliability_workers.block_prompts import N_CTX, SCOPE, TEXTS, complete, prompt_tokens
from reliability_workers.disk_files import files_of_key, snapshot_files
from reliability_workers.journal import Owed, read_journal
from reliability_workers.procs import worker_command, worker_env
from reliability_workers.reports import check_problems
from reliability_workers.survival import kill_9, repair_debris, start_worker, wait_for_acknowledged
from small_filesystem import mounted
from tiny_model import write_tiny_model

from snapcache import CachedLlama, Snapshot, SnapshotKey, SnapshotStore, model_fingerprint
from snapcache.disk.files import FILES_DIR
from snapcache.formats.codec import ZSTD
from snapcache.formats.pack_file import decode_member, encode_pack, read_pack_head
from snapcache.formats.snapshot_file import FLAG_MAC, decode, encode, mac_key
from snapcache.key import BLOCK_TOKENS, as_token_array, block_keys
from snapcache.llama import capture_sequence
from snapcache.llama.state.blocks import split_state
from snapcache.llama.stored.stored_states import StoredStates

pytestmark = pytest.mark.model

Prompt = tuple[int, int]  # (text, length in tokens)
# What the killed writers' store is asked for after each kill: short and long prompts of both texts.
ASKED: list[Prompt] = [(0, 290), (1, 530), (0, 790), (1, 920)]
BUDGET = 64 << 20
SECRET = b"s3cret"
PRELUDE = struct.Struct("<8sHHI")


def whole_blocks(length: int) -> int:
    """The tokens of the whole blocks a prompt of `length` tokens can restore (never its last token)."""
    return (length - 1) // BLOCK_TOKENS * BLOCK_TOKENS


@dataclass
class Reference:
    """Cold reads of the tiny model: the contexts completions leave, the blocks and states of prefixes."""

    llm: Any
    fingerprint: str
    tokens: list[list[int]]
    contexts: dict[Prompt, list[int]] = field(default_factory=dict)
    blocks: dict[SnapshotKey, bytes] = field(default_factory=dict)
    states: dict[tuple[int, ...], bytes] = field(default_factory=dict)

    def prompt(self, prompt: Prompt) -> list[int]:
        text, length = prompt
        return self.tokens[text][:length]

    def context(self, prompt: Prompt) -> list[int]:
        """The context a cold greedy completion of `prompt` leaves."""
        if prompt not in self.contexts:
            self.llm.reset()
            self.contexts[prompt] = complete(self.llm, self.prompt(prompt))
        return self.contexts[prompt]

    def state(self, tokens: Any) -> bytes:
        """The state a cold read of exactly `tokens` leaves."""
        key = tuple(int(t) for t in tokens)
        if key not in self.states:
            self.llm.reset()
            self.llm.eval(list(key))
            self.states[key] = bytes(capture_sequence(self.llm).state)
        return self.states[key]


@pytest.fixture(scope="module")
def reference(llama_factory: Any, tiny_model_path: Path) -> Iterator[Reference]:
    llm = llama_factory(tiny_model_path, n_ctx=N_CTX)
    ref = Reference(
        llm, model_fingerprint(llm), [[int(t) for t in llm.tokenize(text.encode())] for text in TEXTS]
    )
    for tokens in ref.tokens:
        n_blocks = len(tokens) // BLOCK_TOKENS
        llm.reset()
        llm.eval(tokens[: n_blocks * BLOCK_TOKENS])
        split = split_state(capture_sequence(llm).state)
        assert split is not None
        for i, key in enumerate(block_keys(ref.fingerprint, SCOPE, as_token_array(tokens), n_blocks)):
            ref.blocks[key] = split.block(i)  # the two texts' first blocks share keys and bytes
    yield ref
    llm.close()


def restore_all(llm: Any, store: SnapshotStore, reference: Reference, prompts: list[Prompt]) -> dict:
    """Complete each prompt after restoring what `store` serves (saving nothing); every context must
    equal the cold one. Returns how many tokens each restored."""
    return _complete_each(CachedLlama(llm, store, SCOPE, save=False), reference, prompts)


def _complete_each(cached: CachedLlama, reference: Reference, prompts: list[Prompt]) -> dict[Prompt, int]:
    """Complete each prompt from an empty context through `cached`; every context must equal the
    cold one. Returns how many tokens each restored."""
    restored = {}
    for prompt in prompts:
        cached.llm.reset()
        assert complete(cached, reference.prompt(prompt)) == reference.context(prompt), prompt
        assert cached.last_restore is not None
        restored[prompt] = cached.last_restore.restored_tokens
    return restored


def served_bytes_are_cold(store: SnapshotStore, reference: Reference) -> tuple[int, int]:
    """Every block `store` hands out and every record it assembles holds a cold read's bytes.
    Returns (blocks, records) served."""
    states = StoredStates(store, reference.fingerprint)
    blocks = records = 0
    for row in store.entries(blocks=True):
        if row.key.is_block:
            assert row.key in reference.blocks, f"block {row.key.id[:12]} belongs to no prompt"
            found = store.get_block(row.key)
            if found is not None:
                assert bytes(found[0].state) == reference.blocks[row.key], row.key
                blocks += 1
        else:
            snapshot = states.complete(row.key)
            if snapshot is not None:
                assert bytes(snapshot.state) == reference.state(snapshot.tokens), row.key
                records += 1
    return blocks, records


def write_prompts(
    llm: Any, directory: Path, reference: Reference, prompts: list[Prompt], **store_args: Any
) -> dict[Prompt, int]:
    """Complete `prompts` one after another through a store in `directory`, saving (each must answer
    as cold); returns what each restored."""
    store_args.setdefault("ram_bytes", 0)
    store_args.setdefault("disk_bytes", BUDGET)
    with SnapshotStore(directory, **store_args) as store:
        return _complete_each(CachedLlama(llm, store, SCOPE), reference, prompts)


# -- kill -9 ------------------------------------------------------------------------------------------

KILLS = 6
KILLED_DISK_BYTES = 200 << 10  # about a dozen 14 KiB block files: the writers evict as they go
SMALL_DISK_BYTES = KILLED_DISK_BYTES
# Kills alternate between a directory that holds every prompt's blocks (nothing is evicted, so every
# completion acknowledged is owed: it restores all its whole blocks after the kill) and one that
# evicts as the writers go (whatever it serves is still cold bytes).
KILLED_BUDGETS = {"roomy": BUDGET, "tight": KILLED_DISK_BYTES}
# Files the writes in flight at a kill may leave in the roomy directory: the writing thread's file
# (a pack or a record; temporary or uncommitted) and the record it replaced, and a superseded
# record the calling thread removes. (In the tight one a commit also frees what it evicted: up to
# a pack's worth of 2 KiB records, about as many files as the directory holds, so no bound there.)
IN_FLIGHT_FILES = 3


def start_loop_writer(model: Path, directory: Path, budget: int, seed: int, journal: Path, log: Path) -> Any:
    return start_worker(
        worker_command("block_writer.py", "loop", model, directory, budget, seed, journal), log
    )


def owed_prompts(owed: Owed) -> list[Prompt]:
    return sorted((int(t), int(n)) for t, n in (key.split(":") for key in owed.owed))


@pytest.mark.slow
def test_sigkills_while_saving_blocks_lose_no_acknowledged_completion(
    tmp_path: Path, tiny_model_path: Path, reference: Reference, make_llama: Any
) -> None:
    rng = random.Random(2024)
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    owed = {name: Owed(evictable_below=0 if name == "roomy" else 1) for name in KILLED_BUDGETS}
    served = {"blocks": 0, "records": 0, "restored": 0}
    figures = []
    for kill in range(KILLS):
        name = ("roomy", "tight")[kill % 2]
        directory, budget = tmp_path / name, KILLED_BUDGETS[name]
        journal, log = tmp_path / f"journal-{kill}", tmp_path / f"writer-{kill}.log"
        # seed kill // 2: each directory gets a writer on the calling thread and one writing behind.
        proc = start_loop_writer(tiny_model_path, directory, budget, kill // 2, journal, log)
        wait_for_acknowledged(journal, 1, proc)
        time.sleep(rng.uniform(0.1, 1.0))
        kill_9(proc, log)

        debris = repair_debris(directory, budget)
        acknowledged = owed[name].replay(read_journal(journal), write_behind=kill // 2 % 2 == 1)
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=budget) as store:
            blocks, records = served_bytes_are_cold(store, reference)
            if name == "roomy":
                assert debris <= IN_FLIGHT_FILES, debris
                prompts = owed_prompts(owed[name])
                restored = restore_all(llm, store, reference, prompts)
                lost = [p for p in prompts if restored[p] < whole_blocks(p[1])]
                assert lost == [], f"kill {kill}: acknowledged completions restore less: {restored}"
            else:
                restored = restore_all(llm, store, reference, ASKED)
        served["blocks"] += blocks
        served["records"] += records
        served["restored"] += sum(restored.values())
        figures.append((name, acknowledged, len(owed[name].owed), blocks, debris))
    print(
        f"\n{KILLS} SIGKILLs, (directory, completions acknowledged, owed, blocks served, debris): {figures}"
    )
    assert owed["roomy"].acknowledged + owed["tight"].acknowledged >= KILLS
    assert len(owed["roomy"].owed) > 0
    assert served["blocks"] > 0
    assert served["restored"] > 0


# -- concurrent writers -------------------------------------------------------------------------------

PROCESSES = 2
THREADS = 2
COMPLETIONS = 4


@pytest.mark.slow
@pytest.mark.parametrize("disk_bytes", [BUDGET, SMALL_DISK_BYTES], ids=["room-for-all", "evicting"])
def test_processes_and_threads_sharing_blocks_restore_as_cold(
    tmp_path: Path, tiny_model_path: Path, reference: Reference, make_llama: Any, disk_bytes: int
) -> None:
    directory = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            worker_command(
                "block_writer.py", "run", tiny_model_path, directory, disk_bytes, seed, THREADS, COMPLETIONS
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=worker_env(),
        )
        for seed in range(PROCESSES)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"writer failed:\n{err[-4000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        assert result["errors"] == []
        done.extend(result["completions"])
    assert len(done) == PROCESSES * THREADS * COMPLETIONS
    for item in done:
        assert item["context"] == reference.context((item["text"], item["length"])), item
    # Some completions restored what the others had saved meanwhile.
    assert any(item["restored"] > 0 and item["source"] in ("ram", "disk") for item in done)

    with SnapshotStore(directory, ram_bytes=0, disk_bytes=disk_bytes) as store:
        assert check_problems(store.check(repair=False, verify=True, grace_seconds=0)) == []
        blocks, _records = served_bytes_are_cold(store, reference)
        written = sorted({(item["text"], item["length"]) for item in done})
        restored = restore_all(make_llama(tiny_model_path, n_ctx=N_CTX), store, reference, written)
    print(f"\n{len(done)} completions in {PROCESSES} processes x {THREADS} threads: {blocks} blocks kept")
    if disk_bytes == SMALL_DISK_BYTES:
        needed = {
            key
            for text, length in written
            for key in block_keys(
                reference.fingerprint,
                SCOPE,
                as_token_array(reference.prompt((text, length))),
                length // BLOCK_TOKENS,
            )
        }
        assert blocks < len(needed)  # the writers evicted blocks that others were reading
        # The budget holds the snapshot files (the fingerprint notes beside them are not in it).
        assert sum(p.stat().st_size for p in snapshot_files(directory / FILES_DIR)) <= SMALL_DISK_BYTES
        return
    # Nothing was evicted: every prompt written restores at least all its whole blocks.
    for prompt in written:
        assert restored[prompt] >= whole_blocks(prompt[1]), (prompt, restored[prompt])


# -- a full disk --------------------------------------------------------------------------------------

EARLY: Prompt = (1, 530)  # shares its first five blocks with LATE, but is no prefix of it
LATE: Prompt = (0, 920)


def assert_full_disk_kept_what_was_there(
    directory: Path, before: dict[Path, bytes], reference: Reference, llm: Any, early: int
) -> dict:
    """The files written before the disk filled are all there, unchanged; no partial file was left;
    a reader restores EARLY as before and LATE as far as its blocks reached the disk."""
    assert {p: p.read_bytes() for p in before} == before
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET) as reader:
        assert check_problems(reader.check(repair=False, verify=True, grace_seconds=0)) == []
        served_bytes_are_cold(reader, reference)
        restored = restore_all(llm, reader, reference, [EARLY, LATE])
    assert restored[EARLY] >= early
    return restored


def test_enospc_while_writing_blocks_loses_nothing(
    tmp_path: Path,
    tiny_model_path: Path,
    reference: Reference,
    make_llama: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = tmp_path / "cache"
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    write_prompts(llm, directory, reference, [EARLY])
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET) as store:
        early_restored = restore_all(llm, store, reference, [EARLY])[EARLY]
    assert early_restored >= whole_blocks(EARLY[1])
    before = {p: p.read_bytes() for p in snapshot_files(directory)}

    real_fsync = os.fsync
    calls = itertools.count()

    def every_other_fsync_fails(fd: int) -> None:
        if next(calls) % 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    store = SnapshotStore(directory, ram_bytes=16 << 20, disk_bytes=BUDGET)
    try:
        writer = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, SCOPE)
        monkeypatch.setattr(os, "fsync", every_other_fsync_fails)
        assert complete(writer, reference.prompt(LATE)) == reference.context(LATE)
        assert writer.last_restore is not None
        assert writer.last_restore.restored_tokens >= 5 * BLOCK_TOKENS  # EARLY's shared blocks
        store.flush()
        assert store.stats().write_errors > 0
        monkeypatch.setattr(os, "fsync", real_fsync)
        # Some of LATE's blocks and records reached the disk, some did not.
        late = assert_full_disk_kept_what_was_there(directory, before, reference, llm, early_restored)[LATE]
        assert late < whole_blocks(LATE[1])
    finally:
        store.close()
    # close() wrote what the full disk had refused: LATE now restores all its whole blocks.
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET) as reader:
        assert restore_all(llm, reader, reference, [LATE])[LATE] >= whole_blocks(LATE[1])


@pytest.mark.slow
@pytest.mark.parametrize("headroom", [48 << 10, 0], ids=["room-for-three-blocks", "no-room"])
def test_a_real_full_filesystem_while_writing_blocks(
    tmp_path: Path, tiny_model_path: Path, reference: Reference, make_llama: Any, headroom: int
) -> None:
    with mounted(tmp_path, 2 << 20) as mount_point:
        directory = mount_point / "cache"
        llm = make_llama(tiny_model_path, n_ctx=N_CTX)
        write_prompts(llm, directory, reference, [EARLY])
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET) as store:
            early_restored = restore_all(llm, store, reference, [EARLY])[EARLY]
        before = {p: p.read_bytes() for p in snapshot_files(directory)}

        store = SnapshotStore(directory, ram_bytes=16 << 20, disk_bytes=BUDGET)
        balloon = mount_point / "balloon"
        try:
            writer = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, SCOPE)
            # Room for about three of LATE's nine new block files, or for nothing at all.
            with open(balloon, "wb") as file:
                try:
                    file.write(b"\x00" * (shutil.disk_usage(mount_point).free - headroom))
                    file.flush()
                    os.fsync(file.fileno())
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
            assert complete(writer, reference.prompt(LATE)) == reference.context(LATE)
            store.flush()
            assert store.stats().write_errors > 0
            late = assert_full_disk_kept_what_was_there(directory, before, reference, llm, early_restored)
            assert late[LATE] < whole_blocks(LATE[1])
            balloon.unlink()
        finally:
            store.close()
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET) as reader:
            assert restore_all(llm, reader, reference, [LATE])[LATE] >= whole_blocks(LATE[1])


# -- MACs ---------------------------------------------------------------------------------------------


def header_of(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    _magic, _version, flags, length = PRELUDE.unpack_from(data)
    return flags, json.loads(data[PRELUDE.size : PRELUDE.size + length])


def key_files(directory: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in snapshot_files(directory) if p.suffix in (".snap", ".pack")}


def forge_block(
    directory: Path, victim: SnapshotKey, state: bytes, secret: bytes | None, forger: bytes | None
) -> None:
    """Replace the file of block `victim` (written with `secret`) by a well-formed one: valid
    checksums, the right key and tokens, a real block's layout, holding `state`, signed with the
    `forger`'s guess of the secret (None: unsigned); and record its new size in the index, as a
    forger who can write the directory can."""
    (target,) = files_of_key(directory, victim.id)
    if target.suffix == ".pack":
        forge_packed_block(target, victim, state, secret, forger)
        return
    _flags, header = header_of(target)
    mac = None if secret is None else mac_key(secret)
    original = decode(target.read_bytes(), key=victim, store_id=header["store_id"], mac_secret=mac)
    forged = Snapshot(victim, original.tokens, state, original.logits, original.priority)
    encoded = encode(
        forged,
        store_id=header["store_id"],
        state_codec=ZSTD,
        mac_secret=None if forger is None else mac_key(forger),
    )
    data = b"".join(bytes(memoryview(part)) for part in encoded.parts)
    target.write_bytes(data)
    with sqlite3.connect(directory / "index.sqlite3") as conn:
        conn.execute("UPDATE entries SET file_bytes = ? WHERE file_name = ?", (len(data), target.name))


def forge_packed_block(
    target: Path, victim: SnapshotKey, state: bytes, secret: bytes | None, forger: bytes | None
) -> None:
    """`forge_block` for a block in a pack: the pack written again with `state` for `victim`, every
    digest valid, signed with the `forger`'s guess (None: unsigned); its rows' shares in the index."""
    data = target.read_bytes()
    head = read_pack_head(io.BytesIO(data), len(data), mac_secret=None if secret is None else mac_key(secret))
    members = []
    for member in head.members:
        block = decode_member(head, member, data[member.offset : member.offset + member.size])
        if member.key == victim:
            block = Snapshot(victim, block.tokens, state, None, block.priority, block.created_at)
        members.append(block)
    encoded = encode_pack(
        members,
        store_id=head.store_id,
        state_codec=ZSTD,
        mac_secret=None if forger is None else mac_key(forger),
    )
    target.write_bytes(b"".join(bytes(memoryview(part).cast("B")) for part in encoded.parts))
    with sqlite3.connect(target.parent.parent / "index.sqlite3") as conn:
        conn.executemany(
            "UPDATE entries SET file_bytes = ? WHERE key_id = ?",
            [(share, block.key.id) for block, share in zip(members, encoded.shares, strict=True)],
        )


def test_blocks_and_records_carry_macs_and_other_readers_do_not_restore(
    tmp_path: Path, tiny_model_path: Path, reference: Reference, make_llama: Any
) -> None:
    directory = tmp_path / "signed"
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    write_prompts(llm, directory, reference, [(0, 420), LATE], secret=SECRET)
    files = key_files(directory)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET, secret=SECRET) as store:
        rows = store.entries(blocks=True)
        assert sum(row.key.is_block for row in rows) == whole_blocks(LATE[1]) // BLOCK_TOKENS
        names = {p.name for row in rows for p in files_of_key(directory, row.key.id)}
    assert names == {p.name for p in files}
    assert all(header_of(p)[0] & FLAG_MAC for p in files)

    for other in (None, b"other"):
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET, secret=other) as store:
            assert restore_all(llm, store, reference, [LATE, (0, 420)]) == {LATE: 0, (0, 420): 0}
    assert key_files(directory) == files  # left to the readers that have the secret
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET, secret=SECRET) as store:
        assert restore_all(llm, store, reference, [LATE])[LATE] >= whole_blocks(LATE[1])
        assert served_bytes_are_cold(store, reference)[0] == whole_blocks(LATE[1]) // BLOCK_TOKENS


def forge_block_3(directory: Path, reference: Reference, secret: bytes | None, forger: bytes | None) -> int:
    """Block 3 of LATE gets block 7's rows: the layout fits, the numbers are another position's.
    Return the tokens a signed restore can still authenticate: the blocks before the forged file (a
    forged pack fails its MAC as a whole)."""
    keys = block_keys(reference.fingerprint, SCOPE, as_token_array(reference.prompt(LATE)), 8)
    (forged,) = files_of_key(directory, keys[3].id)
    before = next(i for i, key in enumerate(keys) if files_of_key(directory, key.id) == [forged])
    forge_block(directory, keys[3], reference.blocks[keys[7]], secret, forger)
    return before * BLOCK_TOKENS


@pytest.mark.parametrize(
    ("secret", "forger"),
    [(SECRET, None), (SECRET, b"guess"), (None, None)],
    ids=["signed-forged-unsigned", "signed-forged-with-a-guess", "unsigned"],
)
def test_a_forged_block_stops_a_signed_restore(
    tmp_path: Path,
    tiny_model_path: Path,
    reference: Reference,
    make_llama: Any,
    secret: bytes | None,
    forger: bytes | None,
) -> None:
    directory = tmp_path / "forged"
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    write_prompts(llm, directory, reference, [LATE], secret=secret)
    authentic = forge_block_3(directory, reference, secret, forger)
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET, secret=secret) as store:
        cached = CachedLlama(llm, store, SCOPE, save=False)
        llm.reset()
        context = complete(cached, reference.prompt(LATE))
        assert cached.last_restore is not None
        restored = cached.last_restore.restored_tokens
    print(f"\nrestored {restored} tokens of a prompt whose block 3 is forged")
    if secret is not None:
        assert restored == authentic  # the blocks before the forged one's file
        assert context == reference.context(LATE)
    else:
        # Why the secret matters: without it the forgery is well formed enough to be restored.
        assert restored > 3 * BLOCK_TOKENS


@pytest.mark.parametrize("cause", ["secret-changed", "forged-block"])
def test_a_writer_with_the_secret_replaces_blocks_it_cannot_read(
    tmp_path: Path, tiny_model_path: Path, reference: Reference, make_llama: Any, cause: str
) -> None:
    directory = tmp_path / "cache"
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    if cause == "secret-changed":
        write_prompts(llm, directory, reference, [LATE], secret=b"the old secret")
    else:
        write_prompts(llm, directory, reference, [LATE], secret=SECRET)
        authentic = forge_block_3(directory, reference, SECRET, None)
    # A completion with the secret restores the blocks it can authenticate (none under a new secret,
    # those before the forged one's file), reads the rest and saves it, as it would any miss.
    expected = 0 if cause == "secret-changed" else authentic
    assert write_prompts(llm, directory, reference, [LATE], secret=SECRET) == {LATE: expected}
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET, secret=SECRET) as store:
        assert restore_all(llm, store, reference, [LATE])[LATE] >= whole_blocks(LATE[1])


# -- damaged records ----------------------------------------------------------------------------------

WARMED = 470
DAMAGED_PROMPT = 880  # its record (after 848 tokens) reaches past its whole blocks (832)


def _flip_a_byte(path: Path, _other: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path, _other: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])


def _another_record(path: Path, other: Path) -> None:
    """Another record of the same prompt (the warmed one), re-encoded under this one's key with valid
    checksums: what an unsigned store cannot tell from the real one but by its contents."""
    _flags, header = header_of(path)
    k = header["key"]
    key = SnapshotKey(k["model_fingerprint"], k["scope"], k["token_count"], k["prefix_hash"])
    original = decode(path.read_bytes(), key=key, store_id=header["store_id"], mac_secret=None)
    _flags, other_header = header_of(other)
    o = other_header["key"]
    other_key = SnapshotKey(o["model_fingerprint"], o["scope"], o["token_count"], o["prefix_hash"])
    state = decode(other.read_bytes(), key=other_key, store_id=header["store_id"], mac_secret=None).state
    forged = Snapshot(key, original.tokens, state, original.logits, original.priority)
    encoded = encode(forged, store_id=header["store_id"], state_codec=ZSTD, mac_secret=None)
    data = b"".join(bytes(memoryview(part)) for part in encoded.parts)
    path.write_bytes(data)
    with sqlite3.connect(path.parent.parent / "index.sqlite3") as conn:
        conn.execute(
            "UPDATE entries SET file_bytes = ?, state_bytes = ? WHERE file_name = ?",
            (len(data), memoryview(state).nbytes, path.name),
        )


DAMAGES = {"flipped-byte": _flip_a_byte, "truncated": _truncate, "another-record": _another_record}


@pytest.fixture(scope="module")
def tiny_gemma2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with sliding-window layers: its records hold a window cache, and blocks alone
    never serve it."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-gemma2.gguf", "gemma2")


@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_a_damaged_record_is_a_shorter_prefix_never_wrong_bytes(
    tmp_path: Path, request: pytest.FixtureRequest, make_llama: Any, model: str
) -> None:
    path = request.getfixturevalue("tiny_model_path" if model == "llama" else "tiny_gemma2_path")
    pristine = tmp_path / "pristine"
    llm = make_llama(path, n_ctx=N_CTX)
    prompt = prompt_tokens(llm, 0, DAMAGED_PROMPT)
    cold_context = complete(make_llama(path, n_ctx=N_CTX), prompt)

    with SnapshotStore(pristine, ram_bytes=0, disk_bytes=BUDGET) as store:
        cached = CachedLlama(llm, store, SCOPE, prefix_reuse=None)
        cached.warm(prompt[:WARMED])
        llm.reset()
        assert complete(cached, prompt) == cold_context
        store.flush()
        rows = [row for row in store.entries() if not row.key.is_block]
    warmed, end = sorted(rows, key=lambda row: row.key.token_count)
    assert warmed.key.token_count == WARMED - WARMED % cached.alignment  # saved on the split alignment
    # Blocks alone serve a model with one cache; a sliding-window model falls back to the warmed record.
    shorter = whole_blocks(DAMAGED_PROMPT) if model == "llama" else warmed.key.token_count
    assert end.key.token_count > shorter  # so that the record's loss shows

    def restore(directory: Path) -> tuple[int, list[int], bool]:
        with SnapshotStore(directory, ram_bytes=0, disk_bytes=BUDGET) as store:
            cached = CachedLlama(llm, store, SCOPE, save=False)
            llm.reset()
            context = complete(cached, prompt)
            assert cached.last_restore is not None
            return cached.last_restore.restored_tokens, context, store.get(end.key) is not None

    assert restore(pristine) == (end.key.token_count, cold_context, True)
    for name, damage in DAMAGES.items():
        directory = tmp_path / name
        shutil.copytree(pristine, directory)
        damage(files_of_key(directory, end.key.id)[0], files_of_key(directory, warmed.key.id)[0])
        restored, context, kept = restore(directory)
        assert (restored, context) == (shorter, cold_context), name
        # A file that fails its checksum is a miss from then on.
        assert kept == (name == "another-record"), name


# -- permissions --------------------------------------------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("ram_bytes", [0, 16 << 20], ids=["written-at-once", "written-behind"])
def test_block_files_are_0600_in_0700_directories(
    tmp_path: Path, tiny_model_path: Path, reference: Reference, make_llama: Any, ram_bytes: int
) -> None:
    directory = tmp_path / "a" / "cache"
    old = os.umask(0o000)
    try:
        with SnapshotStore(directory, ram_bytes=ram_bytes, disk_bytes=BUDGET) as store:
            cached = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, SCOPE)
            complete(cached, reference.prompt(LATE))
            store.flush()
            modes = {
                p: (stat.S_IMODE(p.stat().st_mode), p.is_dir()) for p in [directory, *directory.rglob("*")]
            }
            block_ids = [row.key.id for row in store.entries(blocks=True) if row.key.is_block]
    finally:
        os.umask(old)
    assert len(block_ids) == whole_blocks(LATE[1]) // BLOCK_TOKENS
    block_files = [p for key_id in block_ids for p in files_of_key(directory, key_id)]
    assert len(block_files) == len(block_ids)
    assert all(modes[p] == (0o600, False) for p in block_files)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    loose = {
        str(p.relative_to(tmp_path)): oct(bits)
        for p, (bits, d) in modes.items()
        if bits & ~(0o700 if d else 0o600)
    }
    assert loose == {}
