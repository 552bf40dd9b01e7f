"""CachedLlama: restore the longest cached prefix before a completion, save the state after it.

The wrapped `llama_cpp.Llama` still does all the work (tokenizing, chat templates, sampling, grammar,
stop handling). CachedLlama steps in once per completion, at the moment llama-cpp-python hands the
final prompt tokens to `Llama.generate`: it loads the longest stored prefix of exactly those tokens
into the context, reads on to a few checkpoints, and lets `generate` evaluate only the rest. After
the completion (for a stream: when it is exhausted or closed) it saves the state of the context,
keyed by the tokens the context holds.

Checkpoints, so that a later prompt that shares only a beginning with this one still restores it.
They sit at multiples of 64 tokens: llama.cpp's CPU kernels read a batch of tokens in blocks of four
rows, so a prompt read on from an aligned checkpoint gives bit-for-bit the results of a cold read.

- chat completions: the end of the leading system messages (the token prefix every chat with those
  messages shares, found by rendering them with several different user messages), and the end of
  the prompt, just before the reply: the next turn of the same chat starts with it;
- raw completions: a ladder of prefix lengths (with `prefix_reuse=0.9`: every 64 tokens up to 1152,
  then the largest multiple of 64 at most 1/0.9 times the one before: 1280, 1408, ..., 1792, 1984,
  ...), so that a later prompt sharing L tokens with this one restores at least 90% of them once
  L >= 640, and all but 63 before. Sliding-window models (Gemma 3) cannot cut a restored state back,
  so the ladder is stored: 24 states for a first 2,000-token prompt (about 10 times its final state
  on Gemma-3-270M), then one or two for each later prompt that shares its beginning, as the grid is
  absolute. Ladder states are saved one priority lower than the others, so that they are evicted
  first; `prefix_reuse=None` turns the ladder off (chat completions and `warm` need none).

Not thread-safe, like the Llama it wraps.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import llama_cpp
import numpy as np

from snapcache.errors import InvalidArgument, SnapcacheError
from snapcache.key import (
    DEFAULT_SCOPE,
    SnapshotKey,
    TokenArray,
    as_token_array,
    validate_priority,
    validate_scope,
)
from snapcache.llama.fingerprint import model_fingerprint
from snapcache.llama.state import can_truncate_to, capture_sequence, restore_sequence, truncate_sequence
from snapcache.snapshot import MAX_PRIORITY, Snapshot
from snapcache.store import SnapshotStore

__all__ = ["CachedLlama", "RestoreInfo", "WarmResult"]

_log = logging.getLogger("snapcache")

Source = Literal["ram", "disk", "context"]
Progress = Callable[[int, int], None]

DEFAULT_MIN_TOKENS = 32
DEFAULT_PREFIX_REUSE = 0.9
# Checkpoints sit at multiples of this many tokens (see the module docstring).
CHECKPOINT_ALIGN = 64

# User messages that differ from their first character on: what all of their renderings share is
# what every chat with the same earlier messages shares, even where the tokenizer merges the start of
# the user's text with the template's last characters.
_PROBE_USER_MESSAGES = ("Hello.", " What can you do?", "\n\n1 + 1 = ?", "¿Qué tal?")
_SYSTEM_ROLES = ("system", "developer")
# The chat options that can change how a template renders the messages.
_RENDER_OPTIONS = ("functions", "function_call", "tools", "tool_choice")
_MEMO_SIZE = 32
_MISSING = object()


@dataclass(frozen=True, slots=True)
class RestoreInfo:
    """What the last completion reused of its prompt.

    `restored_tokens` came from a snapshot (`source` "ram" or "disk") or were already in the Llama's
    context ("context"); `evaluated_tokens` were read by llama.cpp. A prompt exactly as long as its
    snapshot evaluates its last token again (a state carries no logits), so the two can add up to one
    more than `prompt_tokens`. `checkpoints` counts the states saved while reading the prompt.
    """

    prompt_tokens: int
    restored_tokens: int
    evaluated_tokens: int
    source: Source | None
    checkpoints: int


@dataclass(frozen=True, slots=True)
class WarmResult:
    """The snapshot `warm` stored (or found already stored: `from_cache`)."""

    key: SnapshotKey
    token_count: int
    state_bytes: int
    seconds: float
    from_cache: bool


class _RenderedPrompt(Exception):
    """Carries the prompt a chat handler built out of the call it was about to make."""

    def __init__(self, prompt: Any) -> None:
        super().__init__("rendered")
        self.prompt = prompt


@dataclass(slots=True)
class _Call:
    """One completion in flight: the checkpoints it asked for and what it has done so far."""

    chat_prefix: TokenArray | None
    ladder: bool
    prepared: bool = False
    saved_upto: int = 0  # the longest prefix of the context known to be stored or restored
    checkpoints: int = 0


class CachedLlama:
    """A `llama_cpp.Llama` whose completions restore cached prefixes and save their states.

    `save=False` only restores. No state is saved that would spare fewer than `min_tokens` tokens
    over one already stored. `prefix_reuse` (None: off) sets the checkpoint ladder of raw
    completions. `priority` goes with every state a completion saves (ladder points: one lower).
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
    ) -> None:
        if not isinstance(store, SnapshotStore):
            raise InvalidArgument(f"store must be a SnapshotStore, got {type(store).__name__}")
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
        self._fingerprint = model_fingerprint(llm)
        n_ctx = int(llm.n_ctx())
        self._ladder = [] if prefix_reuse is None else _ladder_points(CHECKPOINT_ALIGN, prefix_reuse, n_ctx)
        self._prefix_memo: OrderedDict[str, TokenArray] = OrderedDict()
        self.last_restore: RestoreInfo | None = None

    # -- properties ---------------------------------------------------------------------------------

    @property
    def llm(self) -> llama_cpp.Llama:
        return self._llm

    @property
    def store(self) -> SnapshotStore:
        return self._store

    @property
    def scope(self) -> str:
        return self._scope

    @property
    def fingerprint(self) -> str:
        """The model fingerprint every snapshot of this Llama is stored under."""
        return self._fingerprint

    def __repr__(self) -> str:
        return f"CachedLlama(scope={self._scope!r}, fingerprint={self._fingerprint[:12]}…)"

    # -- completions --------------------------------------------------------------------------------

    def create_completion(self, prompt: str | list[int], **kwargs: Any) -> Any:
        """`Llama.create_completion`, restoring the longest cached prefix first and saving after."""
        if kwargs.get("echo") and kwargs.get("logprobs") is not None:
            # Echoed log-probabilities need the logits of every prompt token; a state has none.
            self.last_restore = None
            return self._llm.create_completion(prompt, **kwargs)
        call = _Call(chat_prefix=None, ladder=bool(self._ladder))
        return self._run(call, lambda: self._llm.create_completion(prompt, **kwargs), kwargs)

    __call__ = create_completion

    def create_chat_completion(self, messages: list[Mapping[str, Any]], **kwargs: Any) -> Any:
        """`Llama.create_chat_completion`, restoring the longest cached prefix first and saving after."""
        call = _Call(chat_prefix=self._chat_checkpoint(messages, kwargs), ladder=False)
        chat_messages: Any = messages

        def complete() -> Any:
            return self._llm.create_chat_completion(messages=chat_messages, **kwargs)

        return self._run(call, complete, kwargs)

    def _run(self, call: _Call, complete: Callable[[], Any], kwargs: Mapping[str, Any]) -> Any:
        self.last_restore = None
        if kwargs.get("stream"):
            return self._stream(call, complete)
        with self._intercept_generate(call):
            result = complete()
        self._finish(call)
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

        def generate(tokens: Sequence[int], *args: Any, **kwargs: Any) -> Any:
            if not call.prepared:
                call.prepared = True
                self._prepare(tokens, call)
            return original(tokens, *args, **kwargs)

        with _patched(self._llm, "generate", generate):
            yield

    def _prepare(self, prompt: Sequence[int], call: _Call) -> None:
        """Load the longest cached prefix of `prompt` into the context, then read on to checkpoints."""
        llm = self._llm
        tokens = as_token_array(prompt)
        n = len(tokens)
        if n == 0 or n >= int(llm.n_ctx()):
            return  # llama-cpp-python raises or handles these itself
        reused, source = self._load_prefix(tokens)
        call.saved_upto = reused
        if self._save:
            for point, priority in self._checkpoints(tokens, call):
                if point - call.saved_upto < self._min_tokens:
                    continue
                llm.eval(tokens[int(llm.n_tokens) : point].tolist())
                if self._save_context(priority):
                    call.checkpoints += 1
                call.saved_upto = point
        evaluated = n - min(reused, n - 1)
        self.last_restore = RestoreInfo(n, reused, evaluated, source, call.checkpoints)
        _log.debug("prompt of %d tokens: %d reused (%s), %d to evaluate", n, reused, source, evaluated)

    def _checkpoints(self, tokens: TokenArray, call: _Call) -> list[tuple[int, int]]:
        """(prefix length, priority) to save on the way through this prompt, ascending, all short of
        its last token; ladder points go one priority lower."""
        n = len(tokens)
        points = {p: _lower(self._priority) for p in self._ladder if p < n - 1} if call.ladder else {}
        points[_align_down(n - 1)] = self._priority
        prefix = call.chat_prefix
        if prefix is not None and len(prefix) < n and np.array_equal(tokens[: len(prefix)], prefix):
            points[len(prefix)] = self._priority
        return sorted((p, priority) for p, priority in points.items() if p > call.saved_upto)

    def _finish(self, call: _Call) -> None:
        """Save the context after a completion, keyed by the tokens it holds (never the last sampled one)."""
        if not (self._save and call.prepared):
            return
        if int(self._llm.n_tokens) - call.saved_upto >= self._min_tokens:
            self._save_context(self._priority)

    # -- warm ---------------------------------------------------------------------------------------

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
        prompt so short that chats with it share less than one checkpoint block (64 tokens).
        """
        started = time.perf_counter()
        priority = validate_priority(priority)
        tokens = self._warm_tokens(prompt, raw)
        total = len(tokens)
        n_ctx = int(self._llm.n_ctx())
        if total >= n_ctx:
            raise InvalidArgument(
                f"the prompt has {total} tokens, but this Llama's context holds {n_ctx} "
                f"(and needs room for one more): create the Llama with n_ctx > {total}"
            )
        key = SnapshotKey.for_tokens(self._fingerprint, self._scope, tokens)
        existing = self._store.get(key)
        if existing is not None:
            if existing.priority != priority:
                self._store.put(key, tokens, existing.state, priority, existing.logits)
            if progress is not None:
                progress(total, total)
            state_bytes = memoryview(existing.state).nbytes
            return WarmResult(key, total, state_bytes, time.perf_counter() - started, True)

        llm = self._llm
        self._load_prefix(tokens)
        done = int(llm.n_tokens)
        if progress is not None:
            progress(done, total)
        batch = max(1, int(llm.n_batch))
        while done < total:
            end = min(done + batch, total)
            llm.eval(tokens[done:end].tolist())
            done = end
            if progress is not None:
                progress(done, total)
        captured = capture_sequence(llm)
        self._store.put(key, captured.tokens, captured.state, priority, captured.logits)
        return WarmResult(key, total, captured.state.nbytes, time.perf_counter() - started, False)

    def _warm_tokens(self, prompt: str | Sequence[int] | TokenArray, raw: bool) -> TokenArray:
        if isinstance(prompt, str):
            if raw:
                return as_token_array(_text_prompt_tokens(self._llm, prompt, add_eos=False))
            shared = self._shared_chat_tokens([{"role": "system", "content": prompt}], {})
            if shared is None:
                raise InvalidArgument(
                    "this Llama's chat format cannot render a system message; warm the text with raw=True"
                )
            if len(shared) < CHECKPOINT_ALIGN:
                raise InvalidArgument(
                    f"the system prompt is too short to warm: chats with it share {len(shared)} tokens, "
                    f"and chat prefixes are cached in whole blocks of {CHECKPOINT_ALIGN} tokens"
                )
            return as_token_array(shared[: _align_down(len(shared))])
        if isinstance(prompt, (bytes, bytearray)):
            raise InvalidArgument("prompt must be a str or a sequence of token ids, not bytes")
        tokens = as_token_array(prompt)
        if len(tokens) == 0:
            raise InvalidArgument("nothing to warm: the prompt has no tokens")
        return tokens

    # -- context and store --------------------------------------------------------------------------

    def _load_prefix(self, tokens: TokenArray) -> tuple[int, Source | None]:
        """Make the context hold the longest available prefix of `tokens`; return its length and source.

        The Llama's own context wins when it already holds at least as long a prefix that it can be cut
        back to; otherwise the store's longest prefix is restored.
        """
        llm = self._llm
        live = self._reusable_context(tokens)
        if live < len(tokens):
            found = self._lookup(tokens)
            if found is not None and found[0].key.token_count > live:
                snapshot, tier = found
                if restore_sequence(llm, snapshot, tokens):
                    return snapshot.key.token_count, tier
                if int(llm.n_tokens) == 0:
                    return 0, None  # empty: llama.cpp refused the state and the sequence was cleared
                # Refused before any byte reached llama.cpp: the context is as it was; cut it back.
        if live < int(llm.n_tokens) and not truncate_sequence(llm, live):
            truncate_sequence(llm, 0)  # _reusable_context said it could; llama.cpp disagreed
            live = 0
        return live, "context" if live > 0 else None

    def _reusable_context(self, tokens: TokenArray) -> int:
        """How many tokens of `tokens` the context holds and can be cut back to."""
        held = int(self._llm.n_tokens)
        if held == 0:
            return 0
        common = _common_prefix(np.asarray(self._llm.input_ids[:held]), tokens)
        return common if can_truncate_to(self._llm, common) else 0

    def _lookup(self, tokens: TokenArray) -> tuple[Snapshot, Source] | None:
        """The store's longest prefix of `tokens` and the tier that served it; None on a miss."""
        try:
            return self._store.lookup_with_tier(self._fingerprint, self._scope, tokens)
        except (SnapcacheError, OSError) as exc:
            _log.warning("snapshot lookup failed, reading the prompt in full: %s", exc)
            return None

    def _save_context(self, priority: int) -> bool:
        """Capture the context's state into the store; False (logged) when that fails."""
        try:
            captured = capture_sequence(self._llm)
            key = SnapshotKey.for_tokens(self._fingerprint, self._scope, captured.tokens)
            stored = self._store.put(key, captured.tokens, captured.state, priority, captured.logits)
        except (SnapcacheError, OSError) as exc:
            _log.warning("could not save the state of %d tokens: %s", int(self._llm.n_tokens), exc)
            return False
        return stored is not None

    # -- chat templates -----------------------------------------------------------------------------

    def _chat_checkpoint(
        self, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]
    ) -> TokenArray | None:
        """The token prefix shared by every chat that starts with these messages' system part."""
        if not self._save:
            return None
        head = 0
        while head < len(messages) and _role(messages[head]) in _SYSTEM_ROLES:
            head += 1
        if head == 0 or head == len(messages):
            return None
        options = {name: kwargs[name] for name in _RENDER_OPTIONS if kwargs.get(name) is not None}
        shared = self._shared_chat_tokens(list(messages[:head]), options)
        if shared is None or len(shared) < CHECKPOINT_ALIGN:
            return None
        return as_token_array(shared[: _align_down(len(shared))])

    def _shared_chat_tokens(
        self, head: list[Mapping[str, Any]], options: dict[str, Any]
    ) -> TokenArray | None:
        """Render `head` plus each probe user message the way the Llama will; keep the common tokens.

        None when the chat format cannot render them.
        """
        try:
            memo_key = json.dumps([head, options], sort_keys=True, default=repr)
        except (TypeError, ValueError):
            memo_key = None
        if memo_key is not None and memo_key in self._prefix_memo:
            self._prefix_memo.move_to_end(memo_key)
            return self._prefix_memo[memo_key]
        renders: list[TokenArray] = []
        for text in _PROBE_USER_MESSAGES:
            rendered = self._render_chat([*head, {"role": "user", "content": text}], options)
            if rendered is None:
                return None
            renders.append(rendered)
        common = min(_common_prefix(renders[0], other) for other in renders[1:])
        prefix = as_token_array(renders[0][:common])
        if memo_key is not None:
            self._prefix_memo[memo_key] = prefix
            if len(self._prefix_memo) > _MEMO_SIZE:
                self._prefix_memo.popitem(last=False)
        return prefix

    def _render_chat(self, messages: list[Mapping[str, Any]], options: dict[str, Any]) -> TokenArray | None:
        """The prompt tokens `create_chat_completion` would generate from, without generating."""
        llm = self._llm

        def intercept(prompt: Any = None, *args: Any, **kwargs: Any) -> Any:
            raise _RenderedPrompt(prompt)

        try:
            with _patched(llm, "create_completion", intercept):
                llm.create_chat_completion(messages=cast(Any, messages), **options)
        except _RenderedPrompt as rendered:
            if isinstance(rendered.prompt, str):
                return as_token_array(_text_prompt_tokens(llm, rendered.prompt, add_eos=True))
            if isinstance(rendered.prompt, list):
                return as_token_array(rendered.prompt)
            return None
        except Exception as exc:  # a template that rejects the probe just means no checkpoint
            _log.debug("chat format could not render the probe messages: %s", exc)
            return None
        return None


