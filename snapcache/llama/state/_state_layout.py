"""The layout of a llama.cpp sequence-state blob (llama-cpp-python 0.3.36): read it, check it, pad it.

A blob is llama.cpp's magic and the source seq id, then one section per KV cache (one for a plain
cache; the full-attention cache, then the sliding-window cache for interleaved-SWA models). A
section of one stream is: stream count, cell count, per cell (position, 1, seq id), then the V
layout flag, layer count, per layer the K type, K row size and K rows, and per layer the V rows
(or, transposed, the V type, element size, width and one run of cells per V element).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from snapcache.llama.state._sparse_memory import populate_for_reading, sparse_zeros

SEQ_STATE_MAGIC = 0xAF143CD8
BLOB_HEADER_BYTES = 8
# The blob header and the first section's stream and cell counts: what every blob starts with.
HEADER_BYTES = 16
_HEADER = np.dtype([("magic", "<u4"), ("seq_id", "<i4"), ("n_stream", "<u4"), ("cell_count", "<u4")])
# A cell's metadata is its position, 1 and its seq id; models with a per-cell extension (M-RoPE,
# n-gram hash) add 12 bytes. Only the plain layout is parsed into sections.
CELL_META_BYTES = 12
_EXTENDED_CELL_META_BYTES = 24
_MAX_LAYERS = 4096
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# A padded window's cells sit at slots congruent to their positions modulo this (see pad_window).
WINDOW_PAD_CELLS = 256


@dataclass(frozen=True, slots=True)
class BlobHeader:
    """The first fields of a blob: source seq id, the first cache's stream count and cell count."""

    seq_id: int
    n_stream: int
    cell_count: int


@dataclass(frozen=True, slots=True)
class LayerRows:
    header: tuple[int, int]  # byte range of this layer's type and size fields
    data: int  # offset of the rows
    row_bytes: int  # bytes per cell (per cell and element when transposed)
    width: int  # 1, or the number of V elements when transposed


@dataclass(frozen=True, slots=True)
class CacheSection:
    """One KV cache's part of a blob: its cells' positions and where each layer's rows lie."""

    start: int
    end: int
    positions: npt.NDArray[np.int32]
    seq_id: int
    data_header: tuple[int, int]
    layers: tuple[LayerRows, ...]


def read_header(state: npt.NDArray[np.uint8]) -> BlobHeader:
    """The blob's header; ValueError when the blob is too short or lacks llama.cpp's magic."""
    if state.nbytes < HEADER_BYTES:
        raise ValueError("it is too short to hold a sequence-state header")
    header = state[:HEADER_BYTES].view(_HEADER)[0]
    if int(header["magic"]) != SEQ_STATE_MAGIC:
        raise ValueError("it does not start with llama.cpp's sequence-state magic")
    return BlobHeader(int(header["seq_id"]), int(header["n_stream"]), int(header["cell_count"]))


