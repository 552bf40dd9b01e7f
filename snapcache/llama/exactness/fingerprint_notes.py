"""What each model fingerprint stood for, kept beside the snapshots, so that a miss can say why.

A fingerprint is a hash: two that differ say nothing about what differed. When a snapshot is saved,
the adapter also hands over the parts it hashed (model content, K/V types, adapters, numerics...),
and the prompt split alignment it measured for them (see `snapcache.llama.exactness.alignment`); they are kept
here, one small JSON file per fingerprint (`fingerprints/<fingerprint>.json`, written
to a temporary file and renamed), or in memory for a RAM-only store. Reading them is best effort: a
missing or damaged note is simply unknown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, TypeGuard

__all__ = ["FingerprintNotes"]

_log = logging.getLogger("snapcache")

_FOLDER = "fingerprints"
_VALID = re.compile(r"^[0-9a-f]{8,128}$")
_MAX_NOTE_BYTES = 1 << 20
# The rule the alignment was measured under. A note of another rule is measured again: before rule 2
# (2026-11-29) sliding-window models with a window-sized cache noted 64 without a probe.
_ALIGNMENT_RULE = 2


class FingerprintNotes:
    """fingerprint -> the parts it hashed; on disk under `directory` when one is given."""

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._folder = None if directory is None else Path(directory) / _FOLDER
        self._known: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def remember(self, fingerprint: str, parts: dict[str, Any], alignment: int | None) -> None:
        """Keep `parts` and the measured `alignment` (None: none holds) for `fingerprint`, once (again
        where the note kept was measured under an older rule)."""
        if not _VALID.match(fingerprint):
            return
        note = {"parts": parts, "alignment": alignment, "alignment_rule": _ALIGNMENT_RULE}
        with self._lock:
            if _current(self._known.get(fingerprint)):
                return
            self._known[fingerprint] = note
        if self._folder is None:
            return
        path = self._folder / f"{fingerprint}.json"
        if _current(self._read(fingerprint)):
            return
        try:
            self._folder.mkdir(mode=0o700, exist_ok=True)
            temporary = path.with_name(f".{fingerprint}.{os.getpid()}.{threading.get_ident()}.tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(note, handle, sort_keys=True)
            os.replace(temporary, path)
        except (OSError, TypeError, ValueError) as exc:
            _log.debug("could not keep the parts of fingerprint %s: %s", fingerprint[:12], exc)

    def recall(self, fingerprint: str) -> dict[str, Any] | None:
        """The parts of `fingerprint`, if known."""
        note = self._note(fingerprint)
        parts = None if note is None else note.get("parts")
        return parts if isinstance(parts, dict) else None

    def alignment(self, fingerprint: str) -> tuple[bool, int | None]:
        """(known, alignment) measured for `fingerprint`; alignment None: no split point holds."""
        note = self._note(fingerprint)
        if not _current(note) or "alignment" not in note:
            return False, None
        value = note["alignment"]
        if value is None:
            return True, None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1 and value & (value - 1) == 0:
            return True, value
        return False, None  # a damaged note: measure again

    def alignments(self) -> dict[str, int | None]:
        """Every fingerprint noted on disk with the alignment measured for it (None: none holds)."""
        if self._folder is None or not self._folder.is_dir():
            return {}
        found: dict[str, int | None] = {}
        for path in sorted(self._folder.glob("*.json")):
            known, value = self.alignment(path.stem)
            if known:
                found[path.stem] = value
        return found

    def _note(self, fingerprint: str) -> dict[str, Any] | None:
        with self._lock:
            if fingerprint in self._known:
                return self._known[fingerprint]
        note = self._read(fingerprint)
        if note is not None:
            with self._lock:
                self._known.setdefault(fingerprint, note)
        return note

    def _read(self, fingerprint: str) -> dict[str, Any] | None:
        """The note on disk, if there is a readable one."""
        if self._folder is None or not _VALID.match(fingerprint):
            return None
        try:
            path = self._folder / f"{fingerprint}.json"
            if path.stat().st_size > _MAX_NOTE_BYTES:
                return None
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return note if isinstance(note, dict) else None


def _current(note: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """Whether `note` was measured under this rule (`_ALIGNMENT_RULE`)."""
    return note is not None and note.get("alignment_rule") == _ALIGNMENT_RULE