# -- module helpers ----------------------------------------------------------------------------------


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Shadow a method on one instance for the duration of a call."""
    previous = vars(obj).get(name, _MISSING)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if previous is _MISSING:
            delattr(obj, name)
        else:
            setattr(obj, name, previous)


def _text_prompt_tokens(llm: llama_cpp.Llama, text: str, *, add_eos: bool) -> list[int]:
    """Tokens of a text prompt as `Llama._create_completion` builds them (BOS or CLS, then EOS/SEP)."""
    model = llm._model
    cls_token, sep_token = int(model.token_cls()), int(model.token_sep())
    bos = cls_token if cls_token != -1 else int(llm.token_bos())
    eos = sep_token if sep_token != -1 else int(llm.token_eos())
    tokens: list[int] = [bos] if model.add_bos_token() and bos != -1 else []
    if text:
        tokens += llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    if add_eos and (model.add_eos_token() or sep_token != -1):
        tokens.append(eos)
    return tokens


def _common_prefix(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _ladder_points(step: int, reuse: float, limit: int) -> list[int]:
    """Multiples of `step` below `limit`, each the largest at most 1/reuse times the one before.

    Any length L has a point p <= L with p >= reuse * L or p > L - step: a later prompt sharing L
    tokens restores at least `reuse` of them once L >= step / (1 - reuse), and all but `step` before.
    """
    points = []
    point = step
    while point < limit:
        points.append(point)
        point = max(point + step, int(point / reuse) // step * step)
    return points


def _align_down(n_tokens: int) -> int:
    return n_tokens // CHECKPOINT_ALIGN * CHECKPOINT_ALIGN


def _lower(priority: int) -> int:
    return max(-MAX_PRIORITY, priority - 1)


def _role(message: Mapping[str, Any]) -> object:
    try:
        return message["role"]
    except (KeyError, TypeError):
        return None
