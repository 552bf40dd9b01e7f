"""Where a prompt may be split and still read bit for bit as a cold read: measured, not assumed.

llama.cpp's results can depend on where a prompt is split into batches: its quantized CPU kernels
group rows (Gemma-3-270M Q4_K_M: by 4), and which grouping a build uses depends on the CPU, the
weight type and the backend. A restore splits the prompt at the snapshot's end, so snapshots are
saved only at multiples of an alignment where splitting changes nothing.

`measure_alignment` finds it with a short self-test: a probe prompt of 128 tokens is read whole,
then split after 64 + a and 64 + 3a tokens for a = 1, 2, 4, ..., 32 (multiples of a, not of 2a;
the second where the probe is long enough), 16 tokens before its end (a short last batch, as a short
question leaves, for a <= 16) and after 64; the alignment is the finest a whose
splits, and every coarser one's, give the last token's logits of the whole read bit for bit. It
costs a dozen reads of 128 tokens (seconds on a small model on 2 cores), once per model
fingerprint: the result is kept with the fingerprint's notes in the cache directory and in the
process. Sliding-window models keep 64 (see below). None means no split point holds: such a model
is not cached. Where a split may fall besides the alignment (clear of both ends of a cold read's
batch) is `stored.read_grid`.
"""

from __future__ import annotations

import logging
import threading

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.setup.openmp_teams import on_passing_thread
from snapcache.llama.templates.chat_prefix import text_prompt_tokens

__all__ = ["COARSEST_ALIGNMENT", "PROBE_TOKENS", "known", "measure_alignment", "remember", "remembered"]

_log = logging.getLogger("snapcache")

COARSEST_ALIGNMENT = 64
PROBE_TOKENS = 128
_SPLIT_BASE = 64
_SHORT_TAIL = 16
_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
_PROBE_TEXT = (
    "A careful assistant reads the whole request before it acts. It names the files it will touch, "
    "asks before it deletes anything, and reports what it did in one or two plain sentences. "
)
# Measured alignments by fingerprint, for every Llama of this process (None: no split point holds).
_measured: dict[str, int | None] = {}
_lock = threading.Lock()


def remembered(fingerprint: str) -> tuple[bool, int | None]:
    """(known, alignment) for a fingerprint measured in this process."""
    with _lock:
        return (fingerprint in _measured, _measured.get(fingerprint))


def remember(fingerprint: str, alignment: int | None) -> None:
    with _lock:
        _measured[fingerprint] = alignment


def known(fingerprint: str, notes: FingerprintNotes) -> tuple[bool, int | None]:
    """(known, alignment) for a fingerprint: measured in this process, else noted in `notes`."""
    found, measured = remembered(fingerprint)
    return (found, measured) if found else notes.alignment(fingerprint)


def measure_alignment(llm: llama_cpp.Llama) -> int | None:
    """The finest split alignment that keeps this Llama's results exact (see the module docstring).

    Uses the Llama's context and leaves it empty. A context too small for the probe gets the
    coarsest alignment, the one snapcache has always used.
    """
    if int(llama_cpp.llama_model_n_swa(llm.model)) > 0 and bool(llm.context_params.swa_full):
        # A full-size window cache keeps the coarsest: restored on finer points, Gemma-3-270M drifted
        # from a cold read in a chat test although this probe found 4-token splits exact (the probe
        # stays inside one window, and a restore pads the window of such a cache). A window-sized
        # cache is restored as the ring a cold read leaves, cell for cell, and measured: its finer
        # points pass the Gemma tool and chat tests since a read stops only where `read_grid` says
        # (a batch of under 8 tokens reads otherwise than a cold read's), and the batched scheduler
        # copies a sequence it cuts back whole (`SequenceContext.copy`; a state copy holds only the
        # window of its last token, so a cut to a finer point fell back to a 64-token one).
        return COARSEST_ALIGNMENT
    tokens = _probe_tokens(llm)
    if len(tokens) < PROBE_TOKENS or int(llm.n_ctx()) <= PROBE_TOKENS + 1:
        return COARSEST_ALIGNMENT
    # Its decodes leave no OpenMP team behind on the caller's thread (see `openmp_teams`).
    return on_passing_thread(lambda: _probed_alignment(llm, tokens))


def _probed_alignment(llm: llama_cpp.Llama, tokens: list[int]) -> int | None:
    try:
        whole = _last_logits(llm, [tokens])
        exact = {
            alignment: all(
                np.array_equal(_last_logits(llm, [tokens[:split], tokens[split:]]), whole)
                for split in _splits(alignment)
            )
            for alignment in _CANDIDATES
        }
    finally:
        llm.reset()  # type: ignore[no-untyped-call]  # the next eval clears the sequence from 0
    for alignment in _CANDIDATES:
        if all(exact[coarser] for coarser in _CANDIDATES if coarser >= alignment):
            _log.debug("prompt split alignment measured: %d tokens (%s)", alignment, exact)
            return alignment
    _log.debug("no prompt split alignment keeps results exact: %s", exact)
    return None


def _splits(alignment: int) -> list[int]:
    """Split points that are multiples of `alignment` but not of twice it: 64 + a, and 64 + 3a where
    the probe is long enough (one split can agree by chance)."""
    if alignment >= _SPLIT_BASE:
        return [_SPLIT_BASE]
    splits = [_SPLIT_BASE + k * alignment for k in (1, 3) if _SPLIT_BASE + k * alignment < PROBE_TOKENS - 8]
    if (PROBE_TOKENS - _SHORT_TAIL) % alignment == 0:
        splits.append(PROBE_TOKENS - _SHORT_TAIL)  # a short last batch, as a short question leaves
    return splits


def _probe_tokens(llm: llama_cpp.Llama) -> list[int]:
    tokens = text_prompt_tokens(llm, _PROBE_TEXT * 16, add_eos=False)
    return tokens[:PROBE_TOKENS]


def _last_logits(llm: llama_cpp.Llama, parts: list[list[int]]) -> npt.NDArray[np.float32]:
    """The last token's logits after reading `parts` one eval each, from an empty context."""
    llm.reset()  # type: ignore[no-untyped-call]
    for part in parts:
        llm.eval(part)
    # Llama.scores holds no logits unless the Llama was built with logits_all: ask llama.cpp.
    n_vocab = int(llm.n_vocab())
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(logits, shape=(n_vocab,)).astype(np.float32, copy=True)
