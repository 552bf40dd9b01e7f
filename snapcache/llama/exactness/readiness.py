"""Whether one Llama can be cached now: its fingerprint taken again, its split alignment known.

Adapters and control vectors can change a Llama between completions, and with them what its states
mean, so the fingerprint is taken again before each completion and each `warm`. An exact hook that
saves also needs the model's prompt split alignment (see `snapcache.llama.exactness.alignment`): remembered in
this process, or in the store's fingerprint notes, or measured once.
"""

from __future__ import annotations

from typing import Protocol

import llama_cpp

from snapcache.llama.exactness import alignment
from snapcache.llama.exactness.fingerprint import fingerprint_of, fingerprint_parts
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.exactness.support import unsupported_reason
from snapcache.llama.stored.read_grid import ReadGrid

__all__ = ["FingerprintKeeper", "Readiness"]

NO_ALIGNMENT = (
    "no prompt split point keeps this model's results exact on this llama.cpp build, "
    "so a restored state would not continue as a cold read; snapshots are neither restored nor saved"
)


class FingerprintKeeper(Protocol):
    """What states are saved and found under: a `PrefixCache`, whose fingerprint `Readiness` keeps."""

    fingerprint: str


class Readiness:
    """Checks one Llama before each completion, and keeps its fingerprint (on `keeper`) and alignment.

    `exact=False` needs neither the alignment nor a model whose restores are exact: states are then
    split anywhere (alignment 1).
    """

    def __init__(
        self, llm: llama_cpp.Llama, keeper: FingerprintKeeper, notes: FingerprintNotes, *, exact: bool
    ) -> None:
        self._llm = llm
        self._keeper = keeper
        self._notes = notes
        self._exact = exact
        # Until measured for the fingerprint; an inexact hook splits anywhere.
        self._alignment = alignment.COARSEST_ALIGNMENT if exact else 1

    @property
    def alignment(self) -> int:
        """The multiple of tokens checkpoints sit on: measured once a check for saving passed, 64 before."""
        return self._alignment

    @property
    def grid(self) -> ReadGrid:
        """Where this Llama's reads may stop and restores start: its batches and `alignment`."""
        return ReadGrid.of(self._llm, self._alignment, exact=self._exact)

    def reason_not(self, *, saving: bool) -> str | None:
        """Why this Llama cannot be cached now, or None; the fingerprint and alignment are current then."""
        llm = self._llm
        if self._exact:
            reason = unsupported_reason(llm)
            if reason is not None:
                return reason
        parts = fingerprint_parts(llm, exact=self._exact)
        fingerprint = fingerprint_of(parts)
        self._keeper.fingerprint = fingerprint
        if not self._exact:
            self._notes.remember(fingerprint, parts, 1)
        elif saving:
            known, measured = alignment.known(fingerprint, self._notes)
            if not known:
                measured = alignment.measure_alignment(llm)
            alignment.remember(fingerprint, measured)
            self._notes.remember(fingerprint, parts, measured)
            if measured is None:
                return NO_ALIGNMENT
            self._alignment = measured
        else:
            # Not saving: the alignment a writer measured for the fingerprint, where one did (it
            # says how short a piece of a batch may be read, see `ReadGrid`); none is measured here.
            known, measured = alignment.known(fingerprint, self._notes)
            if known and measured is not None:
                self._alignment = measured
        return None
