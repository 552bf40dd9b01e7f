"""One llama.cpp context with several sequences beside a Llama's own: decode, clear, capture, restore.

The context is made from the Llama's model (its weights are held once) with the Llama's own
context settings (cache types, flash attention, sliding-window size, RoPE, threads, batch sizes),
but `n_seq_max` sequences and `kv_unified = false`: one KV stream per sequence, each of the
Llama's `n_ctx` cells (or `seq_ctx`; rounded up to llama.cpp's 256), so that every request can use
as many tokens as the Llama's own context allows, and memory grows with the number of sequences.
Measured (docs/how-it-works/architecture.md, what llama.cpp does underneath): with a stream per
sequence, a sequence prefilled, restored or stepped alone gives bit for bit the logits of a
1-sequence context, whatever the other sequences hold.

States go in and out in the 1-stream layout the Llama's own context uses (`_streams`), so that
they are stored under the Llama's fingerprint, and `CachedLlama`, `snapcache warm` and this
context serve one another.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.errors import ModelError
from snapcache.formats.threads import RESTORE_THREADS
from snapcache.key import TokenArray
from snapcache.llama.batch._streams import to_one_stream, to_streams
from snapcache.llama.state.capture_buffer import CaptureBuffer
from snapcache.llama.state.host_memory import pinned_memory_for
from snapcache.llama.state.sequences import CapturedState, _checked_blob, reset_head, window_cells
from snapcache.llama.state.window_cuts import window_cuts_back
from snapcache.snapshot import Snapshot

__all__ = ["Chunk", "SequenceContext"]

_log = logging.getLogger("snapcache")

_FLAGS = llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE
_CTX_PAD = 256  # llama.cpp rounds each stream's cells up to this


@dataclass(frozen=True, slots=True)
class Chunk:
    """Tokens of one sequence for one decode, from position `start`; `logits`: the last one's."""

    seq_id: int
    tokens: Sequence[int] | npt.NDArray[np.int32]
    start: int
    logits: bool


