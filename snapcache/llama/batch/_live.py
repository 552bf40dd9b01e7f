"""What the sequences of a `Scheduler` hold between requests, and the prefix a new request reuses.

A sequence keeps the prompt its last request read (or restored); the next request of the same scope
reuses the longest prefix any sequence holds: its own sequence cut back, or another's copied in
(`SequenceContext.copy`, a state copy within the context). Cuts fall on the model's split alignment,
where reading on gives bit for bit a cold read; a sliding-window cache is cut back only while it
holds its sequence's cells from position 0 or, window-sized, the window of the cut point
(`SequenceContext.can_cut`), and never below what a padded restore left whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from snapcache.key import SnapshotKey, TokenArray
from snapcache.llama.batch._context import SequenceContext
from snapcache.llama.stored.read_grid import ReadGrid

__all__ = ["Held", "LivePrefixes"]


@dataclass(slots=True)
class Held:
    """The prompt tokens a sequence holds, read as a prompt (or restored) for `scope`.

    `floor`: the shortest length it may be cut back to (a state restored with a padded window
    cache keeps only the window of its last token); `stored`: how many of its tokens the store
    gives back (restored from it, or saved at a restore point); `kept`: how many it should give back
    (its prompt-end point; more than `stored` while it holds the only copy); `prompt_end`: the
    prompt-end record of its conversation's latest turn (a later turn supersedes it); `used`: when
    a request last held it.
    """

    scope: str
    tokens: TokenArray
    floor: int
    stored: int = 0
    kept: int = 0
    prompt_end: SnapshotKey | None = None
    used: int = 0

    @property
    def only_copy(self) -> bool:
        """Whether clearing it loses a restore point the store does not hold (a save failed)."""
        return self.stored < self.kept


class LivePrefixes:
    """The prompts free sequences hold, for the requests that come next (see the module docstring)."""

    def __init__(self, context: SequenceContext, grid: ReadGrid, truncates: bool) -> None:
        self._context = context
        self._grid = grid
        self._truncates = truncates
        self._held: dict[int, Held] = {}
        self._uses = 0

    def keep(self, seq_id: int, held: Held) -> None:
        """A request left `seq_id`, which holds what `held` says."""
        self._uses += 1
        held.used = self._uses
        self._held[seq_id] = held

    def forget(self, seq_id: int) -> None:
        """`seq_id` holds nothing to reuse any more (a request took it, or it was cleared)."""
        self._held.pop(seq_id, None)

    def choose(self, free: Sequence[int], scope: str, prompt: TokenArray) -> int:
        """The free sequence a request takes: the one holding the longest prefix of its prompt for its
        scope where that is at least half of what it holds (a sequence is not cut down to a few shared
        tokens while another is free: its prompt may come again), else an empty one, else one whose
        prompt the store holds before one holding the only copy, least recently used first. Any
        shorter live prefix is still copied in (`longest`)."""
        best, best_cut = -1, 0
        for seq_id in free:
            held = self._held.get(seq_id)
            cut = 0 if held is None else self.reusable(held, scope, prompt)
            if held is not None and cut > best_cut and 2 * cut >= len(held.tokens):
                best, best_cut = seq_id, cut
        if best >= 0:
            return best
        empty = [seq_id for seq_id in free if seq_id not in self._held]
        if empty:
            return empty[0]
        return min(free, key=lambda seq_id: (self._held[seq_id].only_copy, self._held[seq_id].used))

    def reusable(self, held: Held, scope: str, prompt: TokenArray) -> int:
        """How many leading tokens of `prompt` `held` can give: as many as they share (short of the
        prompt's last token, read for its logits), cut down to a point of the read grid; 0 across
        scopes."""
        if held.scope != scope:
            return 0
        tokens = prompt[:-1]
        n = min(len(held.tokens), len(tokens))
        differ = np.flatnonzero(held.tokens[:n] != tokens[:n])
        cut = self._grid.at_most(int(differ[0]) if len(differ) else n, len(prompt))
        return cut if cut > 0 and cut >= held.floor else 0

    def longest(
        self, scope: str, prompt: TokenArray, seq_id: int, running: Mapping[int, Held]
    ) -> tuple[int, int, Held | None]:
        """(the sequence holding the longest reusable prefix of `prompt`, among the free ones and the
        `running` requests', its length, what that sequence holds); `seq_id`, the request's own,
        wins a tie as it needs no copy."""
        best, best_cut, found = -1, 0, None
        for other, held in {**self._held, **running}.items():
            cut = self.reusable(held, scope, prompt)
            if cut > best_cut or (cut == best_cut > 0 and other == seq_id):
                best, best_cut, found = other, cut, held
        return best, best_cut, found

    def take(self, source: int, seq_id: int, n_tokens: int) -> bool:
        """Make `seq_id` hold the first `n_tokens` that `source` holds; False (cleared) where it cannot."""
        context = self._context
        if source != seq_id and not context.copy(source, seq_id, cut_to=n_tokens):
            return False
        if n_tokens <= context.last_position(seq_id):
            cuttable = self._truncates or context.can_cut(seq_id, n_tokens)
            if not (cuttable and context.cut(seq_id, n_tokens)):
                context.clear(seq_id)
                return False
        return True
