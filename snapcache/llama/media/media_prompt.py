"""A prompt of text and images, as mtmd splits it into pieces, and the tokens its cache keys are made of.

mtmd tokenizes text and decoded images into chunks: runs of text tokens, and images that stand for as
many positions as their embeddings (`mtmd_tokenize_from_parts`, which takes the parts as they are:
no media marker is looked for in the text). The store keys prompts by token ids, so each image
position gets a key token of its own (`image_key_tokens`): drawn from the image's pixel hash and the
projector's file, one for each offset in the image, above any vocabulary's ids (`IMAGE_KEY_BASE`).
The same pixels at the same place give the same key tokens, so keys, 64-token blocks and prefix
hashes fold each image in with its position; other pixels, or another projector, part from a stored
prompt at their image's first position. The text before the first image keys as the same text
without images does (a warmed system prompt restores for chats with images). Key tokens never reach
llama.cpp: images are read through mtmd (`read_from`, `read_piece`), and llama-cpp-python's
generation sees `placeholder_tokens`, where each image position holds token 0.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import blake3
import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp

from snapcache.errors import InvalidArgument, ModelError
from snapcache.key import IMAGE_KEY_BASE, TokenArray, as_token_array
from snapcache.llama.media.projector import Image, Projector

__all__ = ["PLACEHOLDER_TOKEN", "MediaPrompt", "PromptPiece", "image_key_tokens"]

# Image key tokens lie in [IMAGE_KEY_BASE, 2**31): far above the largest vocabularies (~260K ids).
_KEY_MASK = IMAGE_KEY_BASE - 1
# What llama-cpp-python sees at an image's positions.
PLACEHOLDER_TOKEN = 0


@dataclass(frozen=True, slots=True)
class PromptPiece:
    """One mtmd chunk: positions `start` to `start + n_tokens`, text (`image_id` None) or an image."""

    start: int
    n_tokens: int
    image_id: str | None = None

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


def image_key_tokens(projector: str, image_id: str, n_tokens: int) -> TokenArray:
    """The key tokens of an image of `n_tokens` positions with pixel hash `image_id` (hex), embedded
    by the projector whose file fingerprint is `projector`: one per position, 30 bits of BLAKE3's
    output stream over both, above `IMAGE_KEY_BASE`. Every bit of the image's identity and of the
    projector's goes into them, so two images share key tokens only where their hashes collide."""
    seed = blake3.blake3(f"{projector}:{image_id}".encode())
    words = np.frombuffer(seed.digest(length=4 * n_tokens), dtype="<u4") & np.uint32(_KEY_MASK)
    return as_token_array(words.astype(np.int64) + IMAGE_KEY_BASE)


