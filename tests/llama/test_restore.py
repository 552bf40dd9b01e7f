"""Capture and restore one sequence on real models: greedy output equals a cold run, token for token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snapcache.errors import InvalidArgument
from snapcache.key import SnapshotKey
from snapcache.llama import (
    can_truncate,
    capture_sequence,
    model_fingerprint,
    restore_sequence,
    truncate_sequence,
)
from snapcache.llama.state import capture_buffer as capture_buffer_module
from snapcache.llama.state.capture_buffer import capture_buffer
from snapcache.llama.state.host_memory import PinnedMemory, cpu_buffer_type
from snapcache.llama.state.sequences import can_truncate_to
from snapcache.llama.stored.checkpoints import CHECKPOINT_ALIGN
from snapcache.snapshot import Snapshot

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
N_GENERATED = 16

_TINY_PREFIX = "You are a careful assistant. Answer in one short line.\n" * 3
_GEMMA_PREFIX = "".join(
    f"Rule {i}: when the user asks about project {i}, check the notes for project {i} first "
    f"and answer in at most {i % 5 + 2} sentences.\n"
    for i in range(1, 32)
)
_SUFFIX = "Question: what should I do first today?\nAnswer:"


def greedy(llm: Any, tokens: list[int], n: int = N_GENERATED) -> list[int]:
    """Greedy continuation of `tokens` through llama-cpp-python's own generate()."""
    out: list[int] = []
    for token in llm.generate(tokens, temp=0.0, top_k=1):
        if token == llm.token_eos():
            break
        out.append(int(token))
        if len(out) >= n:
            break
    return out


def count_evaluated(llm: Any) -> list[int]:
    """Record the size of every llm.eval() call from now on."""
    calls: list[int] = []
    original = llm.eval

    def counting(tokens: Any) -> None:
        calls.append(len(tokens))
        original(tokens)

    llm.eval = counting
    return calls


@dataclass
class Case:
    name: str
    model_path: Path
    n_ctx: int
    prefix: list[int]
    full: list[int]
    snapshot: Snapshot
    cold_full: list[int]
    cold_prefix: list[int]


