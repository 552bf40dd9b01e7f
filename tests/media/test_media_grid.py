"""Where a read of a prompt with images may stop (`MediaGrid`): each text piece on the Llama's read
grid from its own start, each image whole. Worked out on a grid like Gemma-3-270M's (4-token
alignment, 16-token pieces, 64-token batches) over a prompt of the tiny vision model's pieces."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp
import pytest
from image_files import picture, png
from tiny_model import write_tiny_vision_model

from snapcache.llama.media import MediaPrompt, Projector
from snapcache.llama.media.media_grid import MediaGrid
from snapcache.llama.stored.read_grid import ReadGrid

pytestmark = pytest.mark.model

GRID = ReadGrid(alignment=4, n_batch=64, n_ubatch=64, min_piece=16)


@pytest.fixture(scope="module")
def prompt(tmp_path_factory: pytest.TempPathFactory, llama_factory: object) -> Iterator[MediaPrompt]:
    model, mmproj = write_tiny_vision_model(tmp_path_factory.mktemp("vision"))
    llm: llama_cpp.Llama = llama_factory(model, n_ctx=1024)  # type: ignore[operator]
    with Projector(llm, mmproj) as projector:
        # A text piece, an image, then text, none starting on a multiple of the alignment but the first.
        yield MediaPrompt(projector, ["x" * 130, projector.decode(png(picture(0))), "y" * 150])
    llm.close()


def test_the_prompt_is_laid_out_as_the_grid_tests_expect(prompt: MediaPrompt) -> None:
    first, image, last = prompt.pieces
    assert (first.image_id, image.image_id is not None, last.image_id) == (None, True, None)
    # the pieces after the first start off the absolute grid
    assert image.start % 4
    assert last.start % 4
    assert last.n_tokens > 2 * GRID.n_batch


def test_no_point_falls_inside_an_image_and_its_ends_hold(prompt: MediaPrompt) -> None:
    grid = MediaGrid.over(GRID, prompt)
    n = prompt.n_tokens
    _, image, _ = prompt.pieces
    inside = (image.start + 1, image.start + 20, image.end - 1)
    assert [grid.at_most(p, n) for p in inside] == [image.start] * 3
    assert grid.holds(image.start, n)
    assert grid.holds(image.end, n)  # the text after the image starts a batch of its own
    assert not grid.holds(image.start + 20, n)
    assert grid.piece_end(image.start, n) == image.end  # an image is read whole


def test_the_text_after_an_image_has_the_grid_of_a_prompt_of_its_own(prompt: MediaPrompt) -> None:
    grid = MediaGrid.over(GRID, prompt)
    n, last = prompt.n_tokens, prompt.pieces[-1]
    start, length = last.start, last.n_tokens
    for limit in range(start, n + 1):
        assert grid.at_most(limit, n) == start + GRID.at_most(limit - start, length), limit
    # Batches from the piece's start, not from position 0 as a prompt without images reads them:
    assert grid.piece_end(start + 5, n) == start + 64
    assert grid.batch_start(n - 1) == start + GRID.batch_start(length - 1) == start + 128
    # and a point the absolute grid gives (a multiple of 4 from 0) is not one of this piece's
    point = start + 40 + (4 - (start + 40) % 4) % 4
    assert GRID.at_most(point, n) == point
    assert grid.at_most(point, n) == start + 40


def test_the_text_before_the_first_image_reads_as_without_images(prompt: MediaPrompt) -> None:
    grid = MediaGrid.over(GRID, prompt)
    first, image, _ = prompt.pieces
    for limit in range(0, first.end):
        assert grid.at_most(limit, prompt.n_tokens) == GRID.at_most(limit, first.n_tokens), limit
    stored = grid.for_stored
    assert isinstance(stored, MediaGrid)
    assert stored.alignment == 1
    assert stored.at_most(image.start + 10, prompt.n_tokens) == image.start
