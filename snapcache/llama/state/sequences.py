"""Capture and restore the llama.cpp state of one sequence on a `llama_cpp.Llama`.

This is the only module that calls `llama_state_seq_*`. After a restore, the Llama's own bookkeeping
(`n_tokens`, `input_ids`) says that the snapshot's tokens are in its context, so llama-cpp-python's
`generate` evaluates only the tokens after them. A prompt exactly as long as the snapshot works too:
`generate` then drops the last cell and evaluates that one token again to get fresh logits, which is
valid even for sliding-window caches because a state always holds the whole window of its last token.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument, ModelError
from snapcache.key import IMAGE_KEY_BASE, TokenArray, Tokens, as_token_array
from snapcache.llama.state._state_layout import (
    HEADER_BYTES,
    cells_are_positions,
    pad_window,
    padding_cells,
    parse_sections,
    read_header,
    ring_window,
)
from snapcache.llama.state.capture_buffer import capture_buffer
from snapcache.llama.state.window_cuts import window_cuts_back
from snapcache.snapshot import Snapshot

__all__ = [
    "CapturedState",
    "can_truncate",
    "can_truncate_to",
    "capture_sequence",
    "pads_windows",
    "restore_sequence",
    "truncate_sequence",
    "window_cells",
]

_log = logging.getLogger("snapcache")

_FLAGS = llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE
# Sequences restored with a padded window (see `pad_window`) or a ring of masked fillers and the
# window (`ring_window`), by Llama and seq id: the token count
# restored. Their window cache holds zero cells below the restored window, so they cannot be cut
# back further than one token short of it, although those positions have cells.
_padded_restores: weakref.WeakKeyDictionary[llama_cpp.Llama, dict[int, int]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class CapturedState:
    """One sequence's state: the tokens whose KV it holds, the raw bytes, and last-token logits if kept.

    `state` is a view of a buffer of its own, not copied again: a store copies what it keeps. When
    `release` is set, the buffer is lent (see `capture_buffer`): call it, once, when `state` is no
    longer needed, and read `state` no more after.
    """

    tokens: TokenArray
    state: memoryview
    logits: npt.NDArray[np.float32] | None
    release: Callable[[], None] | None = None


def capture_sequence(
    llm: llama_cpp.Llama, seq_id: int = 0, tokens: TokenArray | None = None, *, reuse: bool = False
) -> CapturedState:
    """Copy out the state of `seq_id`, keyed by the tokens the Llama evaluated (`input_ids[:n_tokens]`).

    `tokens`: those very tokens, validated by the caller (see `as_token_array`): they key the capture
    as they are, once compared with the context's, rather than a copy of `input_ids`. `reuse`: into
    the Llama's capture buffer (see `capture_buffer`), lent until the state's `release`. Raises
    InvalidArgument when nothing has been evaluated and ModelError when llama.cpp fails or the
    context does not hold `tokens`.
    """
    n_tokens = int(llm.n_tokens)
    if n_tokens < 1:
        raise InvalidArgument("nothing to capture: the Llama has not evaluated any tokens")
    if tokens is not None:
        tokens = as_token_array(tokens)
        if len(tokens) != n_tokens or not np.array_equal(llm.input_ids[:n_tokens], tokens):
            raise ModelError(f"the context does not hold the {len(tokens)} tokens a capture was asked for")
    memory = llama_cpp.llama_get_memory(llm.ctx)
    last_pos = int(llama_cpp.llama_memory_seq_pos_max(memory, seq_id))
    if last_pos != n_tokens - 1:
        raise ModelError(
            f"sequence {seq_id} ends at position {last_pos}, but the Llama says it holds {n_tokens} tokens"
        )
    size = int(llama_cpp.llama_state_seq_get_size_ext(llm.ctx, seq_id, _FLAGS))
    if size <= 0:
        raise ModelError(f"llama.cpp reports no state for sequence {seq_id}")
    lent = capture_buffer(llm) if reuse else None
    buffer = np.empty(size, dtype=np.uint8) if lent is None else lent.lease(size)
    try:
        pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        written = int(llama_cpp.llama_state_seq_get_data_ext(llm.ctx, pointer, size, seq_id, _FLAGS))
        if written <= 0 or written > size:
            raise ModelError(f"llama.cpp failed to copy the state of sequence {seq_id}")
        if tokens is None:
            tokens = as_token_array(llm.input_ids[:n_tokens])
        logits = _last_logits(llm)
    except BaseException:
        if lent is not None:
            lent.release()
        raise
    release = None if lent is None else _once(lent.release)
    return CapturedState(tokens=tokens, state=buffer[:written].data, logits=logits, release=release)


def _once(release: Callable[[], None]) -> Callable[[], None]:
    """`release`, made safe to call more than once (a save's error paths may each call it)."""
    first = threading.Lock()

    def release_once() -> None:
        if first.acquire(blocking=False):  # held for good by the first call
            release()

    return release_once


def restore_sequence(
    llm: llama_cpp.Llama,
    snapshot: Snapshot,
    prompt_tokens: Tokens | None = None,
    seq_id: int = 0,
    *,
    window_padded: bool = False,
) -> bool:
    """Load `snapshot` into `seq_id` so that the Llama continues after its tokens; False on a miss.

    Checks before any byte reaches llama.cpp: the snapshot's tokens are a prefix of `prompt_tokens`
    (when given), the context has room for them plus one token, and the blob's header matches this
    context. When llama.cpp still refuses the state, the sequence is cleared and the Llama is left
    empty and usable, so the caller can fall back to a cold prefill. A sliding-window model's window
    cells go where a cold prefill leaves them (see `pad_window`), so greedy output matches it exactly;
    `window_padded` says the snapshot's window cache is padded so already (see `pads_windows`).
    """
    tokens = snapshot.tokens
    n = len(tokens)
    reason = _rejection(llm, snapshot, prompt_tokens)
    if reason is not None:
        _log.debug("snapshot %s not restored: %s", snapshot.key.id[:12], reason)
        return False
    try:
        state = np.frombuffer(snapshot.state, dtype=np.uint8)
    except (TypeError, ValueError):
        _log.warning("snapshot %s not restored: its state is not a contiguous buffer", snapshot.key.id[:12])
        return False
    reason, state, padded = _checked_blob(llm, state, n, window_padded)
    if reason is not None:
        _log.warning("snapshot %s does not fit this context, not restored: %s", snapshot.key.id[:12], reason)
        return False

    memory = llama_cpp.llama_get_memory(llm.ctx)
    _clear(llm, memory, seq_id)
    reset_head(memory, seq_id)
    # Copied first into the Llama's pinned buffer where its K/V cache is on a GPU and the blob is
    # elsewhere (a whole snapshot, a padded window): llama.cpp copies it to the device from there.
    state, release = capture_buffer(llm).holding(state)
    try:
        pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        loaded = int(llama_cpp.llama_state_seq_set_data_ext(llm.ctx, pointer, state.nbytes, seq_id, _FLAGS))
    finally:
        release()
    last_pos = int(llama_cpp.llama_memory_seq_pos_max(memory, seq_id))
    if loaded <= 0 or last_pos != n - 1:
        _clear(llm, memory, seq_id)
        _log.warning(
            "llama.cpp refused snapshot %s (%d tokens); the sequence was cleared",
            snapshot.key.id[:12],
            n,
        )
        return False

    llm.input_ids[:n] = tokens
    llm.n_tokens = n
    if padded:
        _padded_restores.setdefault(llm, {})[seq_id] = n
    # No logits come with a state: generate() must evaluate at least one token before sampling.
    llm._requires_eval = True
    _put_back_logits(llm, snapshot.logits, n)
    return True


def pads_windows(llm: llama_cpp.Llama) -> bool:
    """Whether a state restored into this Llama has its sliding-window cache padded (`pad_window`):
    a sliding-window model with a full-size window cache (`swa_full`, llama-cpp-python's default)."""
    return int(llama_cpp.llama_model_n_swa(llm.model)) > 0 and bool(llm.context_params.swa_full)


def window_cells(llm: llama_cpp.Llama, n_ctx: int | None = None) -> int:
    """The cells of a window-sized sliding-window cache in this Llama's context (or in a stream of
    `n_ctx` cells with its settings), as llama-kv-cache-iswa.cpp sizes it: GGML_PAD(min(n_ctx,
    n_swa + n_ubatch), 256) per stream; 0 without one (no sliding window, or `swa_full`)."""
    params = llm.context_params
    n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
    if n_swa <= 0 or bool(params.swa_full):
        return 0
    if n_ctx is None:
        n_seq = int(llama_cpp.llama_n_seq_max(llm.ctx))
        if n_seq > 1 and not bool(params.kv_unified):
            n_ctx = int(llm.n_ctx()) // n_seq
        else:
            n_ctx, n_swa = int(llm.n_ctx()), n_swa * n_seq
    return -(-min(n_ctx, n_swa + int(params.n_ubatch)) // 256) * 256


def reset_head(memory: Any, seq_id: int) -> None:
    """Put the (empty) sequence's stream's search head back at slot 0, where `ring_window` expects a
    restore to start: llama.cpp's seq_add over no cells sets it to 0 (llama-kv-cache.cpp seq_add)."""
    llama_cpp.llama_memory_seq_add(memory, seq_id, 0, 1, 1)


def can_truncate(llm: llama_cpp.Llama) -> bool:
    """Whether the Llama's memory can be cut back to any earlier length.

    False for sliding-window models (their cache keeps only the window of the last token) and for
    recurrent or hybrid models (their state has no positions to cut).
    """
    model = llm.model
    return (
        int(llama_cpp.llama_model_n_swa(model)) == 0
        and not llama_cpp.llama_model_is_recurrent(model)
        and not llama_cpp.llama_model_is_hybrid(model)
    )


def can_truncate_to(llm: llama_cpp.Llama, n_tokens: int, seq_id: int = 0) -> bool:
    """Whether the sequence can be cut back to its first `n_tokens` (0 <= n_tokens <= n_tokens held).

    Always for clearing and for cutting back by one token, which a sliding window still covers; for
    any length where `can_truncate`. A sliding-window cache can be cut back while it still holds
    its sequence's own cells from position 0 on (a context read cold, not one restored from a state
    that keeps just the window of its last token), and a window-sized one while it still holds the
    window of the cut point (`window_cut_reads_cold`).
    """
    current = int(llm.n_tokens)
    if n_tokens == 0 or n_tokens >= current - 1 or can_truncate(llm):
        return True
    model = llm.model
    if llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model):
        return False
    restored = _padded_restores.get(llm, {}).get(seq_id)
    if restored is not None and n_tokens < restored - 1:
        return False
    memory = llama_cpp.llama_get_memory(llm.ctx)
    return window_cuts_back(memory, model, seq_id, n_tokens, window_cells(llm))


def truncate_sequence(llm: llama_cpp.Llama, n_tokens: int, seq_id: int = 0) -> bool:
    """Cut the sequence back to its first `n_tokens`; False (nothing changed) where the memory cannot.

    See `can_truncate_to` for which lengths a memory can be cut back to.
    """
    current = int(llm.n_tokens)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or not 0 <= n_tokens <= current:
        raise InvalidArgument(f"n_tokens must lie between 0 and {current}, got {n_tokens!r}")
    if n_tokens == current:
        return True
    memory = llama_cpp.llama_get_memory(llm.ctx)
    if n_tokens == 0:
        _clear(llm, memory, seq_id)
        return True
    if not can_truncate_to(llm, n_tokens, seq_id):
        return False
    if not llama_cpp.llama_memory_seq_rm(memory, seq_id, n_tokens, -1):
        return False
    llm.n_tokens = n_tokens
    llm._requires_eval = True
    return True


def _rejection(llm: llama_cpp.Llama, snapshot: Snapshot, prompt_tokens: Tokens | None) -> str | None:
    """Why `snapshot` cannot serve this Llama and prompt (a plain miss), or None."""
    tokens = snapshot.tokens
    n = len(tokens)
    if n < 1 or n != snapshot.key.token_count:
        return f"it holds {n} tokens but its key says {snapshot.key.token_count}"
    if memoryview(snapshot.state).nbytes <= HEADER_BYTES:
        return "its state is empty"
    # llama.cpp may round n_ctx up; llama-cpp-python's token buffer keeps the size that was asked for.
    n_ctx = min(int(llm.n_ctx()), len(llm.input_ids))
    if n >= n_ctx:
        return f"{n} tokens leave no room in a context of {n_ctx}"
    if prompt_tokens is not None:
        prompt = as_token_array(prompt_tokens)
        if len(prompt) < n or not np.array_equal(prompt[:n], tokens):
            return "its tokens are not a prefix of the prompt"
    outside = tokens[tokens >= int(llm.n_vocab())]
    # An image's key tokens (`IMAGE_KEY_BASE`) only for a prompt with that image at that place.
    if outside.size and (prompt_tokens is None or int(outside.min()) < IMAGE_KEY_BASE):
        return "its tokens lie outside this model's vocabulary"
    return None


def _checked_blob(
    llm: llama_cpp.Llama,
    state: npt.NDArray[np.uint8],
    n: int,
    window_padded: bool = False,
    window_size: int | None = None,
) -> tuple[str | None, npt.NDArray[np.uint8], bool]:
    """(why the blob does not fit this context, ...) or (None, the blob to hand to llama.cpp, whether
    its window is padded or laid out as a ring, here or before: `window_padded`, checked).
    `window_size`: the window cache's cells per stream of the context it goes to (None: the Llama's,
    `window_cells`)."""
    try:
        header = read_header(state)
    except ValueError as exc:
        return str(exc), state, False
    expected_streams = 1 if bool(llm.context_params.kv_unified) else int(llama_cpp.llama_n_seq_max(llm.ctx))
    if header.n_stream != expected_streams:
        return f"it has {header.n_stream} KV streams, this context {expected_streams}", state, False
    model = llm.model
    if llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model):
        return None, state, False
    # The full-attention cache comes first and holds a cell for every position 0..n-1.
    if header.cell_count != n:
        return f"its first cache holds {header.cell_count} cells, expected {n}", state, False
    try:
        sections = parse_sections(state)
    except ValueError:
        # Layouts this parser does not know (several streams, per-cell extensions): check the cell
        # list and leave the rest to llama.cpp's own checks.
        if cells_are_positions(state, n):
            return None, state, False
        return "its cell list is not positions 0..n-1 of one sequence", state, False
    first = sections[0].positions
    if len(first) != n or int(first[0]) != 0:
        return "its first cache does not hold positions 0..n-1", state, False
    if any(len(s.positions) and int(s.positions[-1]) != n - 1 for s in sections[1:]):
        return "its window cache does not end at the last token", state, False
    if window_padded:
        if not pads_windows(llm) or len(sections) != 2 or padding_cells(sections[1]) != 0:
            return "its window cache was padded for another kind of context", state, False
        return None, state, True
    if pads_windows(llm):
        padded = pad_window(state, sections)
        if padded is not None:
            return None, padded, True
    ring = window_cells(llm) if window_size is None else window_size
    if ring and len(sections) == 2:
        n_swa = int(llama_cpp.llama_model_n_swa(model))
        try:
            laid_out, fillers = ring_window(state, sections, ring, n_swa)
        except ValueError as exc:
            return str(exc), state, False
        # Padded where the ring holds masked fillers: cut back below them, they would come into view.
        return None, laid_out, fillers
    return None, state, False


def _clear(llm: llama_cpp.Llama, memory: Any, seq_id: int) -> None:
    llama_cpp.llama_memory_seq_rm(memory, seq_id, -1, -1)
    _padded_restores.get(llm, {}).pop(seq_id, None)
    llm.n_tokens = 0
    llm._requires_eval = True


def _last_logits(llm: llama_cpp.Llama) -> npt.NDArray[np.float32] | None:
    """llama-cpp-python keeps per-token logits only with logits_all=True; otherwise there are none."""
    if not getattr(llm, "_logits_all", False):
        return None
    row = np.array(llm.scores[int(llm.n_tokens) - 1], dtype=np.float32)
    row.flags.writeable = False
    return row


def _put_back_logits(llm: llama_cpp.Llama, logits: npt.NDArray[np.float32] | None, n: int) -> None:
    if logits is None or not getattr(llm, "_logits_all", False):
        return
    if logits.shape == (llm.scores.shape[1],) and n <= llm.scores.shape[0]:
        llm.scores[n - 1, :] = logits
