"""Build a blob back from its 64-token blocks and a record (see `snapcache.llama.state.blocks`).

`assemble` builds the blob of the first n_tokens from the blocks and a record (or from blocks
alone, on a model with one cache), straight into one buffer; `Assembly` does it as the blocks
arrive, from several threads. The result is checked again like any blob before llama.cpp reads it
(see `state.restore_sequence`).
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from snapcache.formats.threads import map_in_parallel
from snapcache.key import BLOCK_TOKENS
from snapcache.llama.state._sparse_memory import empty_in_pieces
from snapcache.llama.state._state_layout import (
    BLOB_HEADER_BYTES,
    CELL_META_BYTES,
    SEQ_STATE_MAGIC,
    CacheSection,
    LayerRows,
    padded_window_bytes,
    padded_window_writes,
    parse_layers,
    write_cells,
)
from snapcache.llama.state.blocks import Bytes, Record, pads_window

__all__ = ["Assembly", "Lender", "assemble"]

# Lends an assembly `size` bytes to build its blob in, or None (see `Assembly`).
Lender = Callable[[int], "Bytes | None"]
# The record's later caches are copied into an assembled blob in pieces of this size, at most.
_LATER_PIECE_BYTES = 256 << 10


def assemble(
    blocks: Sequence[memoryview | bytes | bytearray], record: Record | None, *, pad_window: bool = False
) -> memoryview:
    """The blob of the blocks' tokens followed by the record's tail and later caches (or, without a
    record, of the blocks alone). ValueError when the pieces do not fit together.

    `pad_window`: a sliding-window cache goes in padded, as `_state_layout.pad_window`
    would pad the assembled blob, but without building the blob twice (see `pads_window`)."""
    if not blocks:
        raise ValueError("no blocks to assemble")
    assembly = Assembly(len(blocks), record, pad_window=pad_window)
    for index, block in enumerate(blocks):
        assembly.keep(index, block)
    return assembly.finish()


class Assembly:
    """The blob of `n_blocks` blocks and a record (see `assemble`), built as the blocks arrive.

    `place` copies one block into its rows and returns: the caller may reuse the block's buffer then.
    Several threads may place different blocks at once. The first block placed sets the layout,
    which every other block, and the record's tail, must share. What is not a block's own is cut
    into shared writes, a share made with each block placed, so that the threads placing blocks
    share it too: mapping the blob's memory ahead of the rows and writing the blob's own fields,
    then copying in the record's later caches (its sliding window: most of a record). Until
    2026-11-23 the first block's thread made all of both: the mapping while the other thread waited
    for the layout, and the copy while the other ran out of blocks long before it was done (at 1K
    tokens); and until later that day, the blob's fields, which mapped an 8B model's blob a huge
    page per layer while the other thread waited.
    """

    def __init__(
        self, n_blocks: int, record: Record | None, *, pad_window: bool = False, into: Lender | None = None
    ) -> None:
        """`into`: lends the blob's memory (touched already, see `capture_buffer`), or None for new
        memory; new memory too when it lends none."""
        if n_blocks < 1:
            raise ValueError("no blocks to assemble")
        if record is not None and record.n_blocks != n_blocks:
            raise ValueError(f"the record needs {record.n_blocks} blocks, {n_blocks} given")
        self.n_blocks = n_blocks
        self._record = record
        self._padded = pad_window and pads_window(record)
        self._into = into
        self._placed = np.zeros(n_blocks, dtype=bool)
        self._layout_lock = threading.Lock()
        self._layout: _Layout | None = None
        self._shared_writes: list[Callable[[], None]] = []  # set with the layout
        self._shared_per_block = 0
        self._shared_taken = 0
        self._kept: list[tuple[int, Bytes]] = []  # blocks `keep` took, copied in by `finish`

    def place(self, index: int, block: memoryview | bytes | bytearray) -> None:
        """Copy block `index` into the blob, after its share of the shared writes (see the class);
        ValueError when the block does not share the blob's layout."""
        array, layout = self._checked(index, block)
        self._write_shared(self._shared_per_block)  # first: the mapping goes ahead of the rows
        for (start, end, shape), target in zip(layout.rows, layout.targets, strict=True):
            target[:, index] = array[start:end].reshape(shape)
        self._placed[index] = True  # with its share of the shared writes

    def keep(self, index: int, block: memoryview | bytes | bytearray) -> None:
        """Take block `index` to be copied in by `finish`, with every other block kept, a layer at
        a time: `block` must stay as it is until then (a block RAM holds). ValueError when it does
        not share the blob's layout.

        One layer's rows of every block in turn write the blob in order, where a block's rows of
        every layer in turn write it a layer's width apart: an 8B model's 1,024-token state went
        in at one copy's speed (29.5 ms, numpy's copyto of the whole state 29.8), against 35-41 ms
        a block at a time, on 2 threads (AMD EPYC, 2026-11-27)."""
        array, _ = self._checked(index, block)
        self._kept.append((index, array))
        self._placed[index] = True

    def _checked(self, index: int, block: memoryview | bytes | bytearray) -> tuple[Bytes, _Layout]:
        """`block` as bytes, and the layout (set by the first block) it shares; ValueError when
        `index` is out of range or the block does not share the layout."""
        if not 0 <= index < self.n_blocks:
            raise ValueError(f"block {index} is not one of the {self.n_blocks} to assemble")
        array = np.frombuffer(block, dtype=np.uint8)
        layout = self._layout
        if layout is None:
            with self._layout_lock:
                if self._layout is None:
                    layout = _Layout.of(array, self.n_blocks, self._record, self._padded, self._into)
                    self._shared_writes = [*layout.first_writes, *layout.later_writes()]
                    self._shared_per_block = -(-len(self._shared_writes) // self.n_blocks)
                    self._layout = layout
                layout = self._layout
        if array.nbytes != layout.block_bytes or any(
            array.data[start:end] != expected for start, end, expected in layout.fields
        ):
            raise ValueError("the blocks do not share one layout")
        return array, layout

    def _copy_kept(self, layout: _Layout) -> None:
        """Copy the kept blocks in, a layer at a time on the codec's threads (layers dealt out in
        turn), each layer after its share of the shared writes left."""
        kept, self._kept = self._kept, []
        n_layers = len(layout.rows)
        with self._layout_lock:
            left = len(self._shared_writes) - self._shared_taken
        share = -(-left // n_layers)

        def copy_layer(k: int) -> None:
            self._write_shared(share)
            (start, end, shape), target = layout.rows[k], layout.targets[k]
            for index, array in kept:
                target[:, index] = array[start:end].reshape(shape)

        map_in_parallel(copy_layer, range(n_layers), dealt=True)

    def _write_shared(self, count: int) -> None:
        """Make up to `count` of the shared writes (see the class) that no thread has taken yet, in
        their order. Every block placed makes its share, so that the threads placing blocks share them."""
        with self._layout_lock:
            start = self._shared_taken
            self._shared_taken = min(start + count, len(self._shared_writes))
            taken = self._shared_writes[start : self._shared_taken]
        for write in taken:
            write()

    def finish(self) -> memoryview:
        """The blob, once every block is placed or kept (and the kept ones copied in now); ValueError
        before."""
        layout = self._layout
        if layout is None or not self._placed.all():
            raise ValueError(f"not all of the {self.n_blocks} blocks were placed")
        if self._kept:
            self._copy_kept(layout)
        self._write_shared(len(self._shared_writes))  # none are left: every block took its share
        return layout.blob.data


_PAGE = 4096


@dataclass(frozen=True, slots=True)
class _Layout:
    """An assembly's blob, allocated, and what is still to be written into it: its own fields
    (`first_writes`), the blocks' rows (`targets`) and the record's later caches (`later_writes`)."""

    blob: Bytes
    # What any thread may write before the blocks' rows: calls that map the blob's memory (4 MiB
    # each), then the blob's own fields.
    first_writes: tuple[Callable[[], None], ...]
    block_bytes: int
    fields: tuple[tuple[int, int, bytes], ...]  # a block's layout fields, as every block has them
    rows: tuple[tuple[int, int, tuple[int, int]], ...]  # per layer, a block's rows and their shape
    targets: tuple[Bytes, ...]  # per layer, its rows in the blob as (width, block, one block's row)
    later_at: int  # where the caches after the first one go in the blob
    # What goes there: the record's caches after its first one, copied as captured; or, when
    # `window` is set, the record's whole blob, whose `window` section goes in padded.
    later: Bytes
    window: CacheSection | None

    def later_writes(self) -> list[Callable[[], None]]:
        """The writes that copy the record's caches after the first one in (padded, when asked), in
        pieces of a few hundred KiB that any thread may make: most of a record, shared out among
        the threads placing blocks."""
        if self.window is not None:
            return padded_window_writes(self.blob, self.later_at, self.later, self.window, zero_padding=True)
        step = _LATER_PIECE_BYTES
        return [
            functools.partial(_copy, self.blob, self.later_at + start, self.later[start : start + step])
            for start in range(0, self.later.nbytes, step)
        ]

    @classmethod
    def of(
        cls, first: Bytes, n_blocks: int, record: Record | None, padded: bool, into: Lender | None = None
    ) -> _Layout:
        """The layout `first`, a block, sets: the blob allocated, and all but the blocks written."""
        try:
            data_header, layers, size = parse_layers(first, 0, BLOCK_TOKENS)
        except struct.error as exc:
            raise ValueError(f"a block is too short for its layout: {exc}") from None
        if size != first.nbytes:
            raise ValueError("a block does not end where its rows do")
        fields = tuple(  # copied: `first` may be a buffer its owner reuses
            (start, end, first[start:end].tobytes()) for start, end in _field_ranges(data_header, layers)
        )

        n_whole = n_blocks * BLOCK_TOKENS
        tail: CacheSection | None = None
        blob = np.empty(0, dtype=np.uint8)  # the record's blob, where the tail's rows are
        rest = blob
        if record is not None:
            first_section = record.sections[0]
            if len(first_section.positions):
                tail = first_section
                tail_ranges = _field_ranges(tail.data_header, tail.layers)
                if len(tail_ranges) != len(fields) or any(
                    record.blob[start:end].tobytes() != expected
                    for (start, end), (_, _, expected) in zip(tail_ranges, fields, strict=True)
                ):
                    raise ValueError("the record's tail has another layout than its blocks")
            blob = record.blob
            rest = blob[first_section.end :]
        n = n_whole + (0 if tail is None else len(tail.positions))

        total = BLOB_HEADER_BYTES + 8 + n * CELL_META_BYTES + 8
        total += sum(12 + layer.width * n * layer.row_bytes for layer in layers)
        window = None
        if padded:
            assert record is not None
            window = record.sections[1]
        # Every byte is written, the padding's zero rows too (255 cells at most: 3.7 MiB on
        # Gemma-3-270M), where leaving them to the system's zero pages (until 2026-11-23) had the
        # threads fault the whole blob in 4 KiB at a time.
        later_bytes = rest.nbytes if window is None else padded_window_bytes(window)
        room = total + later_bytes + _PAGE  # to start the blob where the copies run fastest
        lent = None if into is None else into(room)
        # Memory lent was touched before: nothing to map, and no page faults while blocks go in.
        memory, mapping = empty_in_pieces(room) if lent is None else (lent, [])
        # The first layer's rows: after the header, the cell count and cells, the data header and
        # the layer's own 12 bytes, as the writes below lay them out.
        first_rows_at = BLOB_HEADER_BYTES + 8 + n * CELL_META_BYTES + 8 + 12
        start = _blob_start(memory, first_rows_at, first, layers[0].data)
        view = memory[start : start + total + later_bytes]
        # The blob's own fields (its header, cell list, each layer's fields and the tail's rows) are
        # written after the mapping, by the threads placing blocks: the fields of each layer are in
        # a page of their own, and written here they would map the blob a page at a time on this
        # thread while the other waits for the layout (a page per layer of an 8B model's blob).
        writes: list[Callable[[], None]] = []
        if record is not None:
            writes.append(functools.partial(_copy, view, 0, record.blob[:BLOB_HEADER_BYTES]))
            seq_id = struct.unpack_from("<i", record.blob.data, 4)[0]
        else:
            writes.append(functools.partial(_copy, view, 0, _packed("<Ii", SEQ_STATE_MAGIC, 0)))
            seq_id = 0
        off = BLOB_HEADER_BYTES
        writes.append(functools.partial(_copy, view, off, _packed("<II", 1, n)))
        off += 8
        writes.append(functools.partial(write_cells, view[off : off + n * CELL_META_BYTES], 0, seq_id))
        off += n * CELL_META_BYTES
        # Copied: `first` may be a buffer its owner reuses before these are written.
        writes.append(functools.partial(_copy, view, off, first[data_header[0] : data_header[1]].copy()))
        off += 8
        targets = []
        for k, layer in enumerate(layers):
            writes.append(
                functools.partial(_copy, view, off, first[layer.header[0] : layer.header[1]].copy())
            )
            off += 12
            target = view[off : off + layer.width * n * layer.row_bytes].reshape(
                layer.width, n * layer.row_bytes
            )
            if tail is not None:
                tail_layer = tail.layers[k]
                m = len(tail.positions)
                source = blob[tail_layer.data : tail_layer.data + layer.width * m * layer.row_bytes]
                tail_rows = source.reshape(layer.width, m * layer.row_bytes)
                writes.append(functools.partial(np.copyto, target[:, n_whole * layer.row_bytes :], tail_rows))
            step = BLOCK_TOKENS * layer.row_bytes
            blocks_rows = target[:, : n_whole * layer.row_bytes].reshape(layer.width, n_blocks, step)
            assert np.may_share_memory(blocks_rows, view)  # a view, never a copy
            targets.append(blocks_rows)
            off += layer.width * n * layer.row_bytes
        rows = tuple(
            (
                layer.data,
                layer.data + layer.width * BLOCK_TOKENS * layer.row_bytes,
                (layer.width, BLOCK_TOKENS * layer.row_bytes),
            )
            for layer in layers
        )
        later = rest if window is None else blob
        return cls(view, (*mapping, *writes), size, fields, rows, tuple(targets), off, later, window)


def _blob_start(memory: Bytes, rows_at: int, block: Bytes, block_rows_at: int) -> int:
    """Where in `memory` an assembled blob starts: its first layer's rows (at `rows_at` in the
    blob) half a page, in their offset within a page, from the block's (at `block_rows_at`).

    A copy whose target sits a few bytes past its source's offset within a 4 KiB page runs at a
    third of memory speed: each load waits on a store just made at the same page offset (4K
    aliasing). Blocks kept in RAM start 16 bytes into a page, and so did blobs built in the
    capture buffer: an 8B model's 1,024-token state took 73 ms to copy in 128 KiB pieces 16 bytes
    ahead, and 22-32 ms at each other offset tried from 32 to 4,088 bytes ahead, or none (AMD
    EPYC, 2026-11-27). Half a page keeps blocks of other alignments in that range too. The later
    layers keep the first one's distance where a layer's rows for the blob's cells less 64 fill
    whole pages (an 8B model's f16 cache and an even count of cells); elsewhere it drifts from
    layer to layer, and only the first layer is placed."""
    target = memory.ctypes.data + rows_at
    source = block.ctypes.data + block_rows_at
    return (_PAGE // 2 - (target - source)) % _PAGE


def _packed(layout: str, *values: int) -> Bytes:
    return np.frombuffer(struct.pack(layout, *values), dtype=np.uint8)


def _copy(out: Bytes, at: int, piece: Bytes) -> None:
    out[at : at + piece.nbytes] = piece


def _field_ranges(data_header: tuple[int, int], layers: Sequence[LayerRows]) -> list[tuple[int, int]]:
    """The byte ranges of the layout fields (V layout and layer count, each layer's type and size)."""
    return [data_header, *(layer.header for layer in layers)]
