"""Prompts of text and images through mtmd, on the tiny vision model the suite writes
(`tiny_model.write_tiny_vision_model`): images keyed by their pixels, key tokens that fold each image
in at its place, and a prompt read on from a restored prefix as a cold read reads it."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest
from image_files import bmp, picture, png
from tiny_model import N_VOCAB, VISION_IMAGE_TOKENS, write_tiny_vision_model

from snapcache.errors import InvalidArgument, ModelError
from snapcache.llama.media import IMAGE_KEY_BASE, ImageError, MediaPrompt, Projector

pytestmark = pytest.mark.model

N_BATCH = 32  # smaller than an image, so that images and text are read in several batches


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_vision_model(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def llm(vision_model: tuple[Path, Path], llama_factory: object) -> Iterator[llama_cpp.Llama]:
    made = llama_factory(vision_model[0], n_ctx=1024, n_batch=N_BATCH, n_ubatch=N_BATCH)  # type: ignore[operator]
    yield made
    made.close()


@pytest.fixture(scope="module")
def projector(llm: llama_cpp.Llama, vision_model: tuple[Path, Path]) -> Iterator[Projector]:
    with Projector(llm, vision_model[1]) as loaded:
        yield loaded


def test_a_prompt_splits_into_text_and_image_pieces(projector: Projector, llm: llama_cpp.Llama) -> None:
    image = projector.decode(png(picture(0)))
    prompt = MediaPrompt(projector, ["Look at this: ", image, " What is it?"])
    kinds = [(piece.image_id is None, piece.n_tokens) for piece in prompt.pieces]
    assert [text for text, _ in kinds] == [True, False, True]
    assert kinds[1][1] == VISION_IMAGE_TOKENS
    assert [p.start for p in prompt.pieces] == [0, kinds[0][1], kinds[0][1] + VISION_IMAGE_TOKENS]
    first, _, last = prompt.pieces
    # The text pieces are the model's own tokens; the image's key tokens lie above any vocabulary.
    assert list(prompt.key_tokens[: first.end]) == llm.tokenize(b"Look at this: ", add_bos=True, special=True)
    assert list(prompt.key_tokens[last.start :]) == llm.tokenize(b" What is it?", add_bos=False, special=True)
    image_keys = prompt.key_tokens[first.end : last.start]
    assert image_keys.min() >= IMAGE_KEY_BASE > N_VOCAB
    assert len(set(image_keys.tolist())) == VISION_IMAGE_TOKENS


def test_the_same_pixels_are_one_image_in_any_file_format(projector: Projector) -> None:
    pixels = picture(1)
    as_png, as_bmp = projector.decode(png(pixels)), projector.decode(bmp(pixels))
    assert as_png.id == as_bmp.id
    assert (as_png.width, as_png.height) == (pixels.shape[1], pixels.shape[0])
    first = MediaPrompt(projector, ["Before ", as_png, " after"])
    second = MediaPrompt(projector, ["Before ", as_bmp, " after"])
    np.testing.assert_array_equal(first.key_tokens, second.key_tokens)


def test_other_pixels_part_from_a_prompt_where_their_image_starts(projector: Projector) -> None:
    pixels = picture(2)
    changed = pixels.copy()
    changed[-1, -1, 0] ^= 1  # one channel of one pixel
    one = MediaPrompt(projector, ["Same text ", projector.decode(png(pixels)), " same text"])
    other = MediaPrompt(projector, ["Same text ", projector.decode(png(changed)), " same text"])
    differ = np.flatnonzero(one.key_tokens != other.key_tokens)
    assert differ[0] == one.pieces[1].start


def test_another_projector_keys_the_same_pixels_otherwise(
    projector: Projector, llm: llama_cpp.Llama, tmp_path: Path
) -> None:
    _, other_path = write_tiny_vision_model(tmp_path, seed=1)
    pixels = png(picture(9))
    with Projector(llm, other_path) as other:
        mine = MediaPrompt(projector, ["Text first ", projector.decode(pixels), " after"])
        theirs = MediaPrompt(other, ["Text first ", other.decode(pixels), " after"])
    image = mine.pieces[1]
    assert mine.pieces == theirs.pieces  # the same pixels, so the same image id and length
    differ = np.flatnonzero(mine.key_tokens != theirs.key_tokens)
    assert differ[0] == image.start  # the text before it keys as it does without images
    np.testing.assert_array_equal(mine.key_tokens[image.end :], theirs.key_tokens[image.end :])


def test_no_restore_point_falls_inside_an_image(projector: Projector) -> None:
    prompt = MediaPrompt(projector, ["A ", projector.decode(png(picture(3))), " and then some more text"])
    image = prompt.pieces[1]
    assert prompt.at_most(image.start + 1) == image.start
    assert prompt.at_most(image.end - 1) == image.start
    assert prompt.at_most(image.end) == image.end
    assert prompt.at_most(image.end + 3) == image.end + 3
    assert prompt.at_most(image.start) == image.start


def two_images(projector: Projector, texts: tuple[str, str, str], first: bytes, second: bytes) -> MediaPrompt:
    """A prompt of text, the image `first`, text, the image `second`, then text."""
    images = [projector.decode(first), projector.decode(second)]
    return MediaPrompt(projector, [texts[0], images[0], texts[1], images[1], texts[2]])


STORED_TEXTS = ("First: ", " then: ", " Why?")


def _logits(ctx: llama_cpp.llama_context_p) -> npt.NDArray[np.float32]:
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(N_VOCAB,)).copy()


def _greedy(ctx: llama_cpp.llama_context_p, n_past: int, n: int) -> list[int]:
    """n greedy tokens after a prompt of n_past positions whose logits the context holds."""
    tokens = []
    for _ in range(n):
        token = int(np.argmax(_logits(ctx)))
        tokens.append(token)
        batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(token), 1)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        n_past += 1
    return tokens


def _state(ctx: llama_cpp.llama_context_p) -> bytes:
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    assert llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0) == size
    return bytes(buffer)


def test_a_prompt_read_on_from_a_restored_prefix_reads_as_cold(
    projector: Projector, llm: llama_cpp.Llama
) -> None:
    """Two images; the prefix restored ends after the first image, inside the text between them, and
    where the second starts: the logits and the greedy reply are the cold read's, bit for bit."""
    texts = ("Two screenshots. The first: ", " and the second, a moment later: ", " What changed?")
    prompt = two_images(projector, texts, png(picture(4)), png(picture(5)))
    first, second = prompt.pieces[1], prompt.pieces[3]
    memory = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_clear(memory, True)
    prompt.read_from(llm.ctx, 0, 0, N_BATCH)
    cold_logits = _logits(llm.ctx)
    cold_reply = _greedy(llm.ctx, prompt.n_tokens, 8)
    for n_past in (first.end, first.end + 5, second.start):
        llama_cpp.llama_memory_clear(memory, True)
        prompt.read_from(llm.ctx, 0, 0, N_BATCH)
        assert llama_cpp.llama_memory_seq_rm(memory, 0, n_past, -1)
        state = _state(llm.ctx)
        llama_cpp.llama_memory_clear(memory, True)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        assert llama_cpp.llama_state_seq_set_data(llm.ctx, buffer, len(state), 0) == len(state)
        assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == n_past - 1
        prompt.read_from(llm.ctx, n_past, 0, N_BATCH)
        np.testing.assert_array_equal(_logits(llm.ctx), cold_logits, err_msg=f"restored {n_past}")
        assert _greedy(llm.ctx, prompt.n_tokens, 8) == cold_reply


