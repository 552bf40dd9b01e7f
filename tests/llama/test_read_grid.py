"""Where a read may stop and a restore start (`ReadGrid`): on the split alignment, clear of both ends of
a cold read's batch, and reads going on in the cold read's batches.

The first tests check the rule itself; the Gemma tests check that a read on its points and in its
batches is bit for bit a cold read, and a restored completion token for token a cold one. (What the
rule rests on, measured: docs/reference/exactness.md.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.stored.read_grid import MIN_PIECE_TOKENS, ReadGrid

GRID = ReadGrid(alignment=4, n_batch=512, n_ubatch=512)


def test_reads_go_on_in_the_cold_reads_batches() -> None:
    assert [GRID.piece_end(p, 1300) for p in (0, 100, 511, 512, 1024)] == [512, 512, 512, 1024, 1300]
    smaller = ReadGrid(4, n_batch=300, n_ubatch=128)  # llama.cpp splits each batch of 300 by 128
    ends, position = [], 0
    while position < 700:
        position = smaller.piece_end(position, 700)
        ends.append(position)
    assert ends == [128, 256, 300, 428, 556, 600, 700]


def test_a_point_leaves_both_sides_of_it_a_batch_long_enough() -> None:
    # The end of a prompt: at least MIN_PIECE_TOKENS left to read with its last token.
    assert GRID.at_most(199, 200) == 184
    assert not GRID.holds(196, 200)  # the tool call that came back shorter than cold was restored here
    assert GRID.holds(184, 200)
    # Near a batch's ends: not in its first or last tokens, which would be read as a batch of their own.
    assert GRID.at_most(1023, 2000) == 1024 - MIN_PIECE_TOKENS
    assert GRID.at_most(520, 2000) == 512
    # A cold read whose last batch is short (512 + 6 tokens): nothing inside it, its start holds.
    assert GRID.at_most(517, 518) == 512
    assert GRID.holds(512, 518)
    # On the alignment counted from the batch's start.
    assert GRID.at_most(535, 2000) == 532
    # A prompt not yet known (warm): a point a longer prompt can restore from.
    assert GRID.at_most(1020) == 1008


def test_without_exactness_every_token_is_a_point() -> None:
    loose = ReadGrid(1, 512, 512, exact=False)
    assert [loose.at_most(p, 600) for p in (1, 517, 599, 700)] == [1, 517, 599, 600]
    assert loose.piece_end(100, 2000) == 612


@given(
    alignment=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    n_batch=st.integers(16, 700),
    n_ubatch=st.integers(16, 700),
    n_tokens=st.integers(1, 1500),
    limit=st.integers(0, 1500),
)
def test_at_most_is_the_last_point_that_holds(
    alignment: int, n_batch: int, n_ubatch: int, n_tokens: int, limit: int
) -> None:
    grid = ReadGrid(alignment, n_batch, min(n_batch, n_ubatch))
    point = grid.at_most(limit, n_tokens)
    assert 0 <= point <= min(limit, n_tokens)
    assert grid.holds(point, n_tokens)
    assert not any(grid.holds(later, n_tokens) for later in range(point + 1, min(limit, n_tokens) + 1))
    start = grid.batch_start(point)
    if point != start:  # inside a batch: on the alignment, and a piece long enough on both sides
        assert (point - start) % alignment == 0
        assert point - start >= MIN_PIECE_TOKENS
        assert grid.piece_end(point, n_tokens) - point >= MIN_PIECE_TOKENS
    assert point < n_tokens or n_tokens == 0  # restored whole, the last token would be read alone


# The measured premise, and restores on the grid against cold, on Gemma-3-270M Q4_K_M.

N_CTX = 2048
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 12}
TEXT = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
# The text the measurements of 2026-11-29 read (the alignment probe's).
MEASURED = (
    "A careful assistant reads the whole request before it acts. It names the files it will touch, "
    "asks before it deletes anything, and reports what it did in one or two plain sentences. "
) * 40


def last_logits(llm: Any, pieces: list[list[int]]) -> np.ndarray:
    llm.reset()
    for piece in pieces:
        llm.eval(piece)
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy()


@pytest.mark.model
@pytest.mark.gemma
def test_a_read_on_in_the_cold_reads_batches_is_bit_for_bit_cold(make_llama, gemma_model_path) -> None:
    llm = make_llama(gemma_model_path, n_ctx=N_CTX)
    tokens = llm.tokenize(MEASURED.encode())
    # A cold read of 512 + 6 tokens sends the last 6 alone; a restore at 448 reads them so too. (On
    # the 2-core Xeon of 2026-11-29, reading the 70 tokens after 448 in one batch parted from cold,
    # as did 4 to 7 tokens left after a split at most points: which kernels a short batch takes
    # depends on the CPU, so the rule is kept everywhere and only its result is checked here.)
    cold = last_logits(llm, [tokens[:518]])
    grid = ReadGrid.of(llm, 4)
    assert grid.holds(448, 518)
    assert not grid.holds(512 - 4, 518)  # 4 tokens before the short batch
    pieces, position = [tokens[:448]], 448
    while position < 518:
        end = grid.piece_end(position, 518)
        pieces.append(tokens[position:end])
        position = end
    assert [len(piece) for piece in pieces] == [448, 64, 6]
    assert np.array_equal(last_logits(llm, pieces), cold)


@pytest.mark.model
@pytest.mark.gemma
@pytest.mark.slow
@pytest.mark.parametrize(
    ("shared", "n_tokens"),
    [
        (128, 132),  # a question of 4 tokens after a restore point: restored 16 or more before the end
        (448, 518),  # a cold read whose last batch is 6 tokens
        (500, 700),  # shared up to 12 tokens before a batch's end
    ],
)
def test_a_completion_restored_on_the_grid_is_token_for_token_cold(
    make_llama, gemma_model_path, store, shared: int, n_tokens: int
) -> None:
    cold = make_llama(gemma_model_path, n_ctx=N_CTX)
    tokens = cold.tokenize(TEXT.encode())
    other = cold.tokenize(b"A different ending, about something else entirely, " * 40, add_bos=False)
    first = tokens[:shared] + other[: n_tokens - shared]
    prompt = tokens[:n_tokens]
    expected = cold.create_completion(prompt, **GREEDY)["choices"][0]["text"]

    cached = CachedLlama(make_llama(gemma_model_path, n_ctx=N_CTX), store)
    cached.create_completion(first, **GREEDY)  # leaves points, and its context, sharing `shared` tokens
    assert cached.create_completion(prompt, **GREEDY)["choices"][0]["text"] == expected
    info = cached.last_restore
    assert info.restored_tokens > 0
    assert ReadGrid.of(cached.llm, cached.alignment).holds(info.restored_tokens, n_tokens)

    fresh = CachedLlama(make_llama(gemma_model_path, n_ctx=N_CTX), store)  # from the store alone
    assert fresh.create_completion(prompt, **GREEDY)["choices"][0]["text"] == expected
