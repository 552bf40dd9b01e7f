"""The batched sampler's greedy pick: the token llama.cpp's greedy sampler picks, without its chain."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from snapcache.llama.batch._context import Chunk, SequenceContext
from snapcache.llama.batch._sampling import SamplerChain, SamplingParams, first_highest


def test_the_first_of_equal_highest_logits_is_picked() -> None:
    logits = np.array([0.5, 2.0, -1.0, 2.0, 2.0], dtype=np.float32)
    assert first_highest(logits) == 1


def test_infinite_logits_are_ordinary() -> None:
    logits = np.array([-math.inf, -math.inf, 3.0, math.inf, math.inf], dtype=np.float32)
    assert first_highest(logits) == 3


def test_a_nan_logit_leaves_the_pick_to_the_chain() -> None:
    assert first_highest(np.array([0.0, math.nan, 1.0], dtype=np.float32)) is None
    assert first_highest(np.array([math.nan, 0.0, 1.0], dtype=np.float32)) is None


def _llama_greedy(ctx: Any, row: int) -> int:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    try:
        return int(llama_cpp.llama_sampler_sample(chain, ctx, row))
    finally:
        llama_cpp.llama_sampler_free(chain)


@pytest.mark.model
@pytest.mark.parametrize(
    ("params", "fast"),
    [
        (SamplingParams(temperature=0.0), True),
        (SamplingParams(temperature=0.0, repeat_penalty=5.0), False),
        (SamplingParams(temperature=0.0, logit_bias={5: 100.0}), False),
    ],
    ids=["greedy", "repeat penalty", "logit bias"],
)
def test_a_batch_step_picks_what_the_chain_picks(
    make_llama: Any, tiny_model_path: Path, params: SamplingParams, fast: bool
) -> None:
    """Four sequences stepped together for 24 tokens: every pick is llama.cpp's own greedy pick on
    the same logits where nothing else changes them (the fast path); where something does (a
    penalty, a bias), the chain picks, and some picks are not the highest logit's."""
    llm = make_llama(tiny_model_path, n_ctx=512)
    context = SequenceContext(llm, 4)
    samplers = [SamplerChain(params, llm) for _ in range(4)]
    try:
        assert samplers[0]._argmax is fast
        prompts = [
            llm.tokenize(f"Question {i}: {'the quick brown fox ' * (2 + i)}?".encode()) for i in range(4)
        ]
        code, rows = context.decode([Chunk(i, p, 0, True) for i, p in enumerate(prompts)])
        assert code == 0
        positions = [len(p) for p in prompts]
        differing = 0
        for _ in range(24):
            highest = [_llama_greedy(context.ctx, row) for row in rows]
            picks = [s.sample(context.ctx, row) for s, row in zip(samplers, rows, strict=True)]
            differing += sum(a != b for a, b in zip(picks, highest, strict=True))
            code, rows = context.decode([Chunk(i, [t], positions[i], True) for i, t in enumerate(picks)])
            assert code == 0
            positions = [n + 1 for n in positions]
        assert (differing == 0) is fast
    finally:
        for sampler in samplers:
            sampler.close()
        context.close()
