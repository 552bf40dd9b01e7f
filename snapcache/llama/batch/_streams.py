"""Move one sequence's state blob between llama.cpp's 1-stream layout and an N-stream one.

A context with `n_seq_max = N` and `kv_unified = false` keeps one KV stream per sequence, and writes a
sequence's state as every stream of every cache: per cache section the stream count N, then per
stream its cell count and, where that is not 0, its cells and rows (`_state_layout`). Only the
stream of the sequence holds cells; llama.cpp reads a non-empty stream into the stream of the
sequence it restores into, and refuses a blob whose stream count is not its own. So the two layouts
differ by the stream count and N - 1 empty streams per section, and the rows are the same bytes:
states are stored in the 1-stream layout (what `CachedLlama` and `snapcache warm` save, under the
same fingerprint) and converted on the way in and out of the N-sequence context.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from snapcache.llama.state._state_layout import (
    BLOB_HEADER_BYTES,
    CELL_META_BYTES,
    parse_layers,
    read_header,
)

__all__ = ["to_one_stream", "to_streams"]

_U32 = struct.Struct("<I")
_MAX_STREAMS = 4096


Lender = Callable[[int], "npt.NDArray[np.uint8] | None"]


def to_streams(
    state: npt.NDArray[np.uint8], n_stream: int, into: Lender | None = None
) -> npt.NDArray[np.uint8]:
    """The 1-stream blob `state` laid out for a context of `n_stream` streams (its cells in the first),
    in memory `into` lends when it lends any (`state` itself for one stream).

    ValueError when `state` is not a 1-stream blob of the plain cell layout.
    """
    if n_stream < 1:
        raise ValueError(f"a context has at least one stream, got {n_stream}")
    sections = _sections(state)
    if any(len(streams) != 1 for streams in sections):
        raise ValueError("it is not a 1-stream state")
    if n_stream == 1:
        return state
    empty = _U32.pack(0) * (n_stream - 1)
    size = BLOB_HEADER_BYTES + sum(4 + (end - start) + len(empty) for ((start, end),) in sections)
    lent = None if into is None else into(size)
    out = np.empty(size, dtype=np.uint8) if lent is None else lent
    out[:BLOB_HEADER_BYTES] = state[:BLOB_HEADER_BYTES]
    off = BLOB_HEADER_BYTES
    for ((start, end),) in sections:
        _U32.pack_into(out.data, off, n_stream)
        off += 4
        out[off : off + end - start] = state[start:end]
        off += end - start
        out[off : off + len(empty)] = np.frombuffer(empty, dtype=np.uint8)
        off += len(empty)
    return out


def to_one_stream(state: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """The blob of one sequence captured in a context of several streams, in the 1-stream layout.

    ValueError when a section holds cells in more than one stream (a unified cache shares streams
    between sequences: not what this converts) or does not parse.
    """
    sections = _sections(state)
    if all(len(streams) == 1 for streams in sections):
        return state
    chosen: list[tuple[int, int]] = []
    for streams in sections:
        full = [(start, end) for start, end in streams if _U32.unpack_from(state.data, start)[0] > 0]
        if len(full) > 1:
            raise ValueError("its cells lie in more than one stream")
        chosen.append(full[0] if full else streams[0])
    size = BLOB_HEADER_BYTES + sum(4 + end - start for start, end in chosen)
    out = np.empty(size, dtype=np.uint8)
    out[:BLOB_HEADER_BYTES] = state[:BLOB_HEADER_BYTES]
    off = BLOB_HEADER_BYTES
    for start, end in chosen:
        _U32.pack_into(out.data, off, 1)
        off += 4
        out[off : off + end - start] = state[start:end]
        off += end - start
    return out


def _sections(state: npt.NDArray[np.uint8]) -> list[list[tuple[int, int]]]:
    """Per cache section, the byte range of each stream (its cell count, cells and rows)."""
    read_header(state)
    buf = state.data
    sections: list[list[tuple[int, int]]] = []
    off = BLOB_HEADER_BYTES
    try:
        while off < len(buf):
            n_stream = _U32.unpack_from(buf, off)[0]
            if not 0 < n_stream <= _MAX_STREAMS:
                raise ValueError(f"implausible stream count {n_stream}")
            off += 4
            streams = []
            for _ in range(n_stream):
                start = off
                n = _U32.unpack_from(buf, off)[0]
                off += 4
                if n:
                    if off + n * CELL_META_BYTES > len(buf):
                        raise ValueError("cell list runs past the end")
                    meta = state[off : off + n * CELL_META_BYTES].view("<i4").reshape(n, 3)
                    if not np.all(meta[:, 1] == 1):
                        raise ValueError("cells of several sequences, or a cell layout with extensions")
                    off = parse_layers(state, off + n * CELL_META_BYTES, n)[2]
                streams.append((start, off))
            sections.append(streams)
    except struct.error as exc:
        raise ValueError(f"truncated state: {exc}") from None
    if off != len(buf) or not sections:
        raise ValueError("state does not end where its sections do")
    return sections