def test_read_from_refuses_a_start_inside_an_image_or_past_the_prompt(
    projector: Projector, llm: llama_cpp.Llama
) -> None:
    prompt = MediaPrompt(projector, ["A ", projector.decode(png(picture(6))), " b"])
    with pytest.raises(InvalidArgument, match="cannot read the prompt on from"):
        prompt.read_from(llm.ctx, prompt.pieces[1].start + 1, 0, N_BATCH)
    with pytest.raises(InvalidArgument, match="cannot read the prompt on from"):
        prompt.read_from(llm.ctx, prompt.n_tokens, 0, N_BATCH)


def test_bytes_that_do_not_decode_are_an_image_error(projector: Projector) -> None:
    damaged = bytearray(png(picture(7)))
    damaged[40:60] = b"\xff" * 20  # inside the compressed pixels
    with pytest.raises(ImageError, match="could not be decoded"):
        projector.decode(bytes(damaged))
    with pytest.raises(ImageError, match="not a PNG"):
        projector.decode(b"GIF8 is not quite a GIF")


def test_a_file_that_is_no_projector_is_a_model_error(
    llm: llama_cpp.Llama, vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    with pytest.raises(ModelError, match="not a projector"):
        Projector(llm, vision_model[0])  # the text model itself
    not_gguf = tmp_path / "mmproj.gguf"
    not_gguf.write_bytes(b"not a model")
    with pytest.raises(ModelError):
        Projector(llm, not_gguf)


def test_a_closed_projector_says_so(llm: llama_cpp.Llama, vision_model: tuple[Path, Path]) -> None:
    projector = Projector(llm, vision_model[1])
    assert len(projector.fingerprint) > 16
    projector.close()
    with pytest.raises(ModelError, match="closed"):
        projector.decode(png(picture(8)))


ROUTED_MTMD_LOG = """
import json, logging, sys
from snapcache.llama import load_llama, route_llama_cpp_log
from snapcache.llama.media import Projector

lines = []

class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())

logger = logging.getLogger("snapcache.llama_cpp")
logger.addHandler(Keep())
logger.setLevel(logging.DEBUG)
logger.propagate = False
route_llama_cpp_log()
llm = load_llama(sys.argv[1], n_ctx=256, n_threads=1)
Projector(llm, sys.argv[2]).close()
llm.close()
print(json.dumps(lines))
"""


def test_mtmd_logs_where_llama_cpp_is_routed(vision_model: tuple[Path, Path]) -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", ROUTED_MTMD_LOG, *map(str, vision_model)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stderr == ""
    lines = json.loads(done.stdout.strip().splitlines()[-1])
    assert any(str(vision_model[1]) in line for line in lines)  # the projector loader's own lines


RESTORE_IN_ANOTHER_PROCESS = """
import ctypes, json, sys
import numpy as np
import llama_cpp
sys.path[:0] = sys.argv[4:]
from image_files import bmp, picture, png
from test_media_prompt import STORED_TEXTS, two_images
from snapcache import SnapshotStore
from snapcache.llama import load_llama, model_fingerprint
from snapcache.llama.media import Projector

model, mmproj, directory = sys.argv[1:4]
llm = load_llama(model, n_ctx=1024, n_batch=32, n_ubatch=32, n_threads=2)
projector = Projector(llm, mmproj)
fingerprint = model_fingerprint(llm)
n_vocab = llm.n_vocab()

def logits():
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()

memory = llama_cpp.llama_get_memory(llm.ctx)
def prompt(first, second):
    return two_images(projector, STORED_TEXTS, first, second)
same = prompt(bmp(picture(10)), png(picture(12)))   # the stored first image, sent as BMP this time
other = prompt(png(picture(13)), png(picture(11)))  # another first image, the stored second one
result = {}
with SnapshotStore(directory) as store:
    for name, asked in (("same", same), ("other", other)):
        llama_cpp.llama_memory_clear(memory, True)
        asked.read_from(llm.ctx, 0, 0, 32)
        cold = logits()
        llama_cpp.llama_memory_clear(memory, True)
        found = store.lookup(fingerprint, "vision", asked.key_tokens[:-1])
        n = 0 if found is None else found.key.token_count
        if found is not None:
            state = bytes(found.state)
            buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            assert llama_cpp.llama_state_seq_set_data(llm.ctx, buffer, len(state), 0) == len(state)
        asked.read_from(llm.ctx, n, 0, 32)
        equal = bool(np.array_equal(logits(), cold))
        result[name] = {"restored": n, "second_image": asked.pieces[3].start, "equal": equal}
projector.close()
llm.close()
print(json.dumps(result))
"""


def test_an_image_restores_in_another_process_by_its_pixels(
    projector: Projector, llm: llama_cpp.Llama, vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    """A prompt with two images is stored up to its second image; another process restores it for a
    prompt with the same first image (sent as BMP, not PNG) and another second one, and reads on to
    the cold logits; a prompt whose first image differs misses."""
    import json
    import subprocess
    import sys

    from snapcache import SnapshotStore
    from snapcache.llama import model_fingerprint
    from snapcache.prompt_tokens import PromptTokens

    stored = two_images(projector, STORED_TEXTS, png(picture(10)), png(picture(11)))
    n = stored.pieces[3].start
    memory = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_clear(memory, True)
    stored.read_from(llm.ctx, 0, 0, N_BATCH)
    assert llama_cpp.llama_memory_seq_rm(memory, 0, n, -1)
    fingerprint = model_fingerprint(llm)
    key = PromptTokens.of(stored.key_tokens).key(fingerprint, "vision", n)
    with SnapshotStore(tmp_path / "store") as store:
        assert store.put(key, stored.key_tokens[:n], _state(llm.ctx)) is not None
    helpers = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RESTORE_IN_ANOTHER_PROCESS,
            *map(str, vision_model),
            str(tmp_path / "store"),
            *helpers,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    same, other = result["same"], result["other"]
    assert same["restored"] == same["second_image"] == n  # all of it, up to where the images differ
    assert other["restored"] == 0  # parts from the stored prompt where its first image starts
    assert same["equal"]
    assert other["equal"]
