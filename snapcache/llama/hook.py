"""CacheHook: a plain `llama_cpp.Llama` that restores cached prefixes and saves its states.

The Llama still does all the work (tokenizing, chat templates, sampling, grammar, stop handling).
The hook steps in at two places of the Llama, as instance attributes that `install` sets and
`uninstall` takes away again:

- `create_completion`, which every completion path of llama-cpp-python goes through (`__call__`,
  chat handlers, llama-cpp-python's server, LangChain's `LlamaCpp`);
- `chat_handler`, which sees a chat's messages before they are rendered, so that the end of the
  system messages can become a checkpoint.

When llama-cpp-python hands the final prompt tokens to `Llama.generate`, the hook loads the longest
stored prefix of exactly those tokens into the context (`prefix_loader`) and lets `generate` evaluate
only the rest. On a model with one cache, the state after the completion (for a stream: when it is
exhausted or closed) is captured once and cut into the prompt's 64-token blocks and its restore
points (`checkpoints`, `stored_states`); sliding-window and recurrent models read on to each restore
point first and save it there. It tells its listener what it did (`reports`).

Not thread-safe, like the Llama it hooks: one completion at a time.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import llama_cpp
from llama_cpp import llama_chat_format

from snapcache.errors import InvalidArgument, SnapcacheError
from snapcache.fingerprint_notes import FingerprintNotes
from snapcache.key import (
    BLOCK_TOKENS,
    DEFAULT_SCOPE,
    SnapshotKey,
    TokenArray,
    as_token_array,
    validate_priority,
    validate_scope,
)
from snapcache.llama import alignment
from snapcache.llama.blocks import KIND_PREFIX, KIND_PROMPT_END
from snapcache.llama.chat_prefix import (
    ChatPrefixFinder,
    SharedPrefix,
    patched,
    render_options,
    system_head,
    text_prompt_tokens,
)
from snapcache.llama.checkpoints import (
    CHECKPOINT_ALIGN,
    MIN_PREFIX_TOKENS,
    align_down,
    checkpoint_plan,
    final_point,
    ladder_points,
)
from snapcache.llama.fingerprint import fingerprint_of, fingerprint_parts, model_fingerprint
from snapcache.llama.miss import MissExplanation, explain_prompt
from snapcache.llama.prefix_loader import PrefixLoader, Progress
from snapcache.llama.reports import CompletionListener, CompletionReport, RestoreInfo, WarmResult
from snapcache.llama.state import can_truncate
from snapcache.llama.stored_states import RestorePoint
from snapcache.llama.support import unsupported_reason
from snapcache.store import SnapshotStore

__all__ = ["CacheHook", "ScopeSource", "attached_hook"]

_log = logging.getLogger("snapcache")

ScopeSource = str | Callable[[], str]

DEFAULT_MIN_TOKENS = 32
DEFAULT_PREFIX_REUSE = 0.9
# Where an installed hook keeps itself on the Llama, so that `attached(llm)` can find it.
_HOOK_ATTRIBUTE = "_snapcache_hook"
_MISSING = object()
_NO_ALIGNMENT = (
    "no prompt split point keeps this model's results exact on this llama.cpp build, "
    "so a restored state would not continue as a cold read; snapshots are neither restored nor saved"
)
# Scopes whose last prompt `explain` can still look at.
_REMEMBERED_SCOPES = 64


@dataclass(slots=True)
class _Call:
    """One completion in flight: its scope, the checkpoints it asked for and what it has done so far."""

    scope: str
    chat_prefix: SharedPrefix | None
    ladder: bool
    prepared: bool = False
    saved_upto: int = 0  # the longest prefix of the context known to be stored or restored
    checkpoints: int = 0
    cacheable: bool = True  # False: llama.cpp would not continue a restored state exactly
    prompt: TokenArray | None = None
    deferred: list[RestorePoint] = field(default_factory=list)  # cut from the capture after it
    restore: RestoreInfo | None = None
    generated: int = 0
    last_token: int | None = None
    read_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class _ChatTurn:
    """A chat handler is about to call `create_completion`: the checkpoint its messages share, or
    why its completion must not be cached."""

    prefix: SharedPrefix | None
    uncached_because: str | None = None


class CacheHook:
    """Restores cached prefixes before, and saves states after, every completion of one Llama.

    `scope` is a scope name, or a function that returns the scope of the completion about to run
    (a server picks it per request). `save=False` only restores. No state is saved that would spare
    fewer than `min_tokens` tokens over one already stored. `prefix_reuse` (None: off) sets the
    ladder of window points along a raw prompt on sliding-window models (models with one cache
    restore any 64-token block instead). `priority` goes with every state a completion saves
    (ladder points: one lower). `listener` hears of every completion.

    `exact=False` trades exactness for reuse: states are saved and restored at any token (the end
    of a prompt is kept but for its last token) with no split alignment measured, and on models whose
    results no restore keeps exact (flash attention over an F16 cache) too. A restored prompt then
    reads on from a split a cold read does not make, so its output can drift from a cold run's (see
    the README for the drift measured). Such states go under a fingerprint of their own
    (`restore: inexact`): an exact hook never restores them, nor an inexact one exact states.
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
        exact: bool = True,
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
        self._llm = llm
        self._store = store
        self._scope = scope
        self._save = bool(save)
        self._min_tokens = min_tokens
        self._priority = validate_priority(priority)
        self._listener = listener
        self._exact = bool(exact)
        self._loader = PrefixLoader(llm, store, model_fingerprint(llm, exact=self._exact))
        self._notes = FingerprintNotes(store.directory)
        self._last_prompts: OrderedDict[str, tuple[TokenArray, int, float]] = OrderedDict()
        n_ctx = int(llm.n_ctx())
        self._ladder = [] if prefix_reuse is None else ladder_points(CHECKPOINT_ALIGN, prefix_reuse, n_ctx)
        self._prefixes = ChatPrefixFinder(llm, self._render_chat)
        self._rendering = False
        self._chat_turn: _ChatTurn | None = None
        self._saved_attributes: dict[str, Any] | None = None
        # Bound once, so that `uninstall` can tell its own entry points from a user's replacements.
        self._completion_entry = self._create_completion
        self._chat_entry = self._handle_chat
        self.last_restore: RestoreInfo | None = None
        self._told: set[str] = set()
        # Until measured for the fingerprint; an inexact hook splits anywhere.
        self._alignment = alignment.COARSEST_ALIGNMENT if self._exact else 1
        self._windows = int(llama_cpp.llama_model_n_swa(llm.model)) > 0
        # Sparse points of a raw prompt on a sliding-window model: each stores a whole window.
        n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
        self._window_step = max(CHECKPOINT_ALIGN, -(-n_swa // CHECKPOINT_ALIGN) * CHECKPOINT_ALIGN)
        self._last_prompt_end: OrderedDict[str, SnapshotKey] = OrderedDict()

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
        a completion or `warm` has saved (see `snapcache.llama.alignment`), 64 before."""
        return self._alignment

    @property
    def exact(self) -> bool:
        """False when restored prompts may drift from a cold read (see the class docstring)."""
        return self._exact

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
        turn, self._chat_turn = self._chat_turn, None
        if turn is not None and turn.uncached_because is not None:
            self.last_restore = None
            return original(*args, **kwargs)
        if kwargs.get("echo") and kwargs.get("logprobs") is not None:
            # Echoed log-probabilities need the logits of every prompt token; a state has none.
            self.last_restore = None
            return original(*args, **kwargs)
        call = _Call(
            scope=self._current_scope(),
            chat_prefix=turn.prefix if turn is not None else None,
            ladder=turn is None and bool(self._ladder),
            cacheable=self._check_cacheable(),
        )
        return self._run(call, lambda: original(*args, **kwargs), stream=bool(kwargs.get("stream")))

    def _handle_chat(self, *, llama: llama_cpp.Llama, messages: list[Any], **kwargs: Any) -> Any:
        handler = self._original_chat_handler()
        if self._rendering or llama is not self._llm:
            return handler(llama=llama, messages=messages, **kwargs)
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
        reason = self._uncacheable_reason(saving=self._save)
        if reason is not None:
            self._tell_once(reason)
            return False
        return True

    def _uncacheable_reason(self, *, saving: bool) -> str | None:
        """Why this Llama cannot be cached now, or None. The fingerprint is taken again first, since
        adapters and control vectors can change between completions; a Llama that saves needs the
        prompt split alignment of its fingerprint, measured once (see `alignment`). An inexact hook
        needs neither the alignment nor a model whose restores are exact."""
        if self._exact:
            reason = unsupported_reason(self._llm)
            if reason is not None:
                return reason
        parts = fingerprint_parts(self._llm, exact=self._exact)
        fingerprint = fingerprint_of(parts)
        self._loader.fingerprint = fingerprint
        if not self._exact:
            self._notes.remember(fingerprint, parts, 1)
        elif saving:
            known, measured = alignment.remembered(fingerprint)
            if not known:
                known, measured = self._notes.alignment(fingerprint)
            if not known:
                measured = alignment.measure_alignment(self._llm)
            alignment.remember(fingerprint, measured)
            self._notes.remember(fingerprint, parts, measured)
            if measured is None:
                return _NO_ALIGNMENT
            self._alignment = measured
        return None

    def _tell_once(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            _log.warning("%s", message)

    # -- one completion -----------------------------------------------------------------------------

    def _run(self, call: _Call, complete: Callable[[], Any], *, stream: bool) -> Any:
        self.last_restore = None
        if stream:
            return self._stream(call, complete)
        with self._intercept_generate(call):
            result = complete()
        self._finish(call)
        if isinstance(result, dict) and call.restore is not None:
            _add_cached_tokens(result, call.restore.cached_tokens)
        return result

    def _stream(self, call: _Call, complete: Callable[[], Any]) -> Iterator[Any]:
        # llama-cpp-python builds its stream lazily: the prompt reaches generate() on the first next().
        chunks: Iterator[Any] | None = None
        try:
            with self._intercept_generate(call):
                chunks = iter(complete())
                first = next(chunks, _MISSING)
            if first is _MISSING:
                return
            yield first
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            self._finish(call)

    @contextmanager
    def _intercept_generate(self, call: _Call) -> Iterator[None]:
        original = self._llm.generate

        def generate(tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
            started = time.perf_counter()  # the checkpoints read in _prepare are part of the read
            if not call.prepared:
                call.prepared = True
                self._prepare(tokens, call)
            inner = original(tokens, *args, **kwargs)
            try:
                for token in inner:
                    if call.generated == 0:
                        call.read_seconds = time.perf_counter() - started
                    call.generated += 1
                    call.last_token = token
                    yield token
            finally:
                inner.close()

        with patched(self._llm, "generate", generate):
            yield

    def _prepare(self, prompt: Sequence[int], call: _Call) -> None:
        """Load the longest cached prefix of `prompt` into the context, then read on to checkpoints."""
        llm = self._llm
        tokens = as_token_array(prompt)
        n = len(tokens)
        if n == 0 or n >= int(llm.n_ctx()):
            return  # llama-cpp-python raises or handles these itself
        started = time.perf_counter()
        reused, source = (
            self._loader.load(tokens, call.scope, self._alignment) if call.cacheable else (0, None)
        )
        restore_seconds = time.perf_counter() - started
        self._last_prompts[call.scope] = (tokens, reused, time.time())
        self._last_prompts.move_to_end(call.scope)
        if len(self._last_prompts) > _REMEMBERED_SCOPES:
            self._last_prompts.popitem(last=False)
        call.saved_upto = reused
        call.prompt = tokens
        if self._save and call.cacheable:
            chat_prefix = call.chat_prefix
            if chat_prefix is not None and chat_prefix.reached(tokens, reused, self._alignment):
                chat_prefix = None  # restored up to the end of the system part already
            # One cache of full attention: every point is cut from one capture after the completion.
            # Sliding windows and recurrent states hold only their last point: read on to each.
            one_capture = can_truncate(llm)
            ladder = self._ladder if call.ladder and not one_capture else []
            plan = checkpoint_plan(
                tokens,
                ladder=[p for p in ladder if p % self._window_step == 0],
                chat_prefix=None if chat_prefix is None else chat_prefix.tokens(),
                priority=self._priority,
                after=reused,
                alignment=self._alignment,
                exact=self._exact,
            )
            end = final_point(n, self._alignment, exact=self._exact)
            for point, priority in plan:
                if not one_capture and point - call.saved_upto < self._min_tokens:
                    continue  # a whole window (or state) for a few tokens more
                kind = KIND_PROMPT_END if point == end else KIND_PREFIX
                restore_point = RestorePoint(point, priority, kind)
                if one_capture:
                    call.deferred.append(restore_point)
                else:
                    llm.eval(tokens[int(llm.n_tokens) : point].tolist())
                    call.checkpoints += self._loader.save(call.scope, [restore_point])
                    self._superseding(call, restore_point, tokens)
                call.saved_upto = point
        if call.cacheable:
            self._loader.mark_read(n)  # generate reads the rest of the prompt next
        evaluated = n - min(reused, n - 1)
        call.restore = RestoreInfo(n, reused, evaluated, source, call.checkpoints, restore_seconds)
        self.last_restore = call.restore
        _log.debug("prompt of %d tokens: %d reused (%s), %d to evaluate", n, reused, source, evaluated)
        if self._listener is not None:
            self._listener.restored(call.scope, call.restore)

    def _finish(self, call: _Call) -> None:
        """Save the context after a completion, keyed by the tokens it holds (never the last sampled one)."""
        if not call.prepared:
            return
        if call.cacheable and self._save:
            if call.deferred or (call.prompt is not None and can_truncate(self._llm)):
                read = 0 if call.prompt is None else len(call.prompt)
                if call.deferred or read - call.saved_upto >= BLOCK_TOKENS:
                    call.checkpoints += self._loader.save(call.scope, call.deferred, blocks_upto=read)
                for point in call.deferred:
                    self._superseding(call, point, call.prompt)
            elif not self._windows and int(self._llm.n_tokens) - call.saved_upto >= self._min_tokens:
                # A recurrent state holds only its last point: keep the whole context.
                n_held = int(self._llm.n_tokens)
                self._loader.save(call.scope, [RestorePoint(n_held, self._priority, KIND_PROMPT_END)])
        if self._listener is not None and call.restore is not None:
            generated = call.generated
            if call.last_token is not None and llama_cpp.llama_vocab_is_eog(
                self._llm._model.vocab, call.last_token
            ):
                generated -= 1  # llama-cpp-python does not count the end-of-generation token
            self._listener.finished(CompletionReport(call.scope, call.restore, generated, call.read_seconds))

    def _superseding(self, call: _Call, point: RestorePoint, tokens: TokenArray | None) -> None:
        """A prompt end was stored: the end of the conversation's turn before it goes (see
        `StoredStates.supersede`)."""
        if point.kind != KIND_PROMPT_END or tokens is None:
            return
        states = self._loader.states
        for old in {self._last_prompt_end.get(call.scope), self._loader.restored_prompt_end} - {None}:
            assert old is not None
            try:
                states.supersede(old, tokens[: point.n_tokens], point.priority)
            except (SnapcacheError, OSError) as exc:
                _log.debug("could not remove the previous turn's state: %s", exc)
        self._last_prompt_end[call.scope] = SnapshotKey.for_tokens(
            self.fingerprint, call.scope, tokens[: point.n_tokens]
        )
        self._last_prompt_end.move_to_end(call.scope)
        if len(self._last_prompt_end) > _REMEMBERED_SCOPES:
            self._last_prompt_end.popitem(last=False)

    # -- why it missed -----------------------------------------------------------------------------

    def explain(self, scope: str | None = None) -> MissExplanation | None:
        """Why the last completion in `scope` (default: the hook's) restored what it did; None if none ran."""
        scope = self._current_scope() if scope is None else validate_scope(scope)
        last = self._last_prompts.get(scope)
        if last is None:
            return None
        tokens, restored, prepared_at = last
        fingerprint = self._loader.fingerprint
        return explain_prompt(
            self._llm,
            self._store,
            self._notes,
            fingerprint,
            scope,
            tokens,
            restored,
            stored_before=prepared_at,
        )

    def explain_prompt(
        self, prompt: str | Sequence[int] | TokenArray, *, raw: bool = False, scope: str | None = None
    ) -> MissExplanation:
        """What a completion starting with `prompt` would restore, and why (a string is a system
        prompt, as `warm` reads it)."""
        scope = self._current_scope() if scope is None else validate_scope(scope)
        if isinstance(prompt, str) and not raw:
            tokens = self._system_tokens([{"role": "system", "content": prompt}])
        else:
            tokens = self._warm_tokens(prompt)
        self._ready_to_save()
        found = self._store.lookup(self._loader.fingerprint, scope, tokens)
        restored = 0 if found is None else found.key.token_count
        return explain_prompt(
            self._llm, self._store, self._notes, self._loader.fingerprint, scope, tokens, restored
        )

    # -- warm ---------------------------------------------------------------------------------------

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
        started = time.perf_counter()
        self._ready_to_save()
        if isinstance(prompt, str) and not raw:
            tokens = self._system_tokens([{"role": "system", "content": prompt}])
        else:
            tokens = self._warm_tokens(prompt)
        return self._warm(tokens, priority, scope, progress, started)

    def warm_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        priority: int = 0,
        *,
        progress: Progress | None = None,
        scope: str | None = None,
    ) -> WarmResult:
        """`warm` for the leading system (or developer) messages of a chat, as every chat with them shares."""
        started = time.perf_counter()
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidArgument("messages must be a list of chat messages")
        head = system_head(messages)
        if head == 0:
            raise InvalidArgument("nothing to warm: the messages do not start with a system message")
        self._ready_to_save()
        return self._warm(self._system_tokens(list(messages[:head])), priority, scope, progress, started)

    def _warm(
        self, tokens: TokenArray, priority: int, scope: str | None, progress: Progress | None, started: float
    ) -> WarmResult:
        priority = validate_priority(priority)
        scope = self._current_scope() if scope is None else validate_scope(scope)
        total = len(tokens)
        n_ctx = int(self._llm.n_ctx())
        if total >= n_ctx:
            raise InvalidArgument(
                f"the prompt has {total} tokens, but this Llama's context holds {n_ctx} "
                f"(and needs room for one more): create the Llama with n_ctx > {total}"
            )
        return self._loader.store_prefix(tokens, scope, priority, self._alignment, progress, started)

    def _ready_to_save(self) -> None:
        """InvalidArgument when this Llama cannot be cached; else its fingerprint and alignment are
        current."""
        reason = self._uncacheable_reason(saving=True)
        if reason is not None:
            raise InvalidArgument(f"this Llama cannot be cached: {reason}")

    def _system_tokens(self, head: list[Mapping[str, Any]]) -> TokenArray:
        """What every chat starting with these system messages shares, cut to whole checkpoint blocks."""
        shared = self._shared_chat_tokens(head, {})
        if shared is None:
            raise InvalidArgument(
                "this Llama's chat format cannot render a system message; warm the text with raw=True"
            )
        if len(shared) < MIN_PREFIX_TOKENS:
            raise InvalidArgument(
                f"the system prompt is too short to warm: chats with it share {len(shared)} tokens, "
                f"and prefixes of fewer than {MIN_PREFIX_TOKENS} tokens are not worth caching"
            )
        return as_token_array(shared[: align_down(len(shared), self._alignment)])

    def _warm_tokens(self, prompt: str | Sequence[int] | TokenArray) -> TokenArray:
        if isinstance(prompt, str):
            return as_token_array(text_prompt_tokens(self._llm, prompt, add_eos=False))
        if isinstance(prompt, (bytes, bytearray)):
            raise InvalidArgument("prompt must be a str or a sequence of token ids, not bytes")
        tokens = as_token_array(prompt)
        if len(tokens) == 0:
            raise InvalidArgument("nothing to warm: the prompt has no tokens")
        return tokens

    # -- context and store --------------------------------------------------------------------------

    def _current_scope(self) -> str:
        scope = self._scope
        return validate_scope(scope() if callable(scope) else scope)

    # -- chat templates -----------------------------------------------------------------------------

    def _chat_checkpoint(
        self, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]
    ) -> SharedPrefix | None:
        """What every chat that starts with these messages' system part shares (its tokens are worked
        out, and cut to the alignment, when the checkpoints are planned)."""
        if not self._save:
            return None
        head = system_head(messages)
        if head == 0 or head == len(messages):
            return None
        self._rendering = True
        try:
            return self._prefixes.shared(list(messages[:head]), render_options(kwargs))
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


def _add_cached_tokens(result: dict[str, Any], cached_tokens: int) -> None:
    """Report restored tokens where OpenAI clients look for them: usage.prompt_tokens_details."""
    usage = result.get("usage")
    if isinstance(usage, dict):
        details = usage.setdefault("prompt_tokens_details", {})
        if isinstance(details, dict):
            details["cached_tokens"] = cached_tokens
