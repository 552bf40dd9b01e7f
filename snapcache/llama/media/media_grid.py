"""Where a read of a prompt with images may stop and a restore start, bit for bit its cold read.

A cold read of such a prompt reads piece by piece, as mtmd does: each text piece from its own start
in the Llama's batches, each image whole. So a text piece has the read grid of a prompt of its own
(`ReadGrid`, offset to where the piece starts), the last one as a prompt whose end the generation
reads; a piece's start holds, and no point inside an image does. A prompt without images has one
piece from 0: its grid is the Llama's own. `MediaGrid` is a `ReadGrid` (it goes where one goes),
each answer worked out on the Llama's own grid, which it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapcache.llama.media.media_prompt import MediaPrompt
from snapcache.llama.stored.read_grid import ReadGrid

__all__ = ["MediaGrid"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaGrid(ReadGrid):
    """`ReadGrid`'s answers for one `prompt`, piece by piece on the Llama's own grid `inner` (whose
    fields it carries, so that it goes wherever a `ReadGrid` does)."""

    inner: ReadGrid
    prompt: MediaPrompt

    @classmethod
    def over(cls, grid: ReadGrid, prompt: MediaPrompt) -> MediaGrid:
        return cls(
            alignment=grid.alignment,
            n_batch=grid.n_batch,
            n_ubatch=grid.n_ubatch,
            exact=grid.exact,
            min_piece=grid.min_piece,
            inner=grid,
            prompt=prompt,
        )

    @property
    def for_stored(self) -> MediaGrid:
        return MediaGrid.over(self.inner.for_stored, self.prompt)

    def _text_span(self, position: int, n_tokens: int | None) -> tuple[int, int]:
        """(start, length) of the text piece holding `position`, as a prompt of its own."""
        piece = self.prompt.piece_at(position)
        end = piece.end if n_tokens is None or piece.end < n_tokens else n_tokens
        return piece.start, end - piece.start

    def batch_start(self, position: int) -> int:
        start, _ = self._text_span(position, None)
        return start + self.inner.batch_start(position - start)

    def piece_end(self, position: int, n_tokens: int) -> int:
        piece = self.prompt.piece_at(position)
        if piece.image_id is not None:
            return piece.end
        start, length = self._text_span(position, n_tokens)
        return start + self.inner.piece_end(position - start, length)

    def at_most(self, limit: int, n_tokens: int | None = None) -> int:
        """The last point at or before `limit` where a read of the prompt's first `n_tokens` may stop
        (a piece's start, or a point of its text piece's grid)."""
        limit = max(0, min(limit, self.prompt.n_tokens if n_tokens is None else n_tokens))
        outside = self.prompt.at_most(limit)
        if outside != limit:
            return outside  # inside an image: its start
        piece = self.prompt.piece_at(limit)
        if limit <= piece.start or (limit == piece.end and limit < self.prompt.n_tokens):
            return limit  # a piece's start: the cold read starts a batch there
        start, length = self._text_span(limit, n_tokens)
        return start + self.inner.at_most(limit - start, length)