class SequenceContext:
    """A context of `n_seq` sequences on `llm`'s model (see the module docstring); `close` frees it."""

    def __init__(self, llm: llama_cpp.Llama, n_seq: int, seq_ctx: int | None = None) -> None:
        self.llm = llm
        self.n_seq = n_seq
        # What one request may hold: the Llama's own context size, as on its single-sequence path,
        # or less where the caller keeps the memory down (`seq_ctx`).
        self.n_ctx = int(llm.n_ctx()) if seq_ctx is None else min(int(llm.n_ctx()), seq_ctx)
        self.n_batch = int(llm.n_batch)
        per_seq = -(-self.n_ctx // _CTX_PAD) * _CTX_PAD
        params = type(llm.context_params).from_buffer_copy(llm.context_params)
        params.n_seq_max = n_seq
        params.kv_unified = False
        params.n_ctx = per_seq * n_seq
        params.embeddings = False
        self.ctx = llama_cpp.llama_init_from_model(llm.model, params)
        if not self.ctx:
            raise ModelError(f"llama.cpp could not make a context of {n_seq} sequences of {per_seq} tokens")
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        # The window cache's cells per stream (0: none or full-size), and the sequences restored
        # with masked cells below their window (`ring_window`, `pad_window`): the token count
        # restored; they cannot be cut back further than one token short of it.
        self.window_cells = window_cells(llm, per_seq)
        self._restored: dict[int, int] = {}
        # The sequences of stream copies that llama.cpp makes at the next decode (`_copy_stream`).
        self._unsettled: set[int] = set()
        self.n_stream = 1 if n_seq == 1 else n_seq
        capacity = max(self.n_batch, n_seq)
        self._batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        self._capacity = capacity
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(capacity,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(capacity,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(capacity,))
        self._logits = np.ctypeslib.as_array(self._batch.logits, shape=(capacity,))
        self._seq_rows = [self._batch.seq_id[i] for i in range(capacity)]
        self._n_seq_id[:] = 1
        self._vocab = llm._model.vocab
        # Pinned memory that states pass through on their way to and from a GPU (`host_memory`):
        # llama.cpp copies from and into it at the bus's speed. None where the cache is in host memory.
        pinned = pinned_memory_for(llm)
        self._staging = None if pinned is None else CaptureBuffer(pinned)

    @property
    def restore_buffer(self) -> CaptureBuffer | None:
        """Where a restore into this context may assemble its blob: the pinned staging buffer when a
        blob goes in as it is (one stream), else None (`to_streams` copies it into the buffer)."""
        return self._staging if self.n_stream == 1 else None

    @property
    def restore_threads(self) -> int:
        """How many threads a restore into this context may use (see `threads.wider`)."""
        return RESTORE_THREADS if self._staging is None else self._staging.workers

    def close(self) -> None:
        self._staging = None  # its pinned memory goes once a save no longer reads from it
        if self.ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def decode(self, chunks: Sequence[Chunk]) -> tuple[int, list[int]]:
        """One `llama_decode` of `chunks`: (llama.cpp's return code, each chunk's last batch row)."""
        n = 0
        rows = []
        for chunk in chunks:
            m = len(chunk.tokens)
            if m == 0 or n + m > self._capacity:
                raise ValueError(f"a chunk of {m} tokens does not fit a batch of {self._capacity}")
            self._tokens[n : n + m] = chunk.tokens
            self._pos[n : n + m] = np.arange(chunk.start, chunk.start + m, dtype=np.int32)
            self._logits[n : n + m] = 0
            self._logits[n + m - 1] = 1 if chunk.logits else 0
            for row in self._seq_rows[n : n + m]:
                row[0] = chunk.seq_id
            n += m
            rows.append(n - 1)
        self._batch.n_tokens = n
        code = int(llama_cpp.llama_decode(self.ctx, self._batch))
        if code == 0:
            self._unsettled.clear()  # llama.cpp copied the pending streams first
        return code, rows

    def clear(self, seq_id: int) -> None:
        """Free every cell of the sequence."""
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        self._restored.pop(seq_id, None)

    def cut(self, seq_id: int, n_tokens: int) -> bool:
        """Drop the sequence's cells from position `n_tokens` on; False where llama.cpp cannot, or
        where masked cells of a restore would come into view."""
        if n_tokens < self._restored.get(seq_id, 0) - 1:
            return False
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, seq_id, n_tokens, -1))

    def can_cut(self, seq_id: int, n_tokens: int) -> bool:
        """Whether the sliding-window sequence cut back to `n_tokens` reads on as a cold read
        (`window_cuts_back`)."""
        return window_cuts_back(self._memory, self.llm.model, seq_id, n_tokens, self.window_cells)

    def last_position(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self._memory, seq_id))

    def first_position(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self._memory, seq_id))

    def copy(self, source: int, target: int, cut_to: int | None = None) -> bool:
        """Make `target` hold what `source` holds, to be cut back to its first `cut_to` tokens next
        (None: not cut). A window-sized sliding-window cache that is to be cut is copied whole
        (`_copy_stream`): a state copy holds only the window of the source's last token, and the
        cut needs the cut point's. Otherwise a state copy, which moves only the cells in use."""
        if cut_to is not None and self.window_cells and cut_to <= self.last_position(source):
            return self._copy_stream(source, target)
        return self._copy_state(source, target)

    def _copy_stream(self, source: int, target: int) -> bool:
        """llama.cpp's own sequence copy: every cell of the source's stream, its masked window cells
        too (llama-kv-cache.cpp seq_cp). The cells' metadata is copied now and the tensors at the
        start of the next decode, so until then neither stream's data is read or written (`_settle`)."""
        self.clear(target)
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, -1, -1)
        held = (self.first_position(source), self.last_position(source))
        if (self.first_position(target), self.last_position(target)) != held:
            self.clear(target)  # a memory that does not copy across streams
            return False
        self._unsettled.update((source, target))
        if source in self._restored:
            self._restored[target] = self._restored[source]
        return True

    def _settle(self, seq_id: int) -> None:
        """Before `seq_id`'s data is read or written: let llama.cpp copy the streams of the pending
        `_copy_stream`s, which it does at the start of a decode, by decoding one token after what
        `seq_id` holds and cutting it off again (a cell past its last position, which a read on
        writes over: what it holds reads on as before). ModelError where llama.cpp refuses."""
        if seq_id not in self._unsettled:
            return
        position = self.last_position(seq_id) + 1
        code, _ = self.decode([Chunk(seq_id, [0], position, False)])
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, position, -1)
        if code != 0:
            raise ModelError(f"llama.cpp did not copy the streams of sequence {seq_id} (decode: {code})")

    def _copy_state(self, source: int, target: int) -> bool:
        """Copy through llama.cpp's state of `source` (only the window's unmasked cells of a
        window-sized cache), laid out again for `target`."""
        self.clear(target)
        try:
            self._settle(source)
            self._settle(target)
        except ModelError:
            return False
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ctx, source, _FLAGS))
        if size <= 0:
            return False
        buffer = np.empty(size, dtype=np.uint8)
        pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        written = int(llama_cpp.llama_state_seq_get_data_ext(self.ctx, pointer, size, source, _FLAGS))
        if written <= 0 or written > size:
            return False
        # llama.cpp writes only the window's unmasked cells: laid out again as a cold read has them
        # (as `restore` does), or the copy's next tokens add up in another order.
        n = self.last_position(source) + 1
        blob = buffer[:written]
        try:
            blob = to_one_stream(blob) if self.n_stream > 1 else blob
        except ValueError:
            return False
        reason, blob, padded = _checked_blob(self.llm, blob, n, window_size=self.window_cells)
        if reason is not None:
            return False
        blob = to_streams(blob, self.n_stream)
        reset_head(self._memory, target)
        pointer = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        loaded = int(llama_cpp.llama_state_seq_set_data_ext(self.ctx, pointer, blob.nbytes, target, _FLAGS))
        if padded:
            self._restored[target] = n
        if loaded <= 0 or self.last_position(target) != self.last_position(source):
            self.clear(target)
            return False
        return True

    def capture(self, seq_id: int, tokens: TokenArray) -> CapturedState:
        """The sequence's state, in the 1-stream layout, keyed by `tokens` (all it holds)."""
        if self.last_position(seq_id) != len(tokens) - 1:
            raise ModelError(f"sequence {seq_id} does not hold exactly {len(tokens)} tokens")
        self._settle(seq_id)
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq_id, _FLAGS))
        if size <= 0:
            raise ModelError(f"llama.cpp reports no state for sequence {seq_id}")
        # Through pinned memory where the state is converted anyway (several streams): the copy
        # into the 1-stream layout is the one the blob gets.
        staging = self._staging if self.n_stream > 1 else None
        buffer = np.empty(size, dtype=np.uint8) if staging is None else staging.lease(size)
        try:
            pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            written = int(llama_cpp.llama_state_seq_get_data_ext(self.ctx, pointer, size, seq_id, _FLAGS))
            if written <= 0 or written > size:
                raise ModelError(f"llama.cpp failed to copy the state of sequence {seq_id}")
            try:
                blob = to_one_stream(buffer[:written])
            except ValueError as exc:
                raise ModelError(f"the state of sequence {seq_id} does not convert: {exc}") from None
            if staging is not None and np.shares_memory(blob, buffer):
                blob = blob.copy()  # never the case for a state of several streams, which converts
        finally:
            if staging is not None:
                staging.release()
        return CapturedState(tokens=tokens, state=blob.data, logits=None)

    def _laid_out(self, state: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.uint8], Callable[[], None]]:
        """The 1-stream blob `state` in this context's layout (`to_streams`), in pinned memory where
        the cache is on a GPU and the buffer is free, and what gives that memory back. ValueError
        when it does not convert."""
        staging = self._staging
        if staging is None:
            return to_streams(state, self.n_stream), _nothing
        if self.n_stream > 1:
            laid_out = to_streams(state, self.n_stream, into=staging.try_lease)
            return laid_out, staging.release if staging.holds(laid_out) else _nothing
        return staging.holding(state)

    def restore(self, seq_id: int, snapshot: Snapshot, *, window_padded: bool) -> bool:
        """Load `snapshot` (1-stream layout, checked for the Llama's own context) into `seq_id`;
        False, with the sequence cleared, when it does not fit or llama.cpp refuses it."""
        n = len(snapshot.tokens)
        if n < 1 or n >= self.n_ctx or n != snapshot.key.token_count:
            return False
        if int(snapshot.tokens.max()) >= int(self.llm.n_vocab()):
            return False
        try:
            state = np.frombuffer(snapshot.state, dtype=np.uint8)
        except (TypeError, ValueError):
            return False
        reason, state, padded = _checked_blob(
            self.llm, state, n, window_padded, window_size=self.window_cells
        )
        if reason is None:
            try:
                state, release = self._laid_out(state)
            except ValueError as exc:
                reason = str(exc)
        if reason is not None:
            _log.warning("snapshot %s not restored into a sequence: %s", snapshot.key.id[:12], reason)
            return False
        self.clear(seq_id)
        try:
            self._settle(seq_id)
        except ModelError as exc:
            release()
            _log.warning("snapshot %s not restored into a sequence: %s", snapshot.key.id[:12], exc)
            return False
        reset_head(self._memory, seq_id)
        try:
            pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            loaded = int(
                llama_cpp.llama_state_seq_set_data_ext(self.ctx, pointer, state.nbytes, seq_id, _FLAGS)
            )
        finally:
            release()
        if loaded <= 0 or self.last_position(seq_id) != n - 1:
            self.clear(seq_id)
            _log.warning(
                "llama.cpp refused snapshot %s (%d tokens) for sequence %d", snapshot.key.id[:12], n, seq_id
            )
            return False
        if padded:
            self._restored[seq_id] = n
        return True


def _nothing() -> None:
    pass