class MediaPrompt:
    """`parts` (text and `Image`s of `projector`) tokenized by mtmd: its `pieces`, its `key_tokens`
    (what the store keys it by) and `read_from`, which reads it into a sequence from a restored prefix.
    `add_special`: the model's BOS first; `parse_special`: control tokens in the text are read as such
    (a rendered chat template's)."""

    def __init__(
        self,
        projector: Projector,
        parts: Sequence[str | Image],
        *,
        add_special: bool = True,
        parse_special: bool = True,
    ) -> None:
        self._projector = projector
        texts: list[Any] = []  # kept alive until mtmd has read them
        part_array = (mtmd_cpp.mtmd_input_part * len(parts))()
        for i, part in enumerate(parts):
            if isinstance(part, Image):
                part_array[i].bitmap = part.bitmap
            elif isinstance(part, str):
                encoded = part.encode("utf-8")
                text = mtmd_cpp.mtmd_input_text(encoded, len(encoded), add_special, parse_special)
                texts.append((encoded, text))
                part_array[i].text = ctypes.pointer(text)
            else:
                raise InvalidArgument(f"a prompt part is text or an Image, not {type(part).__name__}")
        pointers = (ctypes.POINTER(mtmd_cpp.mtmd_input_part) * len(parts))(
            *(ctypes.pointer(part_array[i]) for i in range(len(parts)))
        )
        chunks = mtmd_cpp.mtmd_input_chunks_init()
        if not chunks:
            raise ModelError("mtmd could not allocate the prompt's chunks")
        self._chunks = chunks
        weakref.finalize(self, mtmd_cpp.mtmd_input_chunks_free, chunks)
        code = mtmd_cpp.mtmd_tokenize_from_parts(projector.ctx, chunks, pointers, len(parts), add_special)
        if code != 0:
            raise ModelError(f"mtmd could not tokenize the prompt (code {code})")
        pieces: list[PromptPiece] = []
        keys: list[TokenArray] = []
        start = 0
        for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
            chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, i)
            n = int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk))
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                keys.append(as_token_array(np.ctypeslib.as_array(tokens, shape=(count.value,)).copy()))
                pieces.append(PromptPiece(start, n))
            else:
                raw_id = mtmd_cpp.mtmd_input_chunk_get_id(chunk)
                if not raw_id:
                    raise ModelError("mtmd gave an image chunk without its id")
                image_id = raw_id.decode()
                keys.append(image_key_tokens(projector.fingerprint, image_id, n))
                pieces.append(PromptPiece(start, n, image_id))
            start += n
        self.pieces = tuple(pieces)
        self.key_tokens = as_token_array(np.concatenate(keys) if keys else np.zeros(0, np.int32))
        placeholders = self.key_tokens.copy()
        placeholders[placeholders >= IMAGE_KEY_BASE] = PLACEHOLDER_TOKEN
        self._placeholders = as_token_array(placeholders)

    @property
    def n_tokens(self) -> int:
        return len(self.key_tokens)

    @property
    def placeholder_tokens(self) -> list[int]:
        """The prompt as llama-cpp-python's generation sees it: its text tokens, and token 0 at each
        image position (a real id, which it may detokenize; never read: the image is read already)."""
        return [int(token) for token in self._placeholders]

    def write_tokens(self, llm: llama_cpp.Llama, *, keys: bool) -> None:
        """Write the prompt's key tokens (`keys`) or its placeholder tokens into the Llama's
        `input_ids`, as far as its context holds the prompt: key tokens for what the cache compares
        and saves (the next prompt reuses an image only where it is the same), placeholders for the
        generation, which compares its prompt with them and may detokenize them."""
        n = min(int(llm.n_tokens), self.n_tokens)
        llm.input_ids[:n] = (self.key_tokens if keys else self._placeholders)[:n]

    def piece_at(self, position: int) -> PromptPiece:
        """The piece that holds `position` (the last piece for the prompt's end)."""
        for piece in self.pieces:
            if position < piece.end:
                return piece
        return self.pieces[-1]

    def at_most(self, n_tokens: int) -> int:
        """The longest prefix of at most `n_tokens` that does not end inside an image (where a
        restore point may fall)."""
        for piece in self.pieces:
            if piece.image_id is not None and piece.start < n_tokens < piece.end:
                return piece.start
        return n_tokens

    def read_piece(self, llm: llama_cpp.Llama, end: int) -> None:
        """Read the prompt into the Llama's sequence 0 from where its context stops (`llm.n_tokens`,
        which must not fall inside an image) to `end`, at most to the end of the piece there: text as
        `Llama.eval` reads it, an image whole through mtmd. The Llama's `input_ids` get the key tokens
        (what the store keys the state by)."""
        start = int(llm.n_tokens)
        piece = self.piece_at(start)
        if piece.image_id is None:
            llm.eval(self.key_tokens[start : min(end, piece.end)].tolist())
            return
        if start != piece.start or end < piece.end:
            raise InvalidArgument(
                f"a read from {start} to {end} would part an image ({piece.start} to {piece.end})"
            )
        self._read_chunk(llm.ctx, self.pieces.index(piece), 0, int(llm.n_batch), logits_last=False)
        llm.input_ids[start : piece.end] = self.key_tokens[start : piece.end]
        llm.n_tokens = piece.end

    def read_from(self, lctx: llama_cpp.llama_context_p, n_past: int, seq_id: int, n_batch: int) -> None:
        """Read the prompt past its first `n_past` positions (which `seq_id` holds) into `seq_id` of
        the llama.cpp context `lctx`, in batches of up to `n_batch` tokens, with the logits of its
        last token. `n_past` must not fall inside an image (`at_most`). ModelError where llama.cpp
        or mtmd fails."""
        if n_past != self.at_most(n_past) or not 0 <= n_past < self.n_tokens:
            raise InvalidArgument(f"cannot read the prompt on from {n_past} of {self.n_tokens} positions")
        last = len(self.pieces) - 1
        for i, piece in enumerate(self.pieces):
            if piece.end <= n_past:
                continue
            if piece.image_id is None and n_past > piece.start:
                tokens = self.key_tokens[n_past : piece.end]
                _read_text(lctx, tokens, n_past, seq_id, n_batch, logits_last=i == last)
            else:
                self._read_chunk(lctx, i, seq_id, n_batch, logits_last=i == last)
            n_past = piece.end

    def _read_chunk(
        self, lctx: llama_cpp.llama_context_p, index: int, seq_id: int, n_batch: int, *, logits_last: bool
    ) -> None:
        """Read the whole piece `index` (an image: encoded, then its embeddings) through mtmd, from
        its start, into `seq_id` of `lctx`."""
        start = self.pieces[index].start
        chunk = mtmd_cpp.mtmd_input_chunks_get(self._chunks, index)
        new_n_past = llama_cpp.llama_pos(start)
        code = mtmd_cpp.mtmd_helper_eval_chunk_single(
            self._projector.ctx, lctx, chunk, start, seq_id, n_batch, logits_last, ctypes.byref(new_n_past)
        )
        if code != 0:
            raise ModelError(f"mtmd could not read the prompt's piece at {start} (code {code})")


def _read_text(
    lctx: llama_cpp.llama_context_p,
    tokens: TokenArray,
    start: int,
    seq_id: int,
    n_batch: int,
    *,
    logits_last: bool,
) -> None:
    """Decode `tokens` at positions from `start` into `seq_id`, `n_batch` at a time, as mtmd reads a
    text chunk (`mtmd_helper_eval_chunk_single`)."""
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        for at in range(0, len(tokens), n_batch):
            piece = tokens[at : at + n_batch]
            for row, token in enumerate(piece):
                batch.token[row] = int(token)
                batch.pos[row] = start + at + row
                batch.n_seq_id[row] = 1
                batch.seq_id[row][0] = seq_id
                batch.logits[row] = 0
            batch.n_tokens = len(piece)
            if logits_last and at + len(piece) == len(tokens):
                batch.logits[len(piece) - 1] = 1
            code = int(llama_cpp.llama_decode(lctx, batch))
            if code != 0:
                raise ModelError(
                    f"llama.cpp could not read the prompt's text at {start + at} (decode: {code})"
                )
    finally:
        llama_cpp.llama_batch_free(batch)
