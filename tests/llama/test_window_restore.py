"""A restore into a window-sized sliding-window cache reads on as a cold read does, bit for bit.

Gemma 3's window cache (`swa_full` off, snapcache's default) holds n_swa + n_ubatch cells, padded to
256 (1,024 here), and a cold read fills it as a ring: position p at slot p % 1024, the head after
the last token. llama.cpp's state keeps only the window's visible cells; restored bare, they land
from slot 0 and the next tokens after them, so the attention sums add the same values in another
order (greedy answers drifted at 1,280 of 1,284 tokens). `ring_window` lays the window out as the
ring a cold read leaves. The reference is a cold read cut at the same point in one context, as
snapcache's own cold reads are (llama.cpp's results depend on where a read is cut into batches).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from snapcache.key import SnapshotKey
from snapcache.llama import capture_sequence, model_fingerprint, restore_sequence
from snapcache.llama.state._state_layout import ring_cells
from snapcache.llama.state.sequences import window_cells
from snapcache.snapshot import Snapshot

pytestmark = [pytest.mark.model, pytest.mark.gemma, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
N_CTX = 4096
QUESTION = "Walk me through what you check first in a new pull request, and why."
N_GENERATED = 8


@pytest.fixture(scope="module")
def tokens(llama_factory: Any, gemma_model_path: Path) -> list[int]:
    """A 1,284-token chat prompt (the code reviewer's system prompt and a question): longer than
    the window cache, so a read of it wraps the ring."""
    llm = llama_factory(gemma_model_path, n_ctx=N_CTX, swa_cache="window")
    try:
        system = (ROOT / "benchmarks" / "prompts" / "code_reviewer.txt").read_text(encoding="utf-8")
        text = f"<start_of_turn>user\n{system}\n\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
        return [int(t) for t in llm.tokenize(text.encode(), add_bos=True, special=True)]
    finally:
        llm.close()


def _read(llm: Any, tokens: list[int]) -> np.ndarray:
    """Evaluate `tokens` after what the Llama holds; the last token's logits."""
    llm.eval(tokens)
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy()


def _greedy(llm: Any, logits: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    chosen, seen = [], [logits]
    for _ in range(N_GENERATED):
        chosen.append(int(np.argmax(seen[-1])))
        seen.append(_read(llm, chosen[-1:]))
    return chosen, seen


@pytest.mark.parametrize("cut", [1280, 1236, 1152, 1088, 1024, 768])
def test_a_restored_window_reads_on_bit_for_bit_as_a_cold_read(
    make_llama: Any, gemma_model_path: Path, tokens: list[int], cut: int
) -> None:
    cold = make_llama(gemma_model_path, n_ctx=N_CTX, swa_cache="window")
    _read(cold, tokens[:cut])
    cold_logits = _read(cold, tokens[cut:])
    cold_tokens, cold_steps = _greedy(cold, cold_logits)

    warm = make_llama(gemma_model_path, n_ctx=N_CTX, swa_cache="window")
    _read(warm, tokens[:cut])
    captured = capture_sequence(warm)
    key = SnapshotKey.for_tokens(model_fingerprint(warm), "default", captured.tokens)
    restored = make_llama(gemma_model_path, n_ctx=N_CTX, swa_cache="window")
    assert window_cells(restored) == 1024
    assert restore_sequence(restored, Snapshot(key, captured.tokens, captured.state, None), tokens)
    logits = _read(restored, tokens[cut:])
    assert np.array_equal(logits, cold_logits), f"off by {np.abs(logits - cold_logits).max()}"
    restored_tokens, restored_steps = _greedy(restored, logits)
    assert restored_tokens == cold_tokens
    assert all(np.array_equal(a, b) for a, b in zip(restored_steps, cold_steps, strict=True))


@pytest.mark.parametrize(
    ("last", "expected_slots", "first_positions"),
    [
        (511, 512, [0, 1, 2]),  # not wrapped: the cells as read
        (1279, 1024, [1024, 1025, 1026]),  # head 256 < n_swa: every slot, the newest from slot 0
        (1599, 576, [1024, 1025, 1026]),  # head 576 >= n_swa: the slots below the head
    ],
)
def test_the_ring_holds_each_position_where_a_cold_read_leaves_it(
    last: int, expected_slots: int, first_positions: list[int]
) -> None:
    count, positions = ring_cells(last, 1024, 512)
    assert count == expected_slots
    assert list(positions[:3]) == first_positions
    assert all(int(p) % 1024 == slot for slot, p in enumerate(positions))
    assert int(positions.max()) == last
