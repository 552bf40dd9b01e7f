"""A sequence copied from another and cut back reads on as a cold read (`SequenceContext.copy`).

On the tiny sliding-window model (gemma2, a 48-token window) with a window-sized cache: a state copy
holds only the window of the source's last token, so a copy that is to be cut further back is
llama.cpp's own sequence copy, every cell of the stream, whose tensors llama.cpp copies at the next
decode. Until then a read or a write of either sequence's state first lets it copy them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from tiny_model import write_tiny_model

from snapcache.llama.batch._context import Chunk, SequenceContext

pytestmark = pytest.mark.model

PROMPT, CUT, END = 300, 200, 260  # a prompt read; another shares CUT tokens of it, then its own


@pytest.fixture(scope="module")
def window_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("gemma2") / "tiny-gemma2.gguf", "gemma2")


@pytest.fixture
def context(make_llama: Any, window_model: Path) -> Iterator[SequenceContext]:
    llm = make_llama(window_model, n_ctx=1024, swa_cache="window")
    made = SequenceContext(llm, 3)
    assert made.window_cells > 0  # a window-sized cache: what a state copy cannot cut back
    yield made
    made.close()


def tokens(start: int, n: int) -> list[int]:
    return [int(t) for t in (np.arange(n) + start) % 200 + 3]


FIRST = tokens(0, PROMPT)
SECOND = FIRST[:CUT] + tokens(1000, END - CUT)


def read(context: SequenceContext, seq_id: int, prompt: list[int], start: int = 0) -> np.ndarray:
    code, rows = context.decode([Chunk(seq_id, prompt[start:], start, True)])
    assert code == 0
    logits = llama_cpp.llama_get_logits_ith(context.ctx, rows[0])
    return np.ctypeslib.as_array(logits, shape=(int(context.llm.n_vocab()),)).copy()


def cold(context: SequenceContext, seq_id: int) -> np.ndarray:
    logits = read(context, seq_id, SECOND)
    context.clear(seq_id)
    return logits


def test_a_copy_cut_back_past_the_window_reads_on_as_cold(context: SequenceContext) -> None:
    expected = cold(context, 2)
    read(context, 0, FIRST)
    assert context.copy(0, 1, cut_to=CUT)
    assert context.can_cut(1, CUT)
    assert context.cut(1, CUT)
    assert np.array_equal(read(context, 1, SECOND, CUT), expected)


def test_a_state_copy_holds_only_the_window_and_cannot_be_cut_back(context: SequenceContext) -> None:
    read(context, 0, FIRST)
    assert context.copy(0, 1)  # not to be cut: a state copy, of the cells in use
    assert context.last_position(1) == PROMPT - 1
    assert not context.cut(1, CUT)  # the cells below the window are padding


def test_a_state_written_before_the_next_decode_waits_for_the_copy(context: SequenceContext) -> None:
    expected = cold(context, 2)
    read(context, 0, FIRST)
    read(context, 2, tokens(500, PROMPT))
    assert context.copy(0, 1, cut_to=CUT)  # the tensors follow at the next decode
    assert context.copy(2, 0)  # a state copy over the source first: the copy takes the source's own
    assert context.cut(1, CUT)
    assert np.array_equal(read(context, 1, SECOND, CUT), expected)


def test_a_state_read_before_the_next_decode_is_the_copied_one(context: SequenceContext) -> None:
    read(context, 0, FIRST)
    assert context.copy(0, 1, cut_to=CUT)
    source = context.capture(0, np.asarray(FIRST, dtype=np.int32))
    copied = context.capture(1, np.asarray(FIRST, dtype=np.int32))
    # The same blob but for the sequence id (0 and 1) in its header and its cells' metadata.
    before, after = np.frombuffer(source.state, np.uint8), np.frombuffer(copied.state, np.uint8)
    assert before.shape == after.shape
    differ = np.flatnonzero(before != after)
    assert 0 < len(differ) <= 1 + PROMPT * 2  # the header, and a cell's id in each of two caches
    assert np.all(before[differ] == 0)
    assert np.all(after[differ] == 1)
    assert context.last_position(1) == PROMPT - 1  # the copy's cells as they were
