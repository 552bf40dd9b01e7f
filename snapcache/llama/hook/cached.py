"""The two ways to put a store behind a `llama_cpp.Llama`: `attach` it, or wrap it in `CachedLlama`.

Both run the same `CacheHook`. `attach(llm, store)` changes the Llama itself, so that any code holding
it (llama-cpp-python's server, LangChain's `LlamaCpp`, your own) restores and saves through the store;
`detach(llm)` gives it back as it was. `CachedLlama` leaves the Llama alone between calls and hooks
it only for the duration of each of its own calls.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import llama_cpp

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, TokenArray
from snapcache.llama.exactness.choice import AUTO, Exactness, ExactnessChoice
from snapcache.llama.hook.cache_hook import DEFAULT_MIN_TOKENS, CacheHook, ScopeSource, attached_hook
from snapcache.llama.hook.miss import MissExplanation
from snapcache.llama.hook.prefix_loader import Progress
from snapcache.llama.media.projector import Projector
from snapcache.llama.state.capture_buffer import release_capture_buffer
from snapcache.llama.stored.checkpoints import DEFAULT_PREFIX_REUSE
from snapcache.llama.stored.reports import CompletionListener, RestoreInfo, WarmResult
from snapcache.store import SnapshotStore

__all__ = ["CachedLlama", "RestoreInfo", "WarmResult", "attach", "attached_hook", "detach"]


def attach(
    llm: llama_cpp.Llama,
    store: SnapshotStore,
    scope: ScopeSource = DEFAULT_SCOPE,
    *,
    save: bool = True,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    prefix_reuse: float | None = DEFAULT_PREFIX_REUSE,
    priority: int = 0,
    listener: CompletionListener | None = None,
    exact: Exactness | ExactnessChoice = AUTO,
    mmproj: str | os.PathLike[str] | Projector | None = None,
) -> CacheHook:
    """Make every completion of `llm` restore the longest cached prefix first and save after.

    Returns the installed hook (its `last_restore` and `warm` are CachedLlama's). `scope` may be a
    function returning each completion's scope. `exact` ("auto", True, False): see `CacheHook`.
    `mmproj`: the model's projector (a file, or a `Projector` for this Llama), with which chats
    with images are read and cached (see `CachedLlama`). InvalidArgument if `llm` is attached already.
    """
    hook = CacheHook(
        llm,
        store,
        scope,
        save=save,
        min_tokens=min_tokens,
        prefix_reuse=prefix_reuse,
        priority=priority,
        listener=listener,
        exact=exact,
        projector=_projector(llm, mmproj),
    )
    hook.install()
    return hook


def detach(llm: llama_cpp.Llama) -> bool:
    """Undo `attach`: the Llama completes without the store again, and the pinned memory its states
    went through on a GPU is let go. False if it was not attached."""
    hook = attached_hook(llm)
    if hook is None:
        return False
    hook.uninstall()
    release_capture_buffer(llm)
    return True


class CachedLlama:
    """A `llama_cpp.Llama` whose completions restore cached prefixes and save their states.

    `save=False` only restores. No state is saved that would spare fewer than `min_tokens` tokens
    over one already stored. `prefix_reuse` (None: off) sets the ladder of window points along a raw
    prompt on sliding-window models (models with one cache restore any 64-token block instead).
    `priority` goes with every state a completion saves (ladder points: one lower).
    `exact` is "auto": exact where this llama.cpp build keeps a split prompt's results bit for bit,
    inexact where it cannot (`exactness` says which and why); `exact=True` insists, and `exact=False`
    restores at any token, also where no restore is exact, and output may drift from a cold run's
    (see `CacheHook`). Not thread-safe, like the Llama it wraps.

    `mmproj`, the model's projector (an mmproj GGUF file, or a `Projector` made for this Llama),
    caches chats with images: OpenAI-style `image_url` content parts holding data URLs, read
    through llama.cpp's mtmd. An image is keyed by its pixels and the projector: the same pixels
    restore in another chat, process or after a restart; other pixels part where their image starts.
    Without it, messages with images go to the Llama's own chat handler as they are, uncached there.
    """

    def __init__(
        self,
        llm: llama_cpp.Llama,
        store: SnapshotStore,
        scope: str = DEFAULT_SCOPE,
        *,
        save: bool = True,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        prefix_reuse: float | None = DEFAULT_PREFIX_REUSE,
        priority: int = 0,
        exact: Exactness | ExactnessChoice = AUTO,
        mmproj: str | os.PathLike[str] | Projector | None = None,
    ) -> None:
        if callable(scope):
            raise InvalidArgument("CachedLlama takes a scope name; snapcache.attach takes a function too")
        self._hook = CacheHook(
            llm,
            store,
            scope,
            save=save,
            min_tokens=min_tokens,
            prefix_reuse=prefix_reuse,
            priority=priority,
            exact=exact,
            projector=_projector(llm, mmproj),
        )

    @property
    def llm(self) -> llama_cpp.Llama:
        return self._hook.llm

    @property
    def store(self) -> SnapshotStore:
        return self._hook.store

    @property
    def scope(self) -> str:
        return self._hook.scope

    @property
    def fingerprint(self) -> str:
        """The model fingerprint every snapshot of this Llama is stored under."""
        return self._hook.fingerprint

    @property
    def alignment(self) -> int:
        """The multiple of tokens its checkpoints sit on (the model's measured split alignment)."""
        return self._hook.alignment

    @property
    def exact(self) -> bool:
        """False when restored prompts may drift from a cold read."""
        return self._hook.exact

    @property
    def exactness(self) -> ExactnessChoice:
        """Whether restores are exact, what was asked for, and why (see `exactness.choice`)."""
        return self._hook.exactness

    @property
    def last_restore(self) -> RestoreInfo | None:
        """What the last completion reused of its prompt (None before the first, or when not cacheable)."""
        return self._hook.last_restore

    def __repr__(self) -> str:
        return f"CachedLlama(scope={self.scope!r}, fingerprint={self.fingerprint[:12]}…)"

    def create_completion(self, prompt: str | list[int], **kwargs: Any) -> Any:
        """`Llama.create_completion`, restoring the longest cached prefix first and saving after."""
        return self._hook.create_completion(prompt, **kwargs)

    __call__ = create_completion

    def create_chat_completion(self, messages: list[Mapping[str, Any]], **kwargs: Any) -> Any:
        """`Llama.create_chat_completion`, restoring the longest cached prefix first and saving after."""
        return self._hook.create_chat_completion(list(messages), **kwargs)

    def explain(self) -> MissExplanation | None:
        """Why the last completion restored what it did (see `MissExplanation`); None before the first."""
        return self._hook.explain()

    def explain_prompt(
        self, prompt: str | Sequence[int] | TokenArray, *, raw: bool = False
    ) -> MissExplanation:
        """What a completion starting with `prompt` would restore, and why (a string is a system prompt)."""
        return self._hook.explain_prompt(prompt, raw=raw)

    def warm(
        self,
        prompt: str | Sequence[int] | TokenArray,
        priority: int = 0,
        *,
        raw: bool = False,
        progress: Progress | None = None,
    ) -> WarmResult:
        """Store the state of a prompt's beginning, so that later completions start after it.

        A string is a system prompt: what every chat with it as the system message shares is cached
        (raw=True: the text as a completion prompt would start). A token list is cached as it is.
        `progress(done, total)` is called as tokens are read, ending with done == total.
        Raises InvalidArgument when the tokens do not fit in the Llama's context, and for a system
        prompt so short that chats with it share fewer than 64 tokens (not worth caching).
        """
        return self._hook.warm(prompt, priority, raw=raw, progress=progress)


def _projector(llm: llama_cpp.Llama, mmproj: str | os.PathLike[str] | Projector | None) -> Projector | None:
    """The projector `mmproj` names for `llm` (loaded from a file), or None."""
    if mmproj is None or isinstance(mmproj, Projector):
        return mmproj
    return Projector(llm, mmproj)
