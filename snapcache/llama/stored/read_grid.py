"""Where a read may stop and read on, and in which batches, so that it stays a cold read bit for bit.

A cold read sends a prompt to llama.cpp as llama-cpp-python's `eval` does: `n_batch` tokens at a
time from position 0, which llama.cpp splits into ubatches of `n_ubatch`. On a CPU build two things
about a batch change its results in the last bits (Gemma-3-270M Q4_K_M, 2026-11-29,
`tests/llama/test_read_grid.py`):

- where its rows start: the quantized kernels group them (by 4 there: the split alignment, which
  `alignment` measures);
- how many there are: a batch of under 8 tokens goes through other kernels than the same tokens
  inside a longer one (llamafile's sgemm takes no batch of one token, for one). Restored 4 to 7
  tokens before a prompt's end, the last logits differed from a cold read's at most points, on the
  64-token grid too; from 8 on, never. And a cold read whose last batch is short (a prompt of
  512 + 6 tokens) is matched only by a read that sends those tokens alone too.

So a read goes on in the cold read's batches (`piece_end`: it stops at every boundary of theirs),
and a point where a read stops and a restore starts (`holds`) is a boundary, or lies on the
alignment inside a batch and `MIN_PIECE_TOKENS` or more from both of its ends: the pieces on both
sides are then batches long enough to read as the cold batch does. A prompt restored whole reads
its last token again alone, a batch of one. Models whose splits hold anywhere (alignment 1: f32
weights, whose kernels group no rows) keep pieces of any length, as they always restored (token
for token cold in every test, a prompt restored whole included); the probe does not measure it.
Without exactness (`exact=False`) every token is a point and batches are what they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp

__all__ = ["MIN_PIECE_TOKENS", "ReadGrid"]

# The fewest tokens a piece of a cold batch is read in: the alignment probe reads a last batch of
# 16 (see `alignment`); 8 was the shortest measured exact.
MIN_PIECE_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ReadGrid:
    """The cold read's batches of one Llama (`n_batch`, `n_ubatch`), its split `alignment` and the
    fewest tokens a piece of a batch is read in (`min_piece`)."""

    alignment: int
    n_batch: int
    n_ubatch: int
    exact: bool = True
    min_piece: int = MIN_PIECE_TOKENS

    @classmethod
    def of(cls, llm: llama_cpp.Llama, alignment: int, *, exact: bool = True) -> ReadGrid:
        n_batch = int(llm.n_batch)
        n_ubatch = min(n_batch, int(llm.context_params.n_ubatch) or n_batch)
        return cls(alignment, n_batch, n_ubatch, exact, 1 if alignment == 1 else MIN_PIECE_TOKENS)

    @property
    def for_stored(self) -> ReadGrid:
        """This grid for points the store holds: any alignment (the Llama that saved one split on
        its own measured alignment, which the fingerprint they share makes this one's), the same
        batches and pieces (a prompt's length and the reading Llama's batch sizes decide those)."""
        return ReadGrid(1, self.n_batch, self.n_ubatch, self.exact, self.min_piece)

    def batch_start(self, position: int) -> int:
        """Where the cold batch holding the token at `position` starts."""
        return position - (position % self.n_batch) % self.n_ubatch

    def piece_end(self, position: int, n_tokens: int) -> int:
        """Where a read of `n_tokens` tokens that is at `position` stops next: the end of the cold
        batch there (at most `n_batch` tokens on without exactness)."""
        if not self.exact:
            return min(n_tokens, position + self.n_batch)
        return min(n_tokens, self._batch_end(self.batch_start(position)))

    def holds(self, point: int, n_tokens: int | None = None) -> bool:
        """Whether a read of a prompt of `n_tokens` (None: of one longer than `point` by a batch or
        more) may stop at `point` and a restore start there, bit for bit a cold read."""
        return point >= 0 and self.at_most(point, n_tokens) == point

    def at_most(self, limit: int, n_tokens: int | None = None) -> int:
        """The last point at or before `limit` where a read of a prompt of `n_tokens` (None: of one
        longer by a batch or more) may stop and a restore start (see the module docstring)."""
        point = max(0, limit if n_tokens is None else min(limit, n_tokens))
        if not self.exact:
            return point
        if point == n_tokens:
            if self.min_piece <= 1:
                return point
            point -= 1  # restored whole, a prompt's last token is read again alone
        start = self.batch_start(point)
        if point == start:
            return point
        end = self._batch_end(start)
        if n_tokens is not None:
            end = min(end, n_tokens)
        highest = min(point, end - self.min_piece)
        highest -= (highest - start) % self.alignment
        return highest if highest - start >= self.min_piece else start

    def _batch_end(self, start: int) -> int:
        """Where the cold batch that starts at `start` ends, in a prompt long enough."""
        return start + min(self.n_ubatch, self.n_batch - start % self.n_batch)
