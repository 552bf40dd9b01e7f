"""Shared 64-token blocks: states cut into blocks and records, assembled back, shared across prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chat_support import GREEDY, N_CTX, SYSTEM, chat, chat_reply, context_of

from snapcache.key import BLOCK_TOKENS, SnapshotKey, as_token_array, block_keys
from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.state.assembly import Assembly, _blob_start, assemble
from snapcache.llama.state.blocks import KIND_PROMPT_END, read_record, split_state
from snapcache.llama.state.capture_buffer import CaptureBuffer
from snapcache.llama.state.sequences import capture_sequence
from snapcache.store import SnapshotStore

RAW = "Report: the quick brown fox jumps over the lazy dog near the river bank today. " * 12


def _greedy_tokens(llm: Any, prompt: str) -> list[int]:
    out = llm.create_completion(prompt, **GREEDY)
    return [int(t) for t in llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False, special=True)]


def _cold(make_llama: Any, path: Path, prompt: str) -> tuple[str, list[int]]:
    llm = make_llama(path, n_ctx=N_CTX)
    text = llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    return text, context_of(llm)


def test_a_capture_cut_into_blocks_and_records_assembles_back_byte_for_byte(make_llama, tiny_model_path):
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(RAW.encode())[:700]
    llm.eval(tokens[:650])
    split = split_state(capture_sequence(llm).state)
    assert split is not None
    assert not split.windows
    blocks = [split.block(i) for i in range(650 // BLOCK_TOKENS)]

    # The record at the capture's end: the whole blob again.
    record = read_record(split.record(650, KIND_PROMPT_END))
    assert bytes(assemble(blocks, record)) == bytes(capture_sequence(llm).state)

    # Blocks alone, and a record cut short of the capture: what a read of just those tokens holds.
    short = make_llama(tiny_model_path, n_ctx=N_CTX)
    short.eval(tokens[:320])
    assert bytes(assemble(blocks[:5], None)) == bytes(capture_sequence(short).state)
    short.eval(tokens[320:330])
    record = read_record(split.record(330, KIND_PROMPT_END))
    assert bytes(assemble(blocks[:5], record)) == bytes(capture_sequence(short).state)


def _place_from_two_threads(assembly: Assembly, blocks: list[bytes]) -> None:
    """Place `blocks` last first, from two threads taking turns (one block each), so that which
    thread places which block does not depend on how the machine schedules them."""
    import threading

    order = list(range(len(blocks)))[::-1]
    turn = threading.Condition()
    placed = [0]

    def place(k: int) -> None:
        for step in range(k, len(order), 2):
            with turn:
                turn.wait_for(lambda step=step: placed[0] == step, timeout=60)
            assembly.place(order[step], blocks[order[step]])
            with turn:
                placed[0] += 1
                turn.notify_all()

    threads = [threading.Thread(target=place, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _blocks_of_700_tokens(make_llama, tiny_model_path):
    """The blocks and the prompt-end record of a 700-token read of RAW, and the state they make."""
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    llm.eval(llm.tokenize(RAW.encode())[:700])
    split = split_state(capture_sequence(llm).state)
    assert split is not None
    blocks = [split.block(i) for i in range(700 // BLOCK_TOKENS)]
    return blocks, read_record(split.record(700, KIND_PROMPT_END)), bytes(capture_sequence(llm).state)


def test_blocks_placed_in_any_order_from_two_threads_assemble_the_same_blob(make_llama, tiny_model_path):
    blocks, record, expected = _blocks_of_700_tokens(make_llama, tiny_model_path)
    assembly = Assembly(len(blocks), record)
    with pytest.raises(ValueError, match="not all"):
        assembly.finish()
    _place_from_two_threads(assembly, blocks)
    assert bytes(assembly.finish()) == bytes(assemble(blocks, record)) == expected
    with pytest.raises(ValueError, match="not one of"):
        assembly.place(len(blocks), blocks[0])


def test_blocks_kept_and_placed_in_any_mix_assemble_the_same_blob(make_llama, tiny_model_path):
    blocks, record, expected = _blocks_of_700_tokens(make_llama, tiny_model_path)
    for kept in (range(len(blocks)), range(0, len(blocks), 2), range(1, len(blocks), 3)):
        assembly = Assembly(len(blocks), record)
        for index in reversed(range(len(blocks))):
            if index in kept:
                assembly.keep(index, blocks[index])
            else:
                assembly.place(index, blocks[index])
        assert bytes(assembly.finish()) == expected
    assembly = Assembly(len(blocks), record)
    with pytest.raises(ValueError, match="not one of"):
        assembly.keep(len(blocks), blocks[0])
    assembly.keep(0, blocks[0])
    with pytest.raises(ValueError, match="not all"):
        assembly.finish()
    with pytest.raises(ValueError, match="do not share"):
        assembly.keep(1, bytes(blocks[1])[:-1])


def test_a_blob_starts_half_a_page_from_its_first_blocks_rows_in_page_offset() -> None:
    """So that copying a block's rows in is never a copy a few bytes ahead of its source within a
    page (see `_blob_start`), wherever the memory and the block lie."""
    memory = np.zeros(3 * 4096, dtype=np.uint8)
    block = np.zeros(2 * 4096, dtype=np.uint8)[16:]
    for rows_at, block_rows_at in ((0, 0), (36, 20), (5000, 4095), (12, 4000)):
        start = _blob_start(memory, rows_at, block, block_rows_at)
        assert 0 <= start < 4096
        target = memory.ctypes.data + start + rows_at
        assert (target - (block.ctypes.data + block_rows_at)) % 4096 == 2048


def test_pieces_that_do_not_fit_together_are_refused(make_llama, tiny_model_path, gemma_model_path):
    tiny = make_llama(tiny_model_path, n_ctx=N_CTX)
    tiny.eval(tiny.tokenize(RAW.encode())[:200])
    split = split_state(capture_sequence(tiny).state)
    assert split is not None
    blocks = [split.block(i) for i in range(3)]
    record = read_record(split.record(200, KIND_PROMPT_END))
    with pytest.raises(ValueError, match="needs 3 blocks"):
        assemble(blocks[:2], record)  # the record needs three
    with pytest.raises(ValueError, match="layout"):
        assemble([blocks[0], blocks[1][:-1]], None)  # a short block
    with pytest.raises(ValueError, match="too short"):
        assemble([blocks[0][:10]], None)  # a block cut inside its layout fields
    with pytest.raises(ValueError, match="end"):
        read_record(split.record(200, KIND_PROMPT_END)[:-5])  # a truncated record

    gemma = make_llama(gemma_model_path, n_ctx=1024)
    gemma.eval(gemma.tokenize(RAW.encode())[:200])
    other = split_state(capture_sequence(gemma).state)
    assert other is not None
    assert other.windows
    with pytest.raises(ValueError, match="layout"):
        assemble([blocks[0], other.block(1)], None)  # another model's layout
    with pytest.raises(ValueError, match="no record of 100 tokens"):
        other.record(100, KIND_PROMPT_END)  # a window cache holds only the point it was captured at


def test_blocks_are_not_listed_as_snapshots(cached, store):
    llm = cached(scope="agent")
    llm.create_completion(RAW, **GREEDY)
    store.flush()
    snapshots = store.entries()
    with_blocks = store.entries(blocks=True)
    assert snapshots
    assert all(not row.key.is_block for row in snapshots)
    blocks = [row for row in with_blocks if row.key.is_block]
    n_prompt = llm.last_restore.prompt_tokens
    assert len(blocks) == n_prompt // BLOCK_TOKENS
    assert {row.key.model_fingerprint for row in blocks} == {llm.fingerprint}
    assert len(store.entries(scope="agent", blocks=True)) == len(with_blocks)
    assert store.entries(scope="other", blocks=True) == []


def test_a_raw_prompt_sharing_tokens_restores_them_rounded_down(cached, make_llama, tiny_model_path):
    first = cached()
    first.create_completion(RAW + "Question: where is the fox?", **GREEDY)
    prompt1 = context_of(first.llm)[: first.last_restore.prompt_tokens]

    prompt = RAW[: len(RAW) - 100] + "A different ending, about a cat that sleeps all day."
    second = cached()
    text = second.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    prompt2 = context_of(second.llm)[: second.last_restore.prompt_tokens]
    shared = next(i for i, (a, b) in enumerate(zip(prompt1, prompt2, strict=False)) if a != b)

    assert shared % BLOCK_TOKENS != 0  # otherwise the test shows nothing about rounding
    assert second.last_restore.restored_tokens == shared // BLOCK_TOKENS * BLOCK_TOKENS
    assert second.last_restore.source in ("ram", "disk")
    assert (text, context_of(second.llm)) == _cold(make_llama, tiny_model_path, prompt)


def test_blocks_written_by_different_requests_restore_as_cold(cached, make_llama, tiny_model_path):
    # Request 1 stores the blocks of A; request 2 restores them and stores those of A + B after them;
    # request 3 restores A + B + C's prefix from blocks of both, and answers as a cold read.
    a, b, c = RAW, "Then a heron landed on the bank and looked around. " * 4, "Question: who landed?"
    cached().create_completion(a, **GREEDY)
    second = cached()
    second.create_completion(a + b, **GREEDY)
    assert second.last_restore.restored_tokens > 0
    third = cached()
    text = third.create_completion(a + b + c, **GREEDY)["choices"][0]["text"]
    restored = third.last_restore.restored_tokens
    assert restored > second.last_restore.prompt_tokens - BLOCK_TOKENS - 40
    assert (text, context_of(third.llm)) == _cold(make_llama, tiny_model_path, a + b + c)


def test_gemma_restores_from_blocks_of_earlier_requests_as_cold(make_llama, gemma_model_path, store):
    system = "You are a helpful assistant for a small bakery. Keep answers short and friendly. " * 12

    def turn(messages: list[dict[str, str]], **kwargs: Any) -> tuple[str, CachedLlama]:
        llm = CachedLlama(make_llama(gemma_model_path, n_ctx=2048), store, scope="bakery")
        return chat_reply(llm.create_chat_completion(messages, temperature=0.0, max_tokens=12)), llm

    turn(chat(system, "When do you open?"))
    reply2, second = turn(chat(system, "Do you sell rye bread?"))
    assert second.last_restore.restored_tokens >= 64  # the system part, from the first request's blocks
    messages = chat(system, "Do you sell rye bread?", reply2, "And on Sundays?")
    reply3, third = turn(messages)
    # The end of the second request's prompt: blocks from both requests, its own window.
    assert third.last_restore.restored_tokens > second.last_restore.prompt_tokens - 2 * BLOCK_TOKENS
    cold = make_llama(gemma_model_path, n_ctx=2048)
    cold_reply = chat_reply(cold.create_chat_completion(messages=messages, temperature=0.0, max_tokens=12))
    assert (reply3, context_of(third.llm)) == (cold_reply, context_of(cold))


def _stored_bytes(store: SnapshotStore) -> tuple[int, int]:
    """(state bytes, file bytes) of everything `store` holds: snapshots and shared blocks."""
    store.flush()
    rows = store.entries(blocks=True)
    return sum(row.state_bytes for row in rows), sum(row.nbytes for row in rows if row.tier == "disk")


def _ten_turn_chat(llm: CachedLlama, system: str, max_tokens: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}]
    for i in range(10):
        question = f"Question {i}: " + "tell me about the weather there. " * 3
        messages.append({"role": "user", "content": question})
        out = llm.create_chat_completion(messages, temperature=0.0, max_tokens=max_tokens)
        messages.append({"role": "assistant", "content": chat_reply(out)})
    return messages


@pytest.mark.parametrize(("model", "limit"), [("tiny", 1.3), ("gemma", 2.0)])
def test_a_ten_turn_chat_stores_little_more_than_one_snapshot_of_its_end(
    model, limit, make_llama, tiny_model_path, request, tmp_path
):
    path = tiny_model_path if model == "tiny" else request.getfixturevalue("gemma_model_path")
    store = SnapshotStore(tmp_path / "chat", ram_bytes=0, disk_bytes=2 << 30)
    llm = CachedLlama(make_llama(path, n_ctx=4096), store, scope="chat")
    _ten_turn_chat(llm, SYSTEM * 2, max_tokens=12)
    state_bytes, file_bytes = _stored_bytes(store)
    store.close()

    # One snapshot of the final prompt, read cold.
    prompt = context_of(llm.llm)[: llm.last_restore.prompt_tokens]
    cold = make_llama(path, n_ctx=4096)
    cold.eval(prompt)
    captured = capture_sequence(cold)
    with SnapshotStore(tmp_path / "one", ram_bytes=0, disk_bytes=1 << 30) as one:
        one.put(SnapshotKey.for_tokens("whole", "default", captured.tokens), captured.tokens, captured.state)
        one_state, one_file = _stored_bytes(one)
    assert one_state == captured.state.nbytes
    assert state_bytes <= limit * one_state, (state_bytes, one_state)
    if model == "gemma":
        # The tiny model's random KV of repeated text compresses far better whole than in blocks;
        # Gemma's compresses alike either way.
        assert file_bytes <= limit * one_file, (file_bytes, one_file)


def test_a_damaged_block_serves_a_shorter_prefix_never_wrong_bytes(make_llama, tiny_model_path, tmp_path):
    directory = tmp_path / "cache"
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=1 << 30) as store:
        CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store).create_completion(RAW, **GREEDY)
        store.flush()
        blocks = sorted(
            (row for row in store.entries(blocks=True) if row.key.is_block), key=lambda row: row.created_at
        )
    assert len(blocks) >= 8
    # Damage the fourth block in its pack: the record needs it, and a run of blocks ends before it.
    victim = blocks[3].key
    path, member = _pack_member(directory, victim)
    data = bytearray(path.read_bytes())
    data[member.offset + member.size // 2] ^= 0xFF
    path.write_bytes(data)

    with SnapshotStore(directory, ram_bytes=64 << 20, disk_bytes=1 << 30) as store:
        again = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store)
        text = again.create_completion(RAW, **GREEDY)["choices"][0]["text"]
        assert again.last_restore.restored_tokens == 3 * BLOCK_TOKENS
        # The damaged block's row was dropped (the pack's other blocks still serve), and the
        # completion's own read stored that block afresh, in another file.
        assert store.get(victim) is not None
    assert _pack_member(directory, victim)[0] != path
    assert (text, context_of(again.llm)) == _cold(make_llama, tiny_model_path, RAW)


def _pack_member(directory, key):
    """The pack file holding block `key` in the store at `directory`, and where the block lies in it."""
    from snapcache.disk.files import FILES_DIR, INDEX_NAME
    from snapcache.disk.index import DiskIndex
    from snapcache.formats.pack_file import read_pack_head

    index = DiskIndex(directory / INDEX_NAME)
    try:
        row = index.get(key.id)
    finally:
        index.close()
    path = directory / FILES_DIR / row.file_name
    if not path.name.endswith(".pack"):
        return path, None
    with path.open("rb") as file:
        head = read_pack_head(file, path.stat().st_size, mac_secret=None)
    return path, head.member(key)


def test_a_window_assembled_padded_is_the_padded_assembly_byte_for_byte(
    make_llama, gemma_model_path, monkeypatch
):
    import threading
    from collections.abc import Callable

    import numpy as np

    from snapcache.llama.state import assembly as assembly_module
    from snapcache.llama.state._state_layout import pad_window, parse_sections
    from snapcache.llama.state.assembly import _Layout
    from snapcache.llama.state.blocks import pads_window

    gemma = make_llama(gemma_model_path, n_ctx=1024)
    gemma.eval(gemma.tokenize((RAW * 4).encode())[:700])  # past the 512-token window: it starts at 188
    split = split_state(capture_sequence(gemma).state)
    assert split is not None
    blocks = [split.block(i) for i in range(700 // BLOCK_TOKENS)]
    record = read_record(split.record(700, KIND_PROMPT_END))
    assert pads_window(record)
    whole = np.frombuffer(assemble(blocks, record), dtype=np.uint8)
    padded = pad_window(whole, parse_sections(whole))
    assert padded is not None
    assert bytes(assemble(blocks, record, pad_window=True)) == padded.tobytes()
    # The blob's memory may hold other bytes (malloc reuses it): every byte is written, the zero
    # rows of the padding included.
    with monkeypatch.context() as patched:
        patched.setattr(assembly_module, "empty_in_pieces", lambda size: (np.full(size, 0xA5, np.uint8), []))
        assert bytes(assemble(blocks, record, pad_window=True)) == padded.tobytes()
        assert bytes(assemble(blocks, record)) == whole.tobytes()
    # From two threads, each block placed brings its share of the window's writes, whichever thread
    # places it: the same bytes, padded or not, and both threads make some of those writes (each
    # places 5 of the 10 blocks, whose shares add up to about half of the writes).
    writers: dict[bool, set[int]] = {True: set(), False: set()}
    later_writes = _Layout.later_writes

    def watched(layout: _Layout) -> list[Callable[[], None]]:
        def wrap(write: Callable[[], None]) -> Callable[[], None]:
            def watched_write() -> None:
                writers[layout.window is not None].add(threading.get_ident())
                write()

            return watched_write

        return [wrap(write) for write in later_writes(layout)]

    monkeypatch.setattr(_Layout, "later_writes", watched)
    for pad in (True, False):
        assembly = Assembly(len(blocks), record, pad_window=pad)
        _place_from_two_threads(assembly, blocks)
        assert bytes(assembly.finish()) == (padded.tobytes() if pad else whole.tobytes())
        assert len(writers[pad]) == 2
    assert not pads_window(None)


def test_a_window_is_padded_only_down_to_the_multiple_of_256_below_it(make_llama, gemma_model_path):
    """Zero cells go in front of the window until its first cell sits at a slot congruent to its
    position modulo 256 (here from 256 on, not from 0); a window padded so needs no more."""
    import numpy as np

    from snapcache.llama.state._state_layout import pad_window, parse_sections, window_start

    gemma = make_llama(gemma_model_path, n_ctx=1024)
    gemma.eval(gemma.tokenize((RAW * 6).encode())[:900])
    whole = np.frombuffer(capture_sequence(gemma).state, dtype=np.uint8)
    sections = parse_sections(whole)
    window = sections[1]
    first = window_start(window)
    assert 256 < first < 512  # 388: the window of the last 512 positions
    padded = pad_window(whole, sections)
    assert padded is not None
    padded_sections = parse_sections(padded)
    assert padded[: window.start].tobytes() == whole[: window.start].tobytes()  # the first cache as it was
    got = padded_sections[1]
    assert got.positions.tolist() == list(range(256, 900))
    pad = first - 256
    m = len(window.positions)
    for bare, layer in zip(window.layers, got.layers, strict=True):
        rows = whole[bare.data : bare.data + bare.width * m * bare.row_bytes].reshape(bare.width, -1)
        padded_rows = padded[layer.data : layer.data + layer.width * (pad + m) * layer.row_bytes]
        padded_rows = padded_rows.reshape(layer.width, -1)
        assert not padded_rows[:, : pad * layer.row_bytes].any()
        assert np.array_equal(padded_rows[:, pad * layer.row_bytes :], rows)
    assert pad_window(padded, padded_sections) is None


def test_a_warm_shorter_than_a_block_is_stored_whole_and_restores_as_cold(
    cached, store, make_llama, tiny_model_path
):
    warmer = cached()
    tokens = warmer.llm.tokenize(RAW.encode())
    short = tokens[: BLOCK_TOKENS - 24]
    warmed = warmer.warm(short)
    assert (warmed.token_count, warmed.from_cache) == (len(short), False)
    store.flush()
    rows = store.entries(blocks=True)
    assert [(row.key.token_count, row.key.is_block) for row in rows] == [(len(short), False)]
    assert cached().warm(short).from_cache  # found whole, as stored

    reader = cached()
    reader.create_completion(tokens[: BLOCK_TOKENS - 24 + 10], **GREEDY)
    assert reader.last_restore is not None
    assert (reader.last_restore.restored_tokens, reader.last_restore.source) == (len(short), "ram")
    cold = make_llama(tiny_model_path, n_ctx=N_CTX)
    cold.create_completion(tokens[: BLOCK_TOKENS - 24 + 10], **GREEDY)
    assert context_of(reader.llm) == context_of(cold)


def test_a_point_before_the_first_block_ends_is_not_stored(make_llama, tiny_model_path, store):
    from snapcache.llama.state.blocks import KIND_PREFIX
    from snapcache.llama.stored.stored_states import RestorePoint, StoredStates

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(RAW.encode())[:80]
    llm.eval(tokens)
    states = StoredStates(store, "f" * 64)
    points = [RestorePoint(48, 0, KIND_PREFIX), RestorePoint(80, 0, KIND_PREFIX)]
    assert states.save(capture_sequence(llm), "default", points, blocks_upto=80) == 1
    store.flush()
    kept = sorted((row.key.token_count, row.key.is_block) for row in store.entries(blocks=True))
    assert kept == [(BLOCK_TOKENS, True), (80, False)]  # no record that no restore could assemble


def test_a_record_whose_token_count_differs_from_its_key_is_not_assembled(make_llama, tiny_model_path, store):
    from snapcache.llama.state.blocks import KIND_PREFIX
    from snapcache.llama.stored.stored_states import StoredStates

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(RAW.encode())[:200]
    llm.eval(tokens)
    split = split_state(capture_sequence(llm).state)
    assert split is not None
    states = StoredStates(store, "f" * 64)
    for i, key in enumerate(block_keys_of(states.fingerprint, tokens, 3)):
        store.put(key, tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS], split.block(i))
    # A record of 130 tokens stored under the key of 200: its blocks exist, its blob would be short.
    key = SnapshotKey.for_tokens(states.fingerprint, "default", tokens)
    store.put(key, tokens, split.record(130, KIND_PREFIX))
    assert states.find(as_token_array([*tokens, 5]), "default", blocks_alone=False) is None
    assert states.complete(key) is None


def test_find_on_a_closed_store_is_a_miss(make_llama, tiny_model_path, tmp_path):
    from snapcache.llama.stored.stored_states import StoredStates

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(RAW.encode())[:300]
    store = SnapshotStore(tmp_path / "closed", ram_bytes=1 << 20, disk_bytes=64 << 20)
    store.close()
    assert StoredStates(store, "f" * 64).find(as_token_array(tokens), "default", blocks_alone=True) is None


def block_keys_of(fingerprint: str, tokens: list[int], n_blocks: int) -> list[SnapshotKey]:
    return block_keys(fingerprint, "default", as_token_array(tokens), n_blocks)


@pytest.mark.parametrize("blocks_alone", [False, True])
def test_a_prefix_no_longer_than_the_one_held_is_a_miss_and_never_assembled(
    make_llama, tiny_model_path, store, blocks_alone
):
    """`find(longer_than=n)`: a caller that holds n tokens of the prompt (a live sequence) gets
    only a longer prefix, and the store's shorter one is not read and assembled for nothing."""
    from snapcache.llama.state.blocks import KIND_PREFIX
    from snapcache.llama.stored.stored_states import RestorePoint, StoredStates

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(RAW.encode())[:192]
    llm.eval(tokens)
    states = StoredStates(store, "f" * 64)
    assert states.save(capture_sequence(llm), "default", [RestorePoint(192, 0, KIND_PREFIX)], blocks_upto=192)
    assembled: list[int] = []
    real_assemble = states._assemble

    def counting(keys: Any, *args: Any) -> Any:
        assembled.append(len(keys))
        return real_assemble(keys, *args)

    states._assemble = counting  # type: ignore[method-assign]
    query = as_token_array([*tokens, 5, 6])
    assert states.find(query, "default", blocks_alone=blocks_alone, longer_than=192) is None
    assert assembled == []
    found = states.find(query, "default", blocks_alone=blocks_alone, longer_than=191)
    assert found is not None
    assert found.snapshot.key.token_count == 192
    assert assembled == [3]


def test_an_assembly_builds_its_blob_in_the_buffer_lent_to_it(make_llama, tiny_model_path):
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(RAW.encode())[:700]
    llm.eval(tokens[:330])
    captured = capture_sequence(llm).state
    split = split_state(captured)
    assert split is not None
    blocks = [split.block(i) for i in range(330 // BLOCK_TOKENS)]
    record = read_record(split.record(330, KIND_PROMPT_END))
    buffer = CaptureBuffer()
    buffer.lease(1 << 20)[:] = 0xAB  # an earlier capture's bytes: every one is written over
    buffer.release()
    loan = buffer.loan()
    assembly = Assembly(len(blocks), record, into=loan)
    for i, block in enumerate(blocks):
        assembly.place(i, block)
    blob = np.frombuffer(assembly.finish(), dtype=np.uint8)
    assert bytes(blob) == bytes(captured)
    assert np.shares_memory(blob, buffer._array)
    assert loan(100) is None  # lent once: a second assembly of the same restore gets new memory
    loan.release()
    buffer.lease(10).fill(0)  # free again
    buffer.release()