def _snapshot_of(llm: Any, scope: str = "default") -> Snapshot:
    captured = capture_sequence(llm)
    key = SnapshotKey.for_tokens(model_fingerprint(llm), scope, captured.tokens)
    return Snapshot(key, captured.tokens, captured.state, captured.logits)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("tiny", id="tiny"),
        pytest.param("gemma", id="gemma", marks=[pytest.mark.gemma, pytest.mark.slow]),
    ],
)
def case(request: pytest.FixtureRequest, llama_factory: Any) -> Iterator[Case]:
    """A captured prefix of each model, and the cold greedy continuations to compare against."""
    if request.param == "tiny":
        path, n_ctx, text = request.getfixturevalue("tiny_model_path"), 512, _TINY_PREFIX
    else:
        path, n_ctx, text = request.getfixturevalue("gemma_model_path"), 2048, _GEMMA_PREFIX
    warm = llama_factory(path, n_ctx=n_ctx)
    cold = llama_factory(path, n_ctx=n_ctx)
    try:
        # Cut at a multiple of 64 tokens, where snapcache restores: llama.cpp's quantized CPU kernels
        # give results that depend on where a prompt is split into batches elsewhere.
        prefix = warm.tokenize(text.encode())
        prefix = prefix[: len(prefix) // CHECKPOINT_ALIGN * CHECKPOINT_ALIGN]
        full = prefix + warm.tokenize(_SUFFIX.encode(), add_bos=False)
        warm.eval(prefix)
        snapshot = _snapshot_of(warm)
        cold_full = greedy(cold, full)
        cold.reset()
        cold_prefix = greedy(cold, prefix)
        yield Case(request.param, path, n_ctx, prefix, full, snapshot, cold_full, cold_prefix)
    finally:
        warm.close()
        cold.close()


def test_capture_holds_the_evaluated_tokens(case: Case) -> None:
    assert list(case.snapshot.tokens) == case.prefix
    assert len(case.snapshot.state) > 0
    assert case.snapshot.logits is None  # llama-cpp-python keeps no logits without logits_all
    assert len(case.cold_full) == N_GENERATED


def test_restore_evaluates_only_the_suffix(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(llm, case.snapshot, case.full)
    assert llm.n_tokens == len(case.prefix)
    evaluated = count_evaluated(llm)
    assert greedy(llm, case.full) == case.cold_full
    assert evaluated[0] == len(case.full) - len(case.prefix)
    assert evaluated[1:] == [1] * (len(evaluated) - 1)


def test_a_restore_through_host_memory_answers_as_cold(
    case: Case, make_llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the K/V cache is on a GPU, a blob held elsewhere (this one, or a padded window) is copied
    into the Llama's pinned buffer first: stood in for by ggml's CPU buffer type on this build."""
    buffer_type = cpu_buffer_type()
    assert buffer_type is not None
    memory = PinnedMemory(buffer_type, 1 << 30)
    monkeypatch.setattr(capture_buffer_module, "pinned_memory_for", lambda _llm: memory)
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(llm, case.snapshot, case.full)
    assert capture_buffer(llm).pinned
    assert memory.held_bytes >= memoryview(case.snapshot.state).nbytes
    evaluated = count_evaluated(llm)
    assert greedy(llm, case.full) == case.cold_full
    assert evaluated[0] == len(case.full) - len(case.prefix)


def test_capture_after_restore_gives_the_same_bytes(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(llm, case.snapshot)
    assert capture_sequence(llm).state == bytes(case.snapshot.state)


def test_prompt_exactly_as_long_as_the_snapshot(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(llm, case.snapshot, case.prefix)
    evaluated = count_evaluated(llm)
    assert greedy(llm, case.prefix) == case.cold_prefix
    # generate() replays the last prompt token for fresh logits, nothing more.
    assert evaluated[0] == 1


def test_restore_into_a_llama_that_holds_other_tokens(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    greedy(llm, llm.tokenize(b"Something else entirely, to fill the context first."), n=4)
    assert llm.n_tokens > 0
    assert restore_sequence(llm, case.snapshot, case.full)
    assert greedy(llm, case.full) == case.cold_full


def test_same_snapshot_restores_twice_into_one_llama(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    for _ in range(2):
        assert restore_sequence(llm, case.snapshot, case.full)
        assert greedy(llm, case.full) == case.cold_full


def test_capture_after_a_completion_is_keyed_by_evaluated_tokens(case: Case, make_llama: Any) -> None:
    source = make_llama(case.model_path, n_ctx=case.n_ctx)
    generated = greedy(source, case.full, n=8)
    snapshot = _snapshot_of(source)
    # The last sampled token was never evaluated, so it has no KV cell and is not in the key.
    assert list(snapshot.tokens) == case.full + generated[:-1]
    target = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(target, snapshot)
    cold = make_llama(case.model_path, n_ctx=case.n_ctx)
    prompt = [*snapshot.tokens.tolist(), generated[-1]]
    assert greedy(target, prompt, n=8) == greedy(cold, prompt, n=8)


def test_snapshot_too_large_for_the_context_is_a_miss(case: Case, make_llama: Any) -> None:
    n_ctx = 64 if case.name == "tiny" else 256
    assert len(case.prefix) >= n_ctx
    llm = make_llama(case.model_path, n_ctx=n_ctx)
    assert not restore_sequence(llm, case.snapshot)
    assert llm.n_tokens == 0
    short = case.prefix[: n_ctx // 2]
    cold = make_llama(case.model_path, n_ctx=n_ctx)
    assert greedy(llm, short, n=8) == greedy(cold, short, n=8)


def test_prompt_that_does_not_extend_the_snapshot_is_a_miss(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    diverging = [*case.prefix[:-1], (case.prefix[-1] + 1) % llm.n_vocab()]
    assert not restore_sequence(llm, case.snapshot, diverging)
    assert not restore_sequence(llm, case.snapshot, case.prefix[:-1])
    assert llm.n_tokens == 0


@pytest.mark.parametrize("compression", ["auto", "zstd"])
def test_restore_through_a_disk_store_in_a_new_process(case: Case, tmp_path: Path, compression: str) -> None:
    """Written compressed or as "auto" chooses (raw: f16 K/V saves less than a quarter), read back
    in a new process under the default setting, restored exactly."""
    from snapcache.formats import codec
    from snapcache.store import SnapshotStore

    cache = tmp_path / "cache"
    with SnapshotStore(cache, ram_bytes=64 << 20, disk_bytes=256 << 20, compression=compression) as store:  # type: ignore[arg-type]
        store.put(case.snapshot.key, case.snapshot.tokens, case.snapshot.state)
    assert set(stored_codecs(cache)) == {codec.RAW if compression == "auto" else codec.NAME}
    script = """
import json, sys
from snapcache import load_llama
from snapcache.llama import model_fingerprint, restore_sequence
from snapcache.store import SnapshotStore
from test_restore import count_evaluated, greedy

path, n_ctx, cache, full = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
llm = load_llama(path, n_ctx=n_ctx, n_threads=2)
with SnapshotStore(cache, ram_bytes=64 << 20, disk_bytes=256 << 20) as store:
    snapshot = store.lookup(model_fingerprint(llm), "default", full)
    restored = snapshot is not None and restore_sequence(llm, snapshot, full)
    evaluated = count_evaluated(llm)
    tokens = greedy(llm, full)
print(json.dumps({"restored": restored, "first_eval": evaluated[0], "tokens": tokens}))
"""
    result = _run_python(script, str(case.model_path), str(case.n_ctx), str(cache), json.dumps(case.full))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["restored"] is True
    assert report["first_eval"] == len(case.full) - len(case.prefix)
    assert report["tokens"] == case.cold_full


def stored_codecs(cache: Path) -> list[str]:
    """The codec each file of a disk tier names in its header."""
    from snapcache.disk.files import FILES_DIR
    from snapcache.formats.snapshot_file import PRELUDE

    names = []
    for path in (cache / FILES_DIR).iterdir():
        data = path.read_bytes()
        _magic, _version, _flags, length = PRELUDE.unpack_from(data)
        names.append(json.loads(data[PRELUDE.size : PRELUDE.size + length])["codec"]["name"])
    return names


def test_random_bytes_are_refused_and_the_llama_stays_usable(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    garbage = np.random.default_rng(1).integers(0, 256, len(case.snapshot.state), dtype=np.uint8)
    bad = Snapshot(case.snapshot.key, case.snapshot.tokens, garbage.tobytes())
    assert not restore_sequence(llm, bad, case.full)
    assert greedy(llm, case.full) == case.cold_full


def test_state_llama_cpp_refuses_leaves_the_llama_usable(case: Case, make_llama: Any) -> None:
    """Structurally plausible states that llama.cpp itself rejects: a miss, the sequence cleared."""
    data_start = _first_cache_data_offset(case.snapshot)
    truncated = bytes(case.snapshot.state[: len(case.snapshot.state) // 2])
    wrong_key_type = bytearray(case.snapshot.state)
    wrong_key_type[data_start + 8 : data_start + 12] = (99).to_bytes(4, "little")
    wrong_layer_count = bytearray(case.snapshot.state)
    wrong_layer_count[data_start + 4 : data_start + 8] = (77).to_bytes(4, "little")
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    for state in (truncated, bytes(wrong_key_type), bytes(wrong_layer_count)):
        greedy(llm, case.full[:10], n=2)
        bad = Snapshot(case.snapshot.key, case.snapshot.tokens, state)
        assert not restore_sequence(llm, bad, case.full)
        assert llm.n_tokens == 0
    assert greedy(llm, case.full) == case.cold_full


def test_flash_attention_layout_mismatch_is_refused(make_llama: Any, tiny_model_path: Path) -> None:
    source = make_llama(tiny_model_path, flash_attn=False)
    source.eval(source.tokenize(_TINY_PREFIX.encode()))
    snapshot = _snapshot_of(source)
    target = make_llama(tiny_model_path, flash_attn=True)
    # The fingerprint already keeps these apart; llama.cpp refuses the V layout as well.
    assert model_fingerprint(target) != snapshot.key.model_fingerprint
    assert not restore_sequence(target, snapshot)
    assert target.n_tokens == 0


def test_corrupted_tensor_bytes_do_not_crash_the_process(tiny_model_path: Path) -> None:
    """Bytes that keep the structure but not the values load; only the store's checksum can tell."""
    script = """
import sys
from llama_cpp import Llama
from snapcache.key import SnapshotKey
from snapcache.llama import capture_sequence, restore_sequence
from snapcache.snapshot import Snapshot
from test_restore import greedy

llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, verbose=False)
prompt = llm.tokenize(b"The state below is damaged on purpose.")
llm.eval(prompt)
captured = capture_sequence(llm)
state = bytearray(captured.state)
for i in range(len(state) - 2000, len(state), 3):
    state[i] ^= 0x5A
snapshot = Snapshot(SnapshotKey.for_tokens("fp", "default", captured.tokens), captured.tokens, bytes(state))
fresh = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, verbose=False)
print("restored", restore_sequence(fresh, snapshot), len(greedy(fresh, prompt, n=8)))
"""
    result = _run_python(script, str(tiny_model_path))
    assert result.returncode == 0, result.stderr
    assert "restored True 8" in result.stdout


def test_truncate_then_continue_matches_cold(make_llama: Any, tiny_model_path: Path) -> None:
    llm = make_llama(tiny_model_path)
    assert can_truncate(llm)
    tokens = llm.tokenize(_TINY_PREFIX.encode())
    llm.eval(tokens)
    cut = len(tokens) // 2
    assert truncate_sequence(llm, cut)
    assert llm.n_tokens == cut
    prompt = [*tokens[:cut], *llm.tokenize(b"Other words.", add_bos=False)]
    evaluated = count_evaluated(llm)
    cold = make_llama(tiny_model_path)
    assert greedy(llm, prompt) == greedy(cold, prompt)
    assert evaluated[0] == len(prompt) - cut


def test_truncate_rejects_lengths_out_of_range(make_llama: Any, tiny_model_path: Path) -> None:
    llm = make_llama(tiny_model_path)
    llm.eval(llm.tokenize(b"abc"))
    with pytest.raises(InvalidArgument):
        truncate_sequence(llm, llm.n_tokens + 1)
    with pytest.raises(InvalidArgument):
        truncate_sequence(llm, -1)
    assert truncate_sequence(llm, llm.n_tokens)
    assert truncate_sequence(llm, 0)
    assert llm.n_tokens == 0


def test_only_models_without_a_sliding_window_rewind(case: Case, make_llama: Any) -> None:
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(llm, case.snapshot)
    n = llm.n_tokens
    rewinds = case.name == "tiny"
    assert can_truncate(llm) is rewinds
    assert truncate_sequence(llm, n - 10) is rewinds
    assert llm.n_tokens == (n - 10 if rewinds else n)
    # One token back stays inside any window: what generate() does for an exact-length prompt.
    assert truncate_sequence(llm, llm.n_tokens - 1)


def test_a_context_read_cold_cuts_back_with_or_without_a_sliding_window(case: Case, make_llama: Any) -> None:
    """A sliding-window cache that still holds every position from 0 can go back into its window;
    one restored past its window cannot, until it is cleared and read cold again."""
    llm = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert restore_sequence(llm, case.snapshot)
    assert can_truncate_to(llm, 64) is (case.name == "tiny")
    assert truncate_sequence(llm, 0)
    llm.eval(case.prefix)
    cut = len(case.prefix) // 2 // 64 * 64
    assert can_truncate_to(llm, cut)
    assert truncate_sequence(llm, cut)
    prompt = [*case.prefix[:cut], *llm.tokenize(_SUFFIX.encode(), add_bos=False)]
    cold = make_llama(case.model_path, n_ctx=case.n_ctx)
    assert greedy(llm, prompt) == greedy(cold, prompt)


def test_capture_of_an_empty_context_is_an_error(make_llama: Any, tiny_model_path: Path) -> None:
    llm = make_llama(tiny_model_path)
    with pytest.raises(InvalidArgument):
        capture_sequence(llm)


def test_logits_are_kept_and_put_back_with_logits_all(make_llama: Any, tiny_model_path: Path) -> None:
    source = make_llama(tiny_model_path, logits_all=True)
    tokens = source.tokenize(_TINY_PREFIX.encode())
    source.eval(tokens)
    snapshot = _snapshot_of(source)
    assert snapshot.logits is not None
    assert snapshot.logits.shape == (source.n_vocab(),)
    np.testing.assert_array_equal(snapshot.logits, source.scores[len(tokens) - 1])
    target = make_llama(tiny_model_path, logits_all=True)
    assert restore_sequence(target, snapshot)
    np.testing.assert_array_equal(target.scores[len(tokens) - 1], snapshot.logits)


def _first_cache_data_offset(snapshot: Snapshot) -> int:
    """Offset of the first cache's data section: after the 16-byte header and 12 bytes per cell."""
    return 16 + 12 * len(snapshot.tokens)


def _run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(TESTS), str(HERE), *filter(None, [env.get("PYTHONPATH", "")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
