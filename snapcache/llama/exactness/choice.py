"""Whether a Llama's states restore exactly or at any token: asked for, or chosen by the build (`auto`).

Exact (`exact=True`) restores only where a prompt read on from a stored state gives bit for bit a cold
read's results: at the model's measured split alignment (`alignment`), never with flash attention
over an F16/F32 K/V cache (`support`); where neither holds, it caches nothing. Inexact
(`exact=False`) restores at any token, and output may drift from a cold run's. `auto`, the default,
is exact where the build keeps a split prompt's results bit for bit (llama.cpp's CPU backend: the
behaviour of `exact=True` there, unchanged) and inexact where it measures that it cannot (the probe
finds no split point, as on CUDA, or flash attention over an F16/F32 cache): a cache that works on
every backend. The choice is made once per Llama, logged once, and kept apart by fingerprint as
ever: exact and inexact states never mix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import llama_cpp

from snapcache.errors import InvalidArgument
from snapcache.llama.exactness import alignment
from snapcache.llama.exactness.fingerprint import fingerprint_of, fingerprint_parts
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.exactness.support import unsupported_reason

__all__ = ["AUTO", "Exactness", "ExactnessChoice", "choose_exactness", "exactness_of"]

_log = logging.getLogger("snapcache")

AUTO: Literal["auto"] = "auto"
# What a caller asks for: exact, inexact, or the build's choice.
Exactness = bool | Literal["auto"]
_SPLIT_LOST = "no prompt split point keeps this llama.cpp build's results bit for bit"
_FLASH_ATTN = "flash attention over an F16/F32 K/V cache reads short batches with other kernels"
# The choices logged in this process: each once.
_told: set[tuple[str, bool, str]] = set()


@dataclass(frozen=True, slots=True)
class ExactnessChoice:
    """What a Llama's cache does: `exact` or not, what was asked (`True`, `False` or "auto"), and why."""

    exact: bool
    asked: Exactness
    reason: str

    @property
    def mode(self) -> str:
        return "exact" if self.exact else "inexact"

    def describe(self) -> str:
        """One line for a user: what was chosen, by whom, and why."""
        how = "auto" if self.asked == AUTO else "asked for"
        return f"{self.mode} ({how}: {self.reason})"

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "asked": self.asked, "reason": self.reason}


def exactness_of(value: object) -> Exactness:
    """`value` checked as an `exact=` argument: True, False or "auto"."""
    if isinstance(value, bool) or value == AUTO:
        return value
    raise InvalidArgument(f"exact must be True, False or 'auto', got {value!r}")


def choose_exactness(llm: llama_cpp.Llama, asked: Exactness, notes: FingerprintNotes) -> ExactnessChoice:
    """What `asked` comes to on `llm`: itself where it is a bool; for "auto", exact where this build
    keeps a split prompt's results bit for bit (the split alignment measured once per fingerprint,
    remembered in this process and in `notes`), else inexact. An "auto" choice is logged once."""
    asked = exactness_of(asked)
    if asked is True:
        return ExactnessChoice(True, True, "exact=True (--exact): restores only where they stay bit for bit")
    if asked is False:
        return ExactnessChoice(False, False, "exact=False (--inexact): restores at any token")
    if unsupported_reason(llm) is not None:
        choice = ExactnessChoice(False, AUTO, _FLASH_ATTN)
    else:
        split = _split_alignment(llm, notes)
        if split is None:
            choice = ExactnessChoice(False, AUTO, _SPLIT_LOST)
        else:
            where = "at any token" if split == 1 else f"at multiples of {split} tokens"
            kept = f"this build keeps a prompt split {where} bit for bit"
            choice = ExactnessChoice(True, AUTO, kept)
    told = (str(llm.model_path), choice.exact, choice.reason)
    if told not in _told:
        _told.add(told)
        if choice.exact:
            _log.info("exactness: %s", choice.describe())
        else:
            _log.warning(
                "exactness: %s; restored prompts may drift from a cold read (exact=True or --exact "
                "insists on exact restores, and caches nothing here)",
                choice.describe(),
            )
    return choice


def _split_alignment(llm: llama_cpp.Llama, notes: FingerprintNotes) -> int | None:
    """The model's split alignment on this build (None: no split point keeps results exact)."""
    parts = fingerprint_parts(llm, exact=True)
    fingerprint = fingerprint_of(parts)
    known, measured = alignment.known(fingerprint, notes)
    if not known:
        measured = alignment.measure_alignment(llm)
        notes.remember(fingerprint, parts, measured)
    alignment.remember(fingerprint, measured)
    return measured
