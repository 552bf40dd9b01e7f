"""Cut a sequence-state blob into shared 64-token blocks and a record.

A blob's first cache (the full-attention one) holds a row per layer for every position 0..n-1, so
the rows of positions 64i..64i+63 can be cut out of any capture that holds them and reused by every
prompt that starts with the same tokens. A block is those rows: the V layout and layer count fields,
then per layer its type and size fields and the rows of its 64 cells (for a transposed V, the 64
cells of each V element). What is not per shared block goes into the record of one restore point:

    "SNAPREC1", n_tokens, n_blocks, kind (u32 each), then a llama.cpp blob: its 8-byte header, the
    first cache with only the cells after the last whole block (the tail), and every later cache
    (the sliding-window one) as captured at that point.

`snapcache.llama.state.assembly` puts them back together. Both sides read and write the blob's layout
through `_state_layout`, and the tests check that they stay byte for byte inverse.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from snapcache.key import BLOCK_TOKENS
from snapcache.llama.state._state_layout import (
    BLOB_HEADER_BYTES,
    CacheSection,
    LayerRows,
    padding_cells,
    parse_sections,
    write_cells,
)

__all__ = [
    "KIND_PREFIX",
    "KIND_PROMPT_END",
    "Record",
    "SplitState",
    "pads_window",
    "read_record",
    "split_state",
]

Bytes = npt.NDArray[np.uint8]

RECORD_MAGIC = b"SNAPREC1"
_RECORD_HEADER = struct.Struct("<8sIII")
# A record's kind: a point that prompts share (a chat's system part, a warmed prompt, a raw prompt's
# sparse points), or the end of one prompt (the next turn of its chat starts there).
KIND_PREFIX = 0
KIND_PROMPT_END = 1
_CELL = np.dtype([("pos", "<i4"), ("one", "<i4"), ("seq", "<i4")])


@dataclass(frozen=True, slots=True)
class SplitState:
    """A captured blob whose first cache holds positions 0..n-1 in order: ready to be cut."""

    state: Bytes
    sections: list[CacheSection]

    @property
    def n_cells(self) -> int:
        return len(self.sections[0].positions)

    @property
    def windows(self) -> bool:
        """Whether caches other than the first (sliding windows) follow it."""
        return len(self.sections) > 1

    def block(self, index: int) -> memoryview:
        """The rows of positions 64*index .. 64*index + 63, copied once into a read-only buffer of
        their own (no other reference to it: a store may keep it without copying it again)."""
        start = index * BLOCK_TOKENS
        section = self.sections[0]
        pieces: list[Bytes] = [self.state[section.data_header[0] : section.data_header[1]]]
        for layer in section.layers:
            pieces.append(self.state[layer.header[0] : layer.header[1]])
            pieces.append(_cells(self.state, layer, self.n_cells, start, start + BLOCK_TOKENS))
        out = np.empty(sum(piece.size for piece in pieces), dtype=np.uint8)
        at = 0
        for piece in pieces:  # a transposed V's rows are strided: numpy copies them as a 2-D block
            out[at : at + piece.size].reshape(piece.shape)[...] = piece
            at += piece.size
        out.flags.writeable = False
        return out.data

    def record(self, n_tokens: int, kind: int) -> bytes:
        """The record of a restore point after `n_tokens`: the tail after its whole blocks, and the
        later caches as captured (so `n_tokens` must be where this state was captured when there
        are any)."""
        if not 0 < n_tokens <= self.n_cells or (self.windows and n_tokens != self.n_cells):
            raise ValueError(f"no record of {n_tokens} tokens can be cut from a capture of {self.n_cells}")
        n_blocks = n_tokens // BLOCK_TOKENS
        start = n_blocks * BLOCK_TOKENS
        section = self.sections[0]
        cells = np.empty((n_tokens - start) * _CELL.itemsize, dtype=np.uint8)
        write_cells(cells, start, section.seq_id)
        pieces: list[bytes | memoryview] = [
            _RECORD_HEADER.pack(RECORD_MAGIC, n_tokens, n_blocks, kind),
            self.state[:BLOB_HEADER_BYTES].data,
            struct.pack("<II", 1, n_tokens - start),
        ]
        if n_tokens > start:
            pieces.append(cells.tobytes())
            pieces.append(self.state[section.data_header[0] : section.data_header[1]].data)
            for layer in section.layers:
                pieces.append(self.state[layer.header[0] : layer.header[1]].data)
                pieces.append(_cells(self.state, layer, self.n_cells, start, n_tokens).tobytes())
        if self.windows:
            pieces.append(self.state[self.sections[1].start :].data)
        return b"".join(pieces)


@dataclass(frozen=True, slots=True)
class Record:
    """A parsed record: its restore point, how many blocks it needs, its kind and its blob part."""

    n_tokens: int
    n_blocks: int
    kind: int
    blob: Bytes
    sections: list[CacheSection]


def split_state(state: memoryview | bytes | bytearray) -> SplitState | None:
    """The blob, ready to be cut into blocks; None when its layout cannot be cut (recurrent or hybrid
    states, several streams, per-cell extensions, cells out of order): store it whole then."""
    array = np.frombuffer(state, dtype=np.uint8)
    try:
        sections = parse_sections(array)
    except ValueError:
        return None
    first = sections[0]
    n = len(first.positions)
    if n == 0 or not first.layers:
        return None
    meta_start = first.start + 8
    order = array[meta_start : meta_start + n * _CELL.itemsize].view(_CELL)["pos"]
    if not np.array_equal(order, np.arange(n, dtype=order.dtype)):
        return None
    return SplitState(array, sections)


def is_record(state: memoryview | bytes | bytearray) -> bool:
    return bytes(memoryview(state)[: len(RECORD_MAGIC)]) == RECORD_MAGIC


def read_record(state: memoryview | bytes | bytearray) -> Record:
    """The record in `state`; ValueError when it is not a well-formed one."""
    view = memoryview(state)
    if view.nbytes < _RECORD_HEADER.size + BLOB_HEADER_BYTES + 8:
        raise ValueError("too short for a record")
    magic, n_tokens, n_blocks, kind = _RECORD_HEADER.unpack_from(view)
    if magic != RECORD_MAGIC or n_blocks != n_tokens // BLOCK_TOKENS or n_blocks < 1:
        raise ValueError("not a record, or its counts disagree")
    blob = np.frombuffer(view[_RECORD_HEADER.size :], dtype=np.uint8)
    sections = parse_sections(blob)
    tail = sections[0].positions
    if len(tail) != n_tokens - n_blocks * BLOCK_TOKENS or (
        len(tail) and int(tail[0]) != n_blocks * BLOCK_TOKENS
    ):
        raise ValueError("its tail does not follow its blocks")
    return Record(n_tokens, n_blocks, kind, blob, sections)


def pads_window(record: Record | None) -> bool:
    """Whether `assembly.assemble(..., pad_window=True)` pads this record's sliding-window cache."""
    return record is not None and len(record.sections) == 2 and padding_cells(record.sections[1]) > 0


def _cells(state: Bytes, layer: LayerRows, n: int, start: int, end: int) -> Bytes:
    """The rows of cells start..end-1 of `layer` in a section of `n` cells, as (width, cells*row)."""
    rows = state[layer.data : layer.data + layer.width * n * layer.row_bytes].reshape(layer.width, -1)
    return rows[:, start * layer.row_bytes : end * layer.row_bytes]
