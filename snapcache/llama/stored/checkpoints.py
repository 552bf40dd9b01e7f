"""Where a completion saves restore points (records, see `blocks`) on its way through a prompt.

They sit at multiples of the model's measured split alignment (see `alignment`: 4 tokens for
Gemma-3-270M Q4_K_M on a CPU build, 1 for f32 weights, at most 64; sliding-window models keep 64),
clear of the ends of the cold read's batches (`read_grid`), where a prompt read on from a point
gives bit-for-bit the results of a cold read.

- chat completions: the end of the head every conversation of an agent shares (its system messages
  and its tools as the template renders them, see `chat_prefix`), and near the end of the prompt
  (16 to 16 + alignment - 1 tokens before the reply, 32 to 63 on a 32 grid; on the reading
  Llama's grid, `read_grid`, 16 to 79 on the 64 grid): the next turn of the same chat starts with
  it. The prompt end is a record of kind `KIND_PROMPT_END`, which that next turn supersedes; the
  head is `KIND_PREFIX` and is never superseded, also where both fall on one point (a short
  question after a long head);
- raw completions on sliding-window models: a sparse ladder along the prompt (`ladder_points`, cut
  to multiples of the window length), since such a model restores only where a window was stored.
  Models with one cache need no ladder: every 64-token block of a prompt is stored, and any run of
  them restores. Ladder points go one priority lower than the others, so that they are evicted first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from snapcache.key import TokenArray
from snapcache.llama.state.blocks import KIND_PREFIX, KIND_PROMPT_END
from snapcache.llama.stored.read_grid import ReadGrid
from snapcache.snapshot import MAX_PRIORITY

__all__ = [
    "CHECKPOINT_ALIGN",
    "DEFAULT_PREFIX_REUSE",
    "FINAL_TAIL_TOKENS",
    "MIN_PREFIX_TOKENS",
    "RestorePoint",
    "align_down",
    "checkpoint_plan",
    "final_point",
    "head_point",
    "ladder_points",
    "window_ladder",
]

# The ladder's grid, and the coarsest alignment a model can measure.
CHECKPOINT_ALIGN = 64
# A later raw prompt sharing L tokens of an earlier one restores at least this share of them.
DEFAULT_PREFIX_REUSE = 0.9
# A shorter prefix is not worth a snapshot.
MIN_PREFIX_TOKENS = 64
# The checkpoint at the end of a prompt leaves at least this many tokens to read with the prompt's
# last token: a batch of a token or two can go through other kernels than the same tokens in a
# longer batch (measured: a 1-token batch on f32 weights), and the alignment probe reads tails of
# 16 to 63 tokens: 16 for every alignment of 16 or finer, the alignment itself for 32 (`final_point`).
# It was 32 for all until 2026-11-29: each next turn of a chat read 16 tokens more than the probe asks.
FINAL_TAIL_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RestorePoint:
    """Where a saved capture can be restored: after `n_tokens`, at `priority`, of a record `kind`;
    `head`: a point of a chat's head (its end, or a piece of a batch before it), kept however close
    to another (`PrefixCache.plan`)."""

    n_tokens: int
    priority: int
    kind: int
    head: bool = field(default=False, compare=False)


def checkpoint_plan(
    tokens: TokenArray,
    *,
    ladder: list[int],
    head: int,
    priority: int,
    after: int,
    alignment: int = CHECKPOINT_ALIGN,
    exact: bool = True,
    grid: ReadGrid | None = None,
) -> list[RestorePoint]:
    """The restore points to save on the way through `tokens`, ascending, all past `after` and short
    of the last token, on multiples of `alignment`; ladder points go one priority lower. `head` is
    where the chat's shared head ends (`head_point`; 0: none): a point of `KIND_PREFIX`, whatever
    else falls there, and, a piece of a batch before it, another one priority lower (for a question
    too short to read on from the head); the prompt's end is `KIND_PROMPT_END` unless it is the head.
    `exact=False` puts the prompt's end point one token before its end (see `final_point`). `grid`:
    the reading Llama's batches; each point goes back to the last one where a read may stop on them
    (`ReadGrid.at_most`)."""
    n = len(tokens)

    def placed(point: int) -> int:
        return point if grid is None else grid.at_most(point, n)

    lower = max(-MAX_PRIORITY, priority - 1)
    points = {at: RestorePoint(at, lower, KIND_PREFIX) for at in (placed(p) for p in ladder if p < n - 1)}
    # A finer grid leaves a tail of 16 or more (see FINAL_TAIL_TOKENS); on the coarsest the tail is
    # 1 to 64 tokens, and the reading Llama's `grid` moves it to 16 or more (see `read_grid`).
    end = placed(final_point(n, alignment, exact=exact))
    points[end] = RestorePoint(end, priority, KIND_PROMPT_END)
    if head:
        at = placed(head)
        points[at] = RestorePoint(at, priority, KIND_PREFIX, head=True)
        # A question shorter than a piece of a batch cannot restore the head and read on from it
        # (`ReadGrid`): the last point a piece before the head is its place.
        if grid is not None and grid.min_piece > 1:
            short = placed(head - grid.min_piece)
            if short >= MIN_PREFIX_TOKENS and short not in points:
                points[short] = RestorePoint(short, lower, KIND_PREFIX, head=True)
    return [point for at, point in sorted(points.items()) if at > after]


def head_point(
    tokens: TokenArray,
    chat_prefix: TokenArray | None,
    alignment: int = CHECKPOINT_ALIGN,
    grid: ReadGrid | None = None,
) -> int:
    """Where the head `tokens` shares with every chat starting like it (`chat_prefix`) ends, cut to
    `alignment` (to the last point of `grid` there, where given): as far as `tokens` shares it; 0
    where that is under `MIN_PREFIX_TOKENS` or not short of the prompt's end."""
    if chat_prefix is None:
        return 0
    n = len(tokens)
    m = min(len(chat_prefix), n)
    differ = np.flatnonzero(tokens[:m] != chat_prefix[:m])
    cut = align_down(int(differ[0]) if len(differ) else m, alignment)
    if grid is not None:
        cut = grid.at_most(cut, n)
    return cut if MIN_PREFIX_TOKENS <= cut < n else 0


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


def window_ladder(n_swa: int, n_ctx: int, prefix_reuse: float | None) -> list[int]:
    """The ladder points (`ladder_points`) of a raw prompt of up to `n_ctx` tokens on a model whose
    sliding window is `n_swa` tokens (0: none, a recurrent state), each on a multiple of the window
    rounded up to the grid (a point stores a whole window); none where `prefix_reuse` is None."""
    if prefix_reuse is None:
        return []
    step = max(CHECKPOINT_ALIGN, -(-n_swa // CHECKPOINT_ALIGN) * CHECKPOINT_ALIGN)
    return [p for p in ladder_points(CHECKPOINT_ALIGN, prefix_reuse, n_ctx) if p % step == 0]


def final_point(n_tokens: int, alignment: int, *, exact: bool = True) -> int:
    """The checkpoint near the end of a prompt of `n_tokens` (see `checkpoint_plan`); without
    `exact`, every token but the last (which a completion reads again for its logits)."""
    tail = 1 if alignment >= CHECKPOINT_ALIGN or not exact else max(FINAL_TAIL_TOKENS, alignment)
    return align_down(n_tokens - tail, alignment)


def align_down(n_tokens: int, alignment: int = CHECKPOINT_ALIGN) -> int:
    return n_tokens // alignment * alignment
