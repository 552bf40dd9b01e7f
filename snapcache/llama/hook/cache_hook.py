"""CacheHook: a plain `llama_cpp.Llama` that restores cached prefixes and saves its states.

The Llama still does all the work (tokenizing, chat templates, sampling, grammar, stop handling).
The hook steps in at two places of the Llama, as instance attributes that `install` sets and
`uninstall` takes away again:

- `create_completion`, which every completion path of llama-cpp-python goes through (`__call__`,
  chat handlers, llama-cpp-python's server, LangChain's `LlamaCpp`);
- `chat_handler`, which sees a chat's messages before they are rendered, so that the end of the
  system messages can become a checkpoint.

Given a projector, a chat with images is rendered by the Llama's handler with a marker per image,
and its prompt read with the images through mtmd (`media_chat`, `completion`).

Its own `create_completion` and `create_chat_completion` install it for one call (unless it is
installed already), with that call's scope and listener as arguments: `CachedLlama` and a server's
engine call the Llama that way, leaving it as it was between calls.

When llama-cpp-python hands the final prompt tokens to `Llama.generate`, the hook loads the longest
stored prefix of exactly those tokens into the context and lets `generate` evaluate only the rest;
after the completion (for a stream: when it is exhausted or closed) it saves what the prompt should
leave behind (`completion_flow`, `completion`). Before each completion the Llama is checked again
(`readiness`). It tells its listener what it did (`reports`). `warm` and `explain` are in their own
modules; this one installs the hook and decides what each intercepted call is. It stays whole at
about 540 lines: one job, `CacheHook`'s installing (for good or for one call) and dispatching, and
most of its length is the public properties and methods with the docstrings callers read, each
handing its work to those modules.

Not thread-safe, like the Llama it hooks: one completion at a time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import llama_cpp
from llama_cpp import llama_chat_format

from snapcache.errors import InvalidArgument
from snapcache.key import DEFAULT_SCOPE, TokenArray, validate_priority, validate_scope
from snapcache.llama.exactness.choice import AUTO, Exactness, ExactnessChoice, choose_exactness
from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.exactness.readiness import Readiness
from snapcache.llama.hook.completion import Completion, CompletionCache
from snapcache.llama.hook.completion_flow import CompletionFlow
from snapcache.llama.hook.explain import Explainer
from snapcache.llama.hook.media_chat import MediaChat
from snapcache.llama.hook.miss import MissExplanation
from snapcache.llama.hook.prefix_loader import PrefixLoader, Progress
from snapcache.llama.hook.special_text import keeping_special_text, stream_keeping_special_text
from snapcache.llama.hook.warm import Warmer
from snapcache.llama.media.chat_images import has_images
from snapcache.llama.media.projector import Projector
from snapcache.llama.setup.amx import warn_once
from snapcache.llama.stored.checkpoints import DEFAULT_PREFIX_REUSE
from snapcache.llama.stored.prefix_cache import PrefixCache
from snapcache.llama.stored.reports import CompletionListener, RestoreInfo, WarmResult
from snapcache.llama.templates.chat_prefix import ChatPrefixFinder, SharedPrefix, agent_head, render_options
from snapcache.store import SnapshotStore

__all__ = ["CacheHook", "ScopeSource", "attached_hook"]

_log = logging.getLogger("snapcache")

ScopeSource = str | Callable[[], str]

DEFAULT_MIN_TOKENS = 32
# Where an installed hook keeps itself on the Llama, so that `attached(llm)` can find it.
_HOOK_ATTRIBUTE = "_snapcache_hook"
_MISSING = object()


@dataclass(frozen=True, slots=True)
class _ChatTurn:
    """A chat handler is about to call `create_completion`: the checkpoint its messages share, or
    why its completion must not be cached."""

    prefix: SharedPrefix | None
    uncached_because: str | None = None


@dataclass(frozen=True, slots=True)
class _CallOptions:
    """What one call through `CacheHook.create_completion` sets for itself (None: the hook's)."""

    scope: str | None
    listener: CompletionListener | None

    @classmethod
    def of(cls, scope: str | None, listener: CompletionListener | None) -> _CallOptions:
        """The options of a call, its scope checked."""
        return cls(None if scope is None else validate_scope(scope), listener)


class CacheHook:
    """Restores cached prefixes before, and saves states after, every completion of one Llama.

    `scope` is a scope name, or a function that returns the scope of the completion about to run
    (a server picks it per request). `save=False` only restores. No state is saved that would spare
    fewer than `min_tokens` tokens over one already stored. `prefix_reuse` (None: off) sets the
    ladder of window points along a raw prompt on sliding-window models (models with one cache
    restore any 64-token block instead). `priority` goes with every state a completion saves
    (ladder points: one lower). `listener` hears of every completion.

    `exact` is "auto" by default: exact where this llama.cpp build keeps a split prompt's results
    bit for bit (the CPU backend), inexact where it cannot (no split point does, as on CUDA, or
    flash attention over an F16 cache); see `snapcache.llama.exactness.choice`. `exact=True` insists (and
    caches nothing where exactness cannot hold); an `ExactnessChoice` is taken as made (a server
    chooses once for its hook and its scheduler). `exact=False` trades exactness for reuse: states
    are saved and restored at any token (the end of a prompt is kept but for its last token) with no
    split alignment measured, and on models whose results no restore keeps exact (flash attention
    over an F16 cache) too. A restored prompt then reads on from a split a cold read does not make,
    so its output can drift from a cold run's (see the README for the drift measured). Such states
    go under a fingerprint of their own (`restore: inexact`): an exact hook never restores them, nor
    an inexact one exact states.
    """

    def __init__(
        self,
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
        projector: Projector | None = None,
    ) -> None:
        if not isinstance(llm, llama_cpp.Llama):
            raise InvalidArgument(f"llm must be a llama_cpp.Llama, got {type(llm).__name__}")
        if not isinstance(store, SnapshotStore):
            raise InvalidArgument(f"store must be a SnapshotStore, got {type(store).__name__}")
        if getattr(llm.context_params, "embeddings", False):
            raise InvalidArgument("this Llama was built with embedding=True: it has no completions to cache")
        if not callable(scope):
            validate_scope(scope)
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
            raise InvalidArgument(f"min_tokens must be a positive int, got {min_tokens!r}")
        if prefix_reuse is not None and not 0.0 < prefix_reuse < 1.0:
            raise InvalidArgument(f"prefix_reuse must lie strictly between 0 and 1, got {prefix_reuse!r}")
        if projector is not None and _uncacheable_handler(llm.chat_handler) is not None:
            raise InvalidArgument(
                "this Llama reads images with its own chat handler;"
                " give snapcache the projector (mmproj) instead"
            )
        warn_once(llm)
        self._llm = llm
        # Chats with images, read through `projector` (None: passed to the Llama's handler as they are).
        self._media = None if projector is None else MediaChat(llm, projector)
        self._store = store
        self._scope = scope
        notes = FingerprintNotes(store.directory)
        self._exactness = exact if isinstance(exact, ExactnessChoice) else choose_exactness(llm, exact, notes)
        self._exact = self._exactness.exact
        cache = PrefixCache(
            llm,
            store,
            model_fingerprint(llm, exact=self._exact),
            save=bool(save),
            min_tokens=min_tokens,
            priority=validate_priority(priority),
            prefix_reuse=prefix_reuse,
            exact=self._exact,
        )
        self._loader = PrefixLoader(llm, cache)
        self._readiness = Readiness(llm, cache, notes, exact=self._exact)
        self._completions = CompletionCache(llm, self._loader, self._readiness, listener=listener)
        self._flow = CompletionFlow(llm, self._completions)
        self._warmer = Warmer(llm, self._loader, self._readiness, self._shared_chat_tokens, self._scope_of)
        self._explainer = Explainer(
            llm, store, notes, self._loader, self._completions, self._warmer, self._scope_of
        )
        self._prefixes = ChatPrefixFinder(llm, self._render_chat)
        self._rendering = False
        self._chat_turn: _ChatTurn | None = None
        self._call: _CallOptions | None = None  # set while `create_completion` (and chats) run
        self._saved_attributes: dict[str, Any] | None = None
        # Bound once, so that `uninstall` can tell its own entry points from a user's replacements.
        self._completion_entry = self._create_completion
        self._chat_entry = self._handle_chat
        self._told: set[str] = set()

    # -- properties ---------------------------------------------------------------------------------

    @property
    def llm(self) -> llama_cpp.Llama:
        return self._llm

    @property
    def store(self) -> SnapshotStore:
        return self._store

    @property
    def scope(self) -> str:
        """The scope a completion would use now."""
        return self._current_scope()

    @property
    def fingerprint(self) -> str:
        """The model fingerprint every snapshot of this Llama is stored under."""
        return self._loader.fingerprint

    @property
    def alignment(self) -> int:
        """The multiple of tokens its checkpoints sit on: the model's measured split alignment once
        a completion or `warm` has saved (see `snapcache.llama.exactness.alignment`), 64 before."""
        return self._readiness.alignment

    @property
    def exact(self) -> bool:
        """False when restored prompts may drift from a cold read (see the class docstring)."""
        return self._exact

    @property
    def exactness(self) -> ExactnessChoice:
        """Whether restores are exact, what was asked for (`exact=`), and why (see `exactness`)."""
        return self._exactness

    @property
    def last_restore(self) -> RestoreInfo | None:
        """What the last completion restored (None: nothing, or it was not cached)."""
        return self._flow.last_restore

    @property
    def installed(self) -> bool:
        return self._saved_attributes is not None

    def __repr__(self) -> str:
        scope = "<per call>" if callable(self._scope) else repr(self._scope)
        fingerprint = self._loader.fingerprint[:12]
        return f"CacheHook(scope={scope}, fingerprint={fingerprint}…, installed={self.installed})"

    # -- installing ---------------------------------------------------------------------------------

    def install(self) -> None:
        """Make the Llama's own completion paths go through this hook (a no-op when they already do)."""
        if self.installed:
            return
        llm = self._llm
        other = vars(llm).get(_HOOK_ATTRIBUTE)
        if other is not None:
            raise InvalidArgument(
                "this Llama is already attached to a snapcache store; call snapcache.detach(llm) first"
            )
        self._saved_attributes = {name: vars(llm).get(name, _MISSING) for name in ("create_completion",)}
        self._saved_attributes["chat_handler"] = llm.chat_handler
        llm.create_completion = self._completion_entry  # type: ignore[method-assign]
        llm.chat_handler = self._chat_entry
        setattr(llm, _HOOK_ATTRIBUTE, self)

    def uninstall(self) -> None:
        """Give the Llama its own completion paths back (a chat handler set since is kept)."""
        saved = self._saved_attributes
        if saved is None:
            return
        llm = self._llm
        if vars(llm).get("create_completion") is self._completion_entry:
            if saved["create_completion"] is _MISSING:
                del llm.create_completion
            else:
                llm.create_completion = saved["create_completion"]  # type: ignore[method-assign]
        if llm.chat_handler is self._chat_entry:
            llm.chat_handler = saved["chat_handler"]
        vars(llm).pop(_HOOK_ATTRIBUTE, None)
        self._saved_attributes = None

    @contextmanager
    def installed_for_call(self) -> Iterator[None]:
        """Installed for the duration of a block, unless it was installed already."""
        if self.installed:
            yield
            return
        self.install()
        try:
            yield
        finally:
            self.uninstall()

    # -- completions through the hook, whether installed or not -------------------------------------

    def create_completion(
        self,
        prompt: str | Sequence[int],
        *,
        scope: str | None = None,
        listener: CompletionListener | None = None,
        special_text: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`Llama.create_completion` through this hook, installed for the call unless it is already:
        in `scope` (None: the hook's), told to `listener` (None: the hook's), its text with the
        model's special tokens where `special_text`. Not thread-safe, like the Llama."""
        llm = self._llm
        text = prompt if isinstance(prompt, str) else list(prompt)
        call = _CallOptions.of(scope, listener)
        return self._run_call(lambda: llm.create_completion(text, **kwargs), call, special_text, kwargs)

    @property
    def reads_images(self) -> bool:
        """Whether chats with images are read through the model's projector (one was given)."""
        return self._media is not None

    def create_chat_completion(
        self,
        messages: list[Mapping[str, Any]],
        *,
        scope: str | None = None,
        listener: CompletionListener | None = None,
        special_text: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`Llama.create_chat_completion` through this hook, as `create_completion` runs a prompt."""
        llm = self._llm
        call = _CallOptions.of(scope, listener)
        chat = cast(Any, messages)
        return self._run_call(
            lambda: llm.create_chat_completion(messages=chat, **kwargs), call, special_text, kwargs
        )

    def _run_call(
        self, run: Callable[[], Any], call: _CallOptions, special_text: bool, kwargs: Mapping[str, Any]
    ) -> Any:
        # A stream's completion starts in the call (its scope and listener are taken there); its text
        # is made as it is read.
        self._call = call
        try:
            with self.installed_for_call(), keeping_special_text(self._llm, special_text):
                result = run()
        finally:
            self._call = None
        if special_text and kwargs.get("stream"):
            return stream_keeping_special_text(self._llm, iter(result))
        return result

    # -- the entry points the Llama calls once installed --------------------------------------------

    def _original_create_completion(self) -> Callable[..., Any]:
        saved = (self._saved_attributes or {}).get("create_completion", _MISSING)
        if saved is not _MISSING and saved is not None:
            return saved  # type: ignore[no-any-return]
        return functools.partial(type(self._llm).create_completion, self._llm)

    def _create_completion(self, *args: Any, **kwargs: Any) -> Any:
        original = self._original_create_completion()
        if self._rendering:
            return original(*args, **kwargs)
        media = None
        if self._media is not None:
            if args:
                args = (self._media.text_prompt(args[0]), *args[1:])
            elif "prompt" in kwargs:
                kwargs["prompt"] = self._media.text_prompt(kwargs["prompt"])
            media = self._media.take()
            if media is None and self._media.rendering_images:
                # The handler tokenized the rendered chat some other way: its markers would be read
                # as text, and the images not at all.
                raise InvalidArgument(
                    "this Llama's chat handler does not let snapcache read the chat's images"
                )
        if media is not None and kwargs.get("echo"):
            raise InvalidArgument("echo is not available for a prompt with images")
        turn, self._chat_turn = self._chat_turn, None
        if turn is not None and turn.uncached_because is not None:
            self._flow.last_restore = None
            return original(*args, **kwargs)
        if kwargs.get("echo") and kwargs.get("logprobs") is not None:
            # Echoed log-probabilities need the logits of every prompt token; a state has none.
            self._flow.last_restore = None
            return original(*args, **kwargs)
        call = Completion(
            scope=self._current_scope(),
            chat_prefix=turn.prefix if turn is not None else None,
            ladder=turn is None and self._completions.has_ladder,
            cacheable=self._check_cacheable(),
            listener=self._call.listener if self._call is not None else None,
            media=media,
        )
        return self._flow.run(call, lambda: original(*args, **kwargs), stream=bool(kwargs.get("stream")))

    def _handle_chat(self, *, llama: llama_cpp.Llama, messages: list[Any], **kwargs: Any) -> Any:
        handler = self._original_chat_handler()
        if self._rendering or llama is not self._llm:
            return handler(llama=llama, messages=messages, **kwargs)
        if self._media is not None and has_images(messages):
            with self._media.rendering(messages) as rendered:
                return self._handle_text_chat(handler, rendered, kwargs)
        return self._handle_text_chat(handler, messages, kwargs)

    def _handle_text_chat(self, handler: Any, messages: list[Any], kwargs: dict[str, Any]) -> Any:
        """A chat through `handler`, its system part a checkpoint (the images, if any, replaced)."""
        llama = self._llm
        reason = _uncacheable_handler(handler)
        if reason is not None:
            self._tell_once(f"chat completions are not cached: {reason}")
            turn = _ChatTurn(None, reason)
        else:
            turn = _ChatTurn(self._chat_checkpoint(messages, kwargs))
        self._chat_turn = turn
        try:
            return handler(llama=llama, messages=messages, **kwargs)
        finally:
            if self._chat_turn is turn:
                self._chat_turn = None

    def _original_chat_handler(self) -> Any:
        llm = self._llm
        saved = (self._saved_attributes or {}).get("chat_handler")
        chat_format = str(llm.chat_format)
        return (
            saved
            or llm._chat_handlers.get(chat_format)
            or llama_chat_format.get_chat_completion_handler(chat_format)
        )

    def _check_cacheable(self) -> bool:
        """Whether this completion may restore and save (the reason is logged once when not)."""
        reason = self._readiness.reason_not(saving=self._completions.saves)
        if reason is not None:
            self._tell_once(reason)
            return False
        return True

    def _tell_once(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            _log.warning("%s", message)

    # -- why it missed, and warming -----------------------------------------------------------------

    def explain(self, scope: str | None = None) -> MissExplanation | None:
        """Why the last completion in `scope` (default: the hook's) restored what it did; None if none ran."""
        return self._explainer.explain(scope)

    def explain_prompt(
        self, prompt: str | Sequence[int] | TokenArray, *, raw: bool = False, scope: str | None = None
    ) -> MissExplanation:
        """What a completion starting with `prompt` would restore, and why (a string is a system
        prompt, as `warm` reads it)."""
        return self._explainer.explain_prompt(prompt, raw=raw, scope=scope)

    def warm(
        self,
        prompt: str | Sequence[int] | TokenArray,
        priority: int = 0,
        *,
        raw: bool = False,
        progress: Progress | None = None,
        scope: str | None = None,
    ) -> WarmResult:
        """Store the state of a prompt's beginning, so that later completions start after it.

        A string is a system prompt: what every chat with it as the system message shares is cached
        (raw=True: the text as a completion prompt would start). A token list is cached as it is.
        `progress(done, total)` is called as tokens are read, ending with done == total. `scope`
        defaults to the hook's. Raises InvalidArgument when the tokens do not fit in the Llama's
        context, and for a system prompt so short that chats with it share fewer than 64 tokens
        (shorter prefixes are not worth caching).
        """
        return self._warmer.warm(prompt, priority, raw=raw, progress=progress, scope=scope)

    def warm_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        priority: int = 0,
        *,
        progress: Progress | None = None,
        scope: str | None = None,
    ) -> WarmResult:
        """`warm` for the leading system (or developer) messages of a chat, as every chat with them shares."""
        return self._warmer.warm_chat(messages, priority, progress=progress, scope=scope)

    # -- scopes -------------------------------------------------------------------------------------

    def _current_scope(self) -> str:
        if self._call is not None and self._call.scope is not None:
            return self._call.scope
        scope = self._scope
        return validate_scope(scope() if callable(scope) else scope)

    def _scope_of(self, scope: str | None) -> str:
        """`scope` checked, or the current scope when None."""
        return self._current_scope() if scope is None else validate_scope(scope)

    # -- chat templates -----------------------------------------------------------------------------

    def _chat_checkpoint(
        self, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]
    ) -> SharedPrefix | None:
        """What every chat that starts with these messages' system part shares (its tokens are worked
        out, and cut to the alignment, when the checkpoints are planned)."""
        if not self._completions.saves:
            return None
        options = render_options(kwargs)
        head = agent_head(messages, options)
        if head is None:
            return None
        self._rendering = True
        try:
            return self._prefixes.shared(head, options)
        finally:
            self._rendering = False

    def _shared_chat_tokens(
        self, head: list[Mapping[str, Any]], options: dict[str, Any]
    ) -> TokenArray | None:
        self._rendering = True
        try:
            return self._prefixes.shared_tokens(head, options)
        finally:
            self._rendering = False

    def _render_chat(self, messages: list[Mapping[str, Any]], options: dict[str, Any]) -> Any:
        return type(self._llm).create_chat_completion(self._llm, messages=cast(Any, messages), **options)


# -- module helpers ----------------------------------------------------------------------------------


def _uncacheable_handler(handler: Any) -> str | None:
    """Why completions through this chat handler must not be cached, if they must not.

    Multimodal handlers (llava, mtmd) evaluate image embeddings into the context themselves and then
    complete from placeholder token ids: those ids do not say what the context holds.
    """
    multimodal = (llama_chat_format.Llava15ChatHandler, getattr(llama_chat_format, "MTMDChatHandler", ()))
    if isinstance(handler, multimodal):
        return (
            f"{type(handler).__name__} evaluates images itself, and its prompt tokens do not say what it read"
        )
    return None


def attached_hook(llm: llama_cpp.Llama) -> CacheHook | None:
    """The hook installed on `llm`, if any."""
    hook = vars(llm).get(_HOOK_ATTRIBUTE)
    return hook if isinstance(hook, CacheHook) else None