def cells_are_positions(state: npt.NDArray[np.uint8], n: int) -> bool:
    """Whether the first cache's cell list is positions 0..n-1 of one sequence, in either cell layout.

    The check for blobs that `parse_sections` does not know (several streams, per-cell extensions).
    """
    body = state[HEADER_BYTES:]
    for stride in (CELL_META_BYTES, _EXTENDED_CELL_META_BYTES):
        if body.nbytes < n * stride + 8:
            continue
        meta = body[: n * stride].view("<i4").reshape(n, stride // 4)
        if not np.all(meta[:, 1] == 1):
            continue
        positions = np.sort(meta[:, 0])
        if np.array_equal(positions, np.arange(n, dtype=positions.dtype)):
            return True
    return False


def parse_sections(state: npt.NDArray[np.uint8]) -> list[CacheSection]:
    """Split a single-stream blob into its cache sections; ValueError unless it parses to the last byte."""
    read_header(state)
    buf = state.data
    sections: list[CacheSection] = []
    off = BLOB_HEADER_BYTES
    try:
        while off < len(buf):
            section = _parse_section(state, off)
            sections.append(section)
            off = section.end
    except struct.error as exc:
        raise ValueError(f"truncated state: {exc}") from None
    if off != len(buf) or not sections:
        raise ValueError("state does not end where its sections do")
    return sections


def pad_window(state: npt.NDArray[np.uint8], sections: list[CacheSection]) -> npt.NDArray[np.uint8] | None:
    """The blob with the sliding-window section padded with masked cells (`padding_cells`), or None
    when it needs none.

    A window cache restored bare puts its cells at the front of the cache, where a cold run has them
    at slots equal to their positions. llama.cpp's attention kernels add up a row of cells in groups
    by slot (SIMD lanes on a CPU, tiles of 256 cells in CUDA's flash attention, views padded to 256
    cells): moved by a slot count that is not a multiple of the group, the same values are added in
    another order and greedy output drifts from a cold run. Masked cells add exact zeros wherever
    they sit, so a few zero cells in front of the window, at positions it already masks, are enough
    to put every cell of the window at a slot congruent to its position modulo WINDOW_PAD_CELLS (256,
    the largest such group; measured on CPUs only). On Gemma-3 (benchmarks/bench_window_padding.py,
    tests/test_long_context.py) logits stay bit-identical to cold padded to 32 or 256 cells or from
    position 0; bare they are off by 1.13 at 9,000 tokens (a reordered sum rounds differently or
    not, depending on the values, so bare happens to match at other sizes).

    The padded section holds at most WINDOW_PAD_CELLS - 1 cells more than the window: 3.7 MiB at
    most for Gemma-3-270M, where padding from position 0 cost 124 MiB at 9,000 tokens. It is built in one
    zeroed allocation whose zero pages the system provides lazily (`_sparse_memory`), and only the
    window's own rows are copied in (`assembly.assemble` writes it straight from blocks the same way).
    """
    if len(sections) != 2 or padding_cells(sections[1]) == 0:
        return None
    window = sections[1]
    out = sparse_zeros(window.start + padded_window_bytes(window))
    out[: window.start] = state[: window.start]
    write_padded_window(out, window.start, state, window)
    populate_for_reading(out)
    return out


def ring_cells(last: int, window_cells: int, n_swa: int) -> tuple[int, npt.NDArray[np.int32]]:
    """(K, the positions of slots 0..K-1) that a cold read up to position `last` leaves in a
    window-sized sliding-window cache of `window_cells` cells (`swa_full` off).

    A cold read fills that cache as a ring (llama-kv-cache.cpp find_slot/apply_ubatch: a ubatch of at
    most n_ubatch <= window_cells - n_swa tokens reuses the masked cells from the head on): position p
    sits at slot p % window_cells, and the head is at (last + 1) % window_cells. A restore into a
    cleared stream (head 0) puts cell i of the blob at slot i and leaves the head after the last one,
    so the blob lists slots 0..K-1; K stops at the cold head where slot 0 would otherwise be the
    first masked cell that the next token takes (head >= n_swa), else covers the whole ring."""
    if last + 1 <= window_cells:
        k = last + 1
    else:
        head = (last + 1) % window_cells
        k = window_cells if head < n_swa else head
    slots = np.arange(k, dtype=np.int64)
    return k, (last - (last - slots) % window_cells).astype(np.int32)


def ring_window(
    state: npt.NDArray[np.uint8], sections: list[CacheSection], window_cells: int, n_swa: int
) -> tuple[npt.NDArray[np.uint8], bool]:
    """The blob with its sliding-window section laid out as a cold read leaves a window-sized cache
    (`ring_cells`), and whether that layout holds masked fillers: each window cell at slot
    position % window_cells, every other slot up to K a masked cell (the position a cold read leaves
    there, zero rows). A window that already lies so (read from position 0 without wrapping the
    ring) is the blob as it is, without fillers. Without it, a restore puts the
    window at slots 0..n_swa-1 in capture order and the next tokens after it, where a cold read has
    them between the window's newest and oldest cells: the attention sums (soft_max in 16-lane
    chunks, V rows by slot) add the same values in another order, off by up to 1.1 in the logits.
    ValueError when the window does not fit the ring."""
    window = sections[1]
    m = len(window.positions)
    meta = state[window.start + 8 : window.start + 8 + m * CELL_META_BYTES].view("<i4").reshape(m, 3)
    last = int(window.positions[-1]) if m else -1
    k, slot_positions = ring_cells(last, window_cells, n_swa)
    dst = meta[:, 0].astype(np.int64) % window_cells
    if m == 0 or np.any(dst >= k) or not np.array_equal(slot_positions[dst], meta[:, 0]):
        raise ValueError(f"its window cache does not fit a ring of {window_cells} cells")
    if k == m and np.array_equal(dst, np.arange(m)):
        return state, False
    filler = np.ones(k, dtype=bool)
    filler[dst] = False
    if np.any(slot_positions[filler] > last - n_swa):
        raise ValueError("a masked cell of the ring would be visible")
    size = (
        8 + k * CELL_META_BYTES + 8 + sum(12 + layer.width * k * layer.row_bytes for layer in window.layers)
    )
    out = sparse_zeros(window.start + size)
    out[: window.start] = state[: window.start]
    off = window.start
    out[off : off + 4] = state[window.start : window.start + 4]
    _U32.pack_into(out.data, off + 4, k)
    off += 8
    cells = out[off : off + k * CELL_META_BYTES].view("<i4").reshape(k, 3)
    cells[:, 0] = slot_positions
    cells[:, 1] = 1
    cells[:, 2] = window.seq_id
    off += k * CELL_META_BYTES
    out[off : off + 8] = state[window.data_header[0] : window.data_header[1]]
    off += 8
    runs = _runs(dst)
    for layer in window.layers:
        out[off : off + 12] = state[layer.header[0] : layer.header[1]]
        off += 12
        n_bytes = layer.width * k * layer.row_bytes
        rows = state[layer.data : layer.data + layer.width * m * layer.row_bytes].reshape(layer.width, m, -1)
        slots = out[off : off + n_bytes].reshape(layer.width, k, -1)
        for source, target, length in runs:
            slots[:, target : target + length, :] = rows[:, source : source + length, :]
        off += n_bytes
    populate_for_reading(out)
    return out, k > m


def _runs(dst: npt.NDArray[np.int64]) -> list[tuple[int, int, int]]:
    """`dst` (the slot of each cell) as runs of consecutive slots: (first cell, first slot, length).
    A window's cells are consecutive positions, so a ring holds them in at most two runs, each
    copied as whole rows (a V layer's transposed rows are 2 bytes wide: copied cell by cell, they
    took 30 ms of a 1,300-token Gemma-3 restore)."""
    breaks = np.flatnonzero(np.diff(dst) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(dst)]
    return [(start, int(dst[start]), end - start) for start, end in zip(starts, ends, strict=True)]


def write_cells(cells: npt.NDArray[np.uint8], first_position: int, seq_id: int) -> None:
    """Fill `cells` with a cell list: len(cells) // 12 cells at the positions from `first_position`
    on, each in sequence `seq_id` alone."""
    meta = cells.view("<i4").reshape(-1, 3)
    meta[:, 0] = np.arange(first_position, first_position + len(meta))
    meta[:, 1] = 1
    meta[:, 2] = seq_id


def window_start(window: CacheSection) -> int:
    """The first position a sliding-window section holds (0 when empty)."""
    return int(window.positions[0]) if len(window.positions) else 0


def padding_cells(window: CacheSection) -> int:
    """How many masked cells go before `window`'s own when it is padded: enough to put each of its
    cells at a slot congruent to its position modulo WINDOW_PAD_CELLS, as a cold prefill has it."""
    return window_start(window) % WINDOW_PAD_CELLS


def padded_window_bytes(window: CacheSection) -> int:
    """The size of `window` (a section of a blob) once padded (see `padding_cells`)."""
    n = padding_cells(window) + len(window.positions)
    return (
        8 + n * CELL_META_BYTES + 8 + sum(12 + layer.width * n * layer.row_bytes for layer in window.layers)
    )


def write_padded_window(
    out: npt.NDArray[np.uint8], off: int, state: npt.NDArray[np.uint8], window: CacheSection
) -> None:
    """Write `window` (a section of `state`) padded (see `padding_cells`) into `out` at `off`, where `out`
    holds zeros. Only the cell list and the window's own rows are written."""
    for write in padded_window_writes(out, off, state, window):
        write()


def padded_window_writes(
    out: npt.NDArray[np.uint8],
    off: int,
    state: npt.NDArray[np.uint8],
    window: CacheSection,
    *,
    zero_padding: bool = False,
) -> list[Callable[[], None]]:
    """The writes that `write_padded_window` makes, each to bytes of its own: the cell list, then
    each layer's rows (a few hundred KiB on Gemma 3), so that several threads can share them.

    `zero_padding`: also write the padding's zero rows, for an `out` that does not hold zeros (then
    every byte of the padded window is written)."""
    pad = padding_cells(window)
    m = len(window.positions)
    n = pad + m
    writes: list[Callable[[], None]] = [functools.partial(_write_padded_cells, out, off, state, window, pad)]
    off += 8 + n * CELL_META_BYTES + 8
    for layer in window.layers:
        writes.append(functools.partial(_write_padded_rows, out, off, state, layer, m, pad, zero_padding))
        off += 12 + layer.width * n * layer.row_bytes
    return writes


def _write_padded_cells(
    out: npt.NDArray[np.uint8], off: int, state: npt.NDArray[np.uint8], window: CacheSection, pad: int
) -> None:
    """The padded window's counts, cell list and V layout fields."""
    m = len(window.positions)
    n = pad + m
    out[off : off + 4] = state[window.start : window.start + 4]
    _U32.pack_into(out.data, off + 4, n)
    off += 8
    write_cells(out[off : off + pad * CELL_META_BYTES], window_start(window) - pad, window.seq_id)
    meta_start = window.start + 8
    out[off + pad * CELL_META_BYTES : off + n * CELL_META_BYTES] = state[
        meta_start : meta_start + m * CELL_META_BYTES
    ]
    off += n * CELL_META_BYTES
    out[off : off + 8] = state[window.data_header[0] : window.data_header[1]]


def _write_padded_rows(
    out: npt.NDArray[np.uint8],
    off: int,
    state: npt.NDArray[np.uint8],
    layer: LayerRows,
    m: int,
    pad: int,
    zero_padding: bool,
) -> None:
    """One layer's type and size fields, and its `m` cells' rows after `pad` zero cells in each row
    (written as zeros with `zero_padding`, else left as `out` holds them)."""
    out[off : off + 12] = state[layer.header[0] : layer.header[1]]
    off += 12
    size = layer.width * (pad + m) * layer.row_bytes
    rows = state[layer.data : layer.data + layer.width * m * layer.row_bytes].reshape(layer.width, -1)
    padded = out[off : off + size].reshape(layer.width, -1)
    if zero_padding:
        padded[:, : pad * layer.row_bytes] = 0
    padded[:, pad * layer.row_bytes :] = rows


def _parse_section(state: npt.NDArray[np.uint8], start: int) -> CacheSection:
    buf = state.data
    n_stream = _U32.unpack_from(buf, start)[0]
    if n_stream != 1:
        raise ValueError(f"{n_stream} streams; only single-stream states are parsed")
    n = _U32.unpack_from(buf, start + 4)[0]
    off = start + 8
    if n == 0:
        return CacheSection(start, off, np.empty(0, np.int32), 0, (off, off), ())
    if off + n * CELL_META_BYTES > len(buf):
        raise ValueError("cell list runs past the end")
    meta = state[off : off + n * CELL_META_BYTES].view("<i4").reshape(n, 3)
    if not np.all(meta[:, 1] == 1) or not np.all(meta[:, 2] == meta[0, 2]):
        raise ValueError("cells are not of one sequence")
    positions = np.sort(meta[:, 0])
    if not np.array_equal(positions, np.arange(positions[0], positions[0] + n, dtype=positions.dtype)):
        raise ValueError("cell positions are not one contiguous run")
    off += n * CELL_META_BYTES
    data_header, layers, off = parse_layers(state, off, n)
    return CacheSection(start, off, positions, int(meta[0, 2]), data_header, layers)


def parse_layers(
    state: npt.NDArray[np.uint8], off: int, n: int
) -> tuple[tuple[int, int], tuple[LayerRows, ...], int]:
    """The rows of `n` cells that start at `off`: (the V layout and layer count fields, the K rows of
    every layer then their V rows, where they end); ValueError or struct.error when they do not fit."""
    buf = state.data
    v_trans = _U32.unpack_from(buf, off)[0]
    n_layer = _U32.unpack_from(buf, off + 4)[0]
    if v_trans > 1 or not 0 < n_layer <= _MAX_LAYERS:
        raise ValueError("implausible V layout or layer count")
    data_header = (off, off + 8)
    off += 8
    layers: list[LayerRows] = []
    for _ in range(n_layer):
        row = _U64.unpack_from(buf, off + 4)[0]
        layers.append(LayerRows((off, off + 12), off + 12, row, 1))
        off += 12 + _checked(n * row, buf, off)
    for _ in range(n_layer):
        if v_trans:
            element = _U32.unpack_from(buf, off + 4)[0]
            width = _U32.unpack_from(buf, off + 8)[0]
            layers.append(LayerRows((off, off + 12), off + 12, element, width))
            off += 12 + _checked(width * n * element, buf, off)
        else:
            row = _U64.unpack_from(buf, off + 4)[0]
            layers.append(LayerRows((off, off + 12), off + 12, row, 1))
            off += 12 + _checked(n * row, buf, off)
    return data_header, tuple(layers), off


def _checked(nbytes: int, buf: memoryview, off: int) -> int:
    if nbytes <= 0 or off + 12 + nbytes > len(buf):
        raise ValueError("layer rows run past the end")
    return nbytes
