"""Where a prompt leaves restore points, and which of them a later turn of its conversation may replace."""

from __future__ import annotations

import numpy as np
import pytest

from snapcache.key import SnapshotKey, as_token_array
from snapcache.llama.state.blocks import KIND_PREFIX, KIND_PROMPT_END
from snapcache.llama.stored.checkpoints import (
    CHECKPOINT_ALIGN,
    RestorePoint,
    checkpoint_plan,
    final_point,
    head_point,
)
from snapcache.llama.stored.read_grid import ReadGrid
from snapcache.llama.stored.stored_states import StoredStates
from snapcache.store import SnapshotStore

FINGERPRINT = "f" * 64


def tokens(n: int, start: int = 0) -> np.ndarray:
    return as_token_array(list(range(start, start + n)))


def plan(
    prompt: np.ndarray, head: np.ndarray | None, *, after: int = 0, alignment: int = 64
) -> list[RestorePoint]:
    at = head_point(prompt, head, alignment)
    return checkpoint_plan(prompt, ladder=[], head=at, priority=3, after=after, alignment=alignment)


def test_a_head_that_ends_where_the_prompt_end_point_falls_is_a_prefix_not_a_prompt_end() -> None:
    # 1,715 tokens after a head of 1,690 (a short question): both points are 1,664 on the 64 grid.
    prompt = tokens(1715)
    assert plan(prompt, prompt[:1690]) == [RestorePoint(1664, 3, KIND_PREFIX)]


def test_a_head_and_a_prompt_end_apart_are_one_of_each() -> None:
    prompt = tokens(1804)
    assert plan(prompt, prompt[:1690]) == [
        RestorePoint(1664, 3, KIND_PREFIX),
        RestorePoint(1792, 3, KIND_PROMPT_END),
    ]


def test_without_a_head_the_prompt_end_is_the_only_point() -> None:
    assert plan(tokens(1715), None) == [RestorePoint(1664, 3, KIND_PROMPT_END)]


def test_a_head_on_a_fine_grid_ends_where_it_ends() -> None:
    prompt = tokens(500)
    assert head_point(prompt, prompt[:421], alignment=1) == 421
    assert plan(prompt, prompt[:421], alignment=4) == [
        RestorePoint(420, 3, KIND_PREFIX),
        RestorePoint(484, 3, KIND_PROMPT_END),  # 16 tokens and more before the end: FINAL_TAIL_TOKENS
    ]


def test_a_head_on_the_read_grid_has_a_point_a_piece_before_it_for_short_questions() -> None:
    # Gemma's 4-token grid: a question of under 16 tokens after the head cannot restore the head
    # (the piece read after it would be too short), so the first read leaves a point 16 before it.
    grid = ReadGrid(4, 512, 512)
    prompt = tokens(113)
    at = head_point(prompt, prompt[:96], 4, grid)
    points = checkpoint_plan(prompt, ladder=[], head=at, priority=3, after=0, alignment=4, grid=grid)
    assert points == [RestorePoint(80, 2, KIND_PREFIX), RestorePoint(96, 3, KIND_PREFIX)]
    assert all(point.head for point in points)  # both kept however close (`PrefixCache.plan`)
    # f32 weights (a piece of any length) and heads under 64 + 16 tokens have none.
    fine = ReadGrid(1, 512, 512, min_piece=1)
    f32 = checkpoint_plan(prompt, ladder=[], head=96, priority=3, after=0, alignment=1, grid=fine)
    assert [p.n_tokens for p in f32] == [96, 97]  # the head, the prompt's end
    short = checkpoint_plan(prompt, ladder=[], head=76, priority=3, after=0, alignment=4, grid=grid)
    assert [p.n_tokens for p in short] == [76, 96]


def test_the_prompt_end_leaves_the_shortest_tail_the_probe_checked_for_its_grid() -> None:
    # The probe reads last batches of 16 tokens for alignments up to 16, of 32 for 32.
    assert [500 - final_point(500, alignment) for alignment in (1, 4, 16, 32, 64)] == [16, 16, 20, 52, 52]
    assert final_point(500, 1, exact=False) == 499  # inexact: all but the last token


@pytest.mark.parametrize(
    ("shared", "expected"),
    [(1690, 1664), (63, 0), (CHECKPOINT_ALIGN, CHECKPOINT_ALIGN)],
    ids=["a long head", "too short to keep", "one block"],
)
def test_the_head_point_is_as_far_as_the_prompt_shares_the_head_on_the_grid(
    shared: int, expected: int
) -> None:
    prompt = tokens(1715)
    head = np.concatenate([prompt[:shared], tokens(40, start=10_000)])  # parts from the prompt there
    assert head_point(prompt, head) == expected


def test_a_head_as_long_as_the_prompt_is_no_point() -> None:
    prompt = tokens(128)
    assert head_point(prompt, tokens(200)) == 0


def test_points_restored_already_are_not_planned_again() -> None:
    prompt = tokens(1804)
    assert plan(prompt, prompt[:1690], after=1664) == [RestorePoint(1792, 3, KIND_PROMPT_END)]


def test_a_later_turn_never_supersedes_a_prompt_end_at_its_conversations_head() -> None:
    turn = tokens(1804)
    with SnapshotStore(None, ram_bytes=1 << 20) as store:
        states = StoredStates(store, FINGERPRINT)
        old = SnapshotKey.for_tokens(FINGERPRINT, "agents", turn[:1664])
        store.put(old, turn[:1664], b"a state stored before the head was a prefix of its own", priority=3)

        assert not states.supersede(old, turn[:1792], 3, head=1664)
        assert store.get(old) is not None
        assert states.supersede(old, turn[:1792], 3, head=1600)  # past the head: the turn's own end
        assert store.get(old) is None
