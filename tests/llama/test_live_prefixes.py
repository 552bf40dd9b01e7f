"""Which free sequence a request takes (`LivePrefixes.choose`): a prompt the store holds gives way
before the only copy of one, whatever the order they were used in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snapcache.llama.batch._context import SequenceContext
from snapcache.llama.batch._live import Held, LivePrefixes
from snapcache.llama.stored.read_grid import ReadGrid

pytestmark = pytest.mark.model


def tokens(start: int, n: int = 300) -> np.ndarray:
    array = (np.arange(n, dtype=np.int32) + start) % 250 + 3
    array.setflags(write=False)
    return array


@pytest.fixture
def live(make_llama: Any, tiny_model_path: Path) -> LivePrefixes:
    context = SequenceContext(make_llama(tiny_model_path, n_ctx=1024), 3)
    return LivePrefixes(context, ReadGrid.of(context.llm, 64), truncates=True)


def test_a_sequence_whose_restore_points_are_stored_gives_way_first(live: LivePrefixes) -> None:
    live.keep(0, Held("a", tokens(0), 0, stored=0, kept=256))  # a save failed: the only copy
    live.keep(1, Held("a", tokens(100), 0, stored=256, kept=256))
    live.keep(2, Held("a", tokens(200), 0, stored=256, kept=256))
    new_prompt = tokens(50)
    assert live.choose([0, 1, 2], "a", new_prompt) == 1  # stored, least recently used
    assert live.choose([0, 2], "a", new_prompt) == 2
    assert live.choose([0], "a", new_prompt) == 0  # the only free one
    # least recently used among the only copies too
    live.keep(1, Held("a", tokens(100), 0, stored=64, kept=256))
    assert live.choose([0, 1], "a", new_prompt) == 0


def test_an_empty_sequence_and_a_shared_prefix_still_come_first(live: LivePrefixes) -> None:
    live.keep(0, Held("a", tokens(0), 0, stored=256, kept=256))
    live.keep(1, Held("a", tokens(100), 0, stored=0, kept=256))
    assert live.choose([0, 1, 2], "a", tokens(50)) == 2  # empty
    assert live.choose([0, 1, 2], "a", tokens(100, 320)) == 1  # holds most of its prompt
    assert live.choose([0, 1], "b", tokens(100, 320)) == 0  # another scope shares nothing
