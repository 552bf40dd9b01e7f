"""Put the longest available prefix of a prompt into a Llama's context, and save what it holds.

The Llama's own context is reused when it already holds a prefix it can be cut back to, and belongs
to the same scope (a scope never reuses another's prompt, not even the one left in the context);
otherwise the store's longest stored prefix is restored (`PrefixCache.restore_longest`, as the
batched path restores its sequences).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import llama_cpp
import numpy as np

from snapcache.errors import SnapcacheError
from snapcache.key import SnapshotKey, TokenArray
from snapcache.llama.state.blocks import KIND_PREFIX, KIND_PROMPT_END
from snapcache.llama.state.capture_buffer import capture_buffer
from snapcache.llama.state.sequences import (
    can_truncate_to,
    capture_sequence,
    restore_sequence,
    truncate_sequence,
)
from snapcache.llama.stored.checkpoints import MIN_PREFIX_TOKENS, RestorePoint
from snapcache.llama.stored.prefix_cache import PrefixCache
from snapcache.llama.stored.read_grid import ReadGrid
from snapcache.llama.stored.reports import Source, WarmResult
from snapcache.llama.stored.stored_states import Found, StoredStates
from snapcache.llama.templates.chat_prefix import common_prefix
from snapcache.prompt_tokens import PromptTokens

__all__ = ["PrefixLoader", "Progress"]

Progress = Callable[[int, int], None]

_log = logging.getLogger("snapcache")

# The (fingerprint, scope) whose completion last filled the Llama's context: no other reuses it.
_CONTEXT_SCOPE_ATTRIBUTE = "_snapcache_context_scope"
# How many leading tokens of the context were read as a prompt: the generated ones after them were
# read one at a time, which is not what a cold read of the same text computes.
_CONTEXT_PROMPT_ATTRIBUTE = "_snapcache_context_prompt"


class PrefixLoader:
    """Moves states between one Llama's context (sequence 0) and the store, by `cache`'s rules."""

    def __init__(self, llm: llama_cpp.Llama, cache: PrefixCache) -> None:
        self._llm = llm
        self.cache = cache
        # The record the last `load` restored, when it was the end of a prompt: the next turn of that
        # conversation stores its own end and may supersede it.
        self.restored_prompt_end: SnapshotKey | None = None

    @property
    def states(self) -> StoredStates:
        return self.cache.states

    @property
    def fingerprint(self) -> str:
        """The fingerprint states are saved and found under: set again when adapters change it."""
        return self.cache.fingerprint

    @fingerprint.setter
    def fingerprint(self, value: str) -> None:
        self.cache.fingerprint = value

    def load(
        self, tokens: TokenArray | PromptTokens, scope: str, grid: ReadGrid
    ) -> tuple[int, Source | None]:
        """Make the context hold the longest available prefix of `tokens`; return its length and source.

        The Llama's own context wins when it already holds at least as long a prefix that it read as
        a prompt and can be cut back to, at a point of `grid` (a cut elsewhere would not read on as
        a cold read does); otherwise the store's longest prefix that is such a point is restored.
        """
        llm = self._llm
        self.restored_prompt_end = None
        prompt = PromptTokens.of(tokens)
        tokens = prompt.array
        live = self._reusable(tokens, scope, grid)
        setattr(llm, _CONTEXT_SCOPE_ATTRIBUTE, (self.fingerprint, scope))
        held = int(llm.n_tokens)

        def restore(found: Found) -> bool | None:
            if restore_sequence(llm, found.snapshot, tokens, window_padded=found.window_padded):
                return True
            # Refused: by llama.cpp, which cleared the sequence (nothing more to try), or before any
            # byte reached it (no room, say: the context is as it was and a shorter prefix may fit).
            return None if held > 0 and int(llm.n_tokens) == 0 else False

        # Assembled in the Llama's own touched buffer, which llama.cpp then copies from (pinned on a
        # GPU, where a restore may use more threads: llama.cpp's own are idle while it waits).
        buffer = capture_buffer(llm)
        n, stored = len(tokens), grid.for_stored
        found = self.cache.restore_longest(
            prompt.head(stored.at_most(n, n)),
            scope,
            restore,
            longer_than=live,
            buffer=buffer,
            workers=buffer.workers,
            holds=lambda n_tokens: stored.holds(n_tokens, n),
        )
        if found is not None:
            if found.kind == KIND_PROMPT_END:
                self.restored_prompt_end = found.record_key
            return found.snapshot.key.token_count, found.source
        if held > 0 and int(llm.n_tokens) == 0:
            return 0, None  # empty: llama.cpp refused a state and the sequence was cleared
        if live < int(llm.n_tokens) and not truncate_sequence(llm, live):
            truncate_sequence(llm, 0)  # _reusable_context said it could; llama.cpp disagreed
            live = 0
        return live, "context" if live > 0 else None

    def mark_read(self, n_tokens: int) -> None:
        """The context's first `n_tokens` were read as a prompt (what `load` may reuse later)."""
        setattr(self._llm, _CONTEXT_PROMPT_ATTRIBUTE, n_tokens)

    def _reusable(self, tokens: TokenArray, scope: str, grid: ReadGrid) -> int:
        """How many tokens of `tokens` the context holds for `scope`, read as a prompt, and can be
        cut back to at a point of `grid` (the whole prompt only where its last token, read again
        alone, reads as in a longer batch: `ReadGrid.at_most`)."""
        llm = self._llm
        held = int(llm.n_tokens)
        owner = (self.fingerprint, scope)
        if held == 0 or vars(llm).get(_CONTEXT_SCOPE_ATTRIBUTE, owner) != owner:
            return 0  # another scope's prompt, or one read under another fingerprint (exact=False, adapters)
        read = min(held, int(vars(llm).get(_CONTEXT_PROMPT_ATTRIBUTE, 0)))
        n = len(tokens)
        cut = grid.at_most(common_prefix(np.asarray(llm.input_ids[:read]), tokens), n)
        return cut if can_truncate_to(llm, cut) else 0

    def save(
        self,
        scope: str,
        points: list[RestorePoint],
        *,
        blocks_upto: int = 0,
        prompt: PromptTokens | None = None,
    ) -> int:
        """Capture the context's state into the store for `points` (and its blocks up to
        `blocks_upto` tokens); return how many points were stored, 0 (logged) when that fails.
        `prompt`: tokens the context starts with (or that start with what it holds), whose hashes
        are reused."""
        try:
            held = int(self._llm.n_tokens)
            if prompt is not None and held <= len(prompt):
                prompt = prompt.head(held)  # the very tokens it holds: compared, not copied
                captured = capture_sequence(self._llm, tokens=prompt.array, reuse=True)
            else:
                captured = capture_sequence(self._llm, reuse=True)
        except (SnapcacheError, OSError) as exc:
            _log.warning("could not save the state of %d tokens: %s", int(self._llm.n_tokens), exc)
            return 0
        return self.cache.save(captured, scope, points, blocks_upto=blocks_upto, prompt=prompt)

    def _save_prefix(self, prompt: PromptTokens, scope: str, priority: int) -> int:
        """Save the context, which holds exactly `prompt`, as a prefix point with its blocks; the
        state's size in bytes."""
        captured = capture_sequence(self._llm, tokens=prompt.array, reuse=True)
        state_bytes = captured.state.nbytes  # read before the save gives the buffer back
        point = RestorePoint(len(prompt.array), priority, KIND_PREFIX)
        self.cache.states.save(captured, scope, [point], blocks_upto=len(prompt.array), prompt=prompt)
        return state_bytes

    def store_prefix(
        self,
        tokens: TokenArray | PromptTokens,
        scope: str,
        priority: int,
        grid: ReadGrid,
        progress: Progress | None,
        started: float,
    ) -> WarmResult:
        """Make sure the state of exactly `tokens` is stored (at `priority`): found, or read and saved.

        `progress(done, total)` is called as tokens are read, in the cold read's batches (`grid`),
        ending with done == total.
        """
        # Validated once: the lookups and the save below share its hashes and keys.
        prompt = PromptTokens.of(tokens)
        tokens = prompt.array
        total = len(tokens)
        key = prompt.key(self.fingerprint, scope)
        existing = self.cache.states.complete(key, prompt)
        if existing is not None:
            if existing.priority != priority:
                self.cache.states.raise_priority(key, priority, prompt)
            if progress is not None:
                progress(total, total)
            state_bytes = memoryview(existing.state).nbytes
            return WarmResult(key, total, state_bytes, time.perf_counter() - started, True)

        llm = self._llm
        self.load(prompt, scope, grid)
        done = int(llm.n_tokens)
        if progress is not None:
            progress(done, total)
        # A question too short to read on from the prefix restores a point a piece before it
        # (as a chat's head leaves one: `checkpoint_plan`).
        short = grid.at_most(total - grid.min_piece) if grid.min_piece > 1 else 0
        if short < MIN_PREFIX_TOKENS:
            short = 0
        while done < total:
            end = grid.piece_end(done, total)
            if done < short < end:
                end = short
            llm.eval(tokens[done:end].tolist())
            done = end
            if done == short:
                self._save_prefix(prompt.head(short), scope, priority)
            if progress is not None:
                progress(done, total)
        self.mark_read(total)
        state_bytes = self._save_prefix(prompt, scope, priority)
        return WarmResult(key, total, state_bytes, time.perf_counter() - started, False)
