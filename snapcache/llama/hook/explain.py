"""Why a hook's completions restored what they did, and what a prompt would restore now."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llama_cpp

from snapcache.key import TokenArray
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.hook.completion import CompletionCache
from snapcache.llama.hook.miss import MissExplanation, explain_prompt
from snapcache.llama.hook.prefix_loader import PrefixLoader
from snapcache.llama.hook.warm import Warmer
from snapcache.store import SnapshotStore


class Explainer:
    """Explains one hook's restores (see `CacheHook.explain` and `CacheHook.explain_prompt`)."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        store: SnapshotStore,
        notes: FingerprintNotes,
        loader: PrefixLoader,
        completions: CompletionCache,
        warmer: Warmer,
        scope_of: Callable[[str | None], str],
    ) -> None:
        self._llm = llm
        self._store = store
        self._notes = notes
        self._loader = loader
        self._completions = completions
        self._warmer = warmer
        self._scope_of = scope_of  # a scope given, checked; None: the hook's current one

    def explain(self, scope: str | None) -> MissExplanation | None:
        """Why the last completion in `scope` restored what it did; None if none ran."""
        scope = self._scope_of(scope)
        last = self._completions.last_prompt(scope)
        if last is None:
            return None
        return explain_prompt(
            self._llm,
            self._store,
            self._notes,
            self._loader.fingerprint,
            scope,
            last.tokens,
            last.restored,
            stored_before=last.prepared_at,
        )

    def explain_prompt(
        self, prompt: str | Sequence[int] | TokenArray, *, raw: bool, scope: str | None
    ) -> MissExplanation:
        """What a completion starting with `prompt` would restore, and why (a string is a system
        prompt, as `warm` reads it)."""
        scope = self._scope_of(scope)
        tokens = self._warmer.prompt_tokens(prompt, raw=raw)
        self._warmer.ready_to_save()
        found = self._store.lookup(self._loader.fingerprint, scope, tokens)
        restored = 0 if found is None else found.key.token_count
        return explain_prompt(
            self._llm, self._store, self._notes, self._loader.fingerprint, scope, tokens, restored
        )
