"""Where a completion saves states on its way through a prompt, so later prompts can start there.

They sit at multiples of 64 tokens: llama.cpp's CPU kernels read a batch of tokens in blocks of four
rows, so a prompt read on from an aligned checkpoint gives bit-for-bit the results of a cold read.

- chat completions: the end of the leading system messages (see `chat_prefix`), and the end of the
  prompt, just before the reply: the next turn of the same chat starts with it;
- raw completions: a ladder of prefix lengths (with `prefix_reuse=0.9`: every 64 tokens up to 1152,
  then the largest multiple of 64 at most 1/0.9 times the one before: 1280, 1408, ..., 1792, 1984,
  ...), so that a later prompt sharing L tokens with this one restores at least 90% of them once
  L >= 640, and all but 63 before. Sliding-window models (Gemma 3) cannot cut a restored state back,
  so the ladder is stored. Ladder states are saved one priority lower than the others, so that they
  are evicted first.
"""

from __future__ import annotations

import numpy as np

from snapcache.key import TokenArray
from snapcache.snapshot import MAX_PRIORITY

__all__ = ["CHECKPOINT_ALIGN", "align_down", "checkpoint_plan", "ladder_points"]

CHECKPOINT_ALIGN = 64


def checkpoint_plan(
    tokens: TokenArray, *, ladder: list[int], chat_prefix: TokenArray | None, priority: int, after: int
) -> list[tuple[int, int]]:
    """(prefix length, priority) to save on the way through `tokens`, ascending, all past `after`
    and short of the last token; ladder points go one priority lower."""
    n = len(tokens)
    lower = max(-MAX_PRIORITY, priority - 1)
    points = {p: lower for p in ladder if p < n - 1}
    points[align_down(n - 1)] = priority
    if (
        chat_prefix is not None
        and len(chat_prefix) < n
        and np.array_equal(tokens[: len(chat_prefix)], chat_prefix)
    ):
        points[len(chat_prefix)] = priority
    return sorted((p, point_priority) for p, point_priority in points.items() if p > after)


def ladder_points(step: int, reuse: float, limit: int) -> list[int]:
    """Multiples of `step` below `limit`, each the largest at most 1/reuse times the one before.

    Any length L has a point p <= L with p >= reuse * L or p > L - step: a later prompt sharing L
    tokens restores at least `reuse` of them once L >= step / (1 - reuse), and all but `step` before.
    """
    points = []
    point = step
    while point < limit:
        points.append(point)
        point = max(point + step, int(point / reuse) // step * step)
    return points


def align_down(n_tokens: int) -> int:
    return n_tokens // CHECKPOINT_ALIGN * CHECKPOINT_ALIGN
