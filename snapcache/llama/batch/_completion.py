"""`create_completion` and `create_chat_completion` of a Llama, answered by a `Scheduler`.

Chats are rendered by the Llama's own chat handler: `Llama.create_chat_completion` runs with a
stand-in for the Llama whose `create_completion` is this one, and everything else (tokenizer,
template, metadata) is the Llama's. A completion becomes the Llama's prompt tokens (a text prompt
as `Llama.create_completion` tokenizes it), a request, and the response llama-cpp-python builds:
the same text (stop strings cut it, a partial stop string or UTF-8 character is held back while
streaming), `finish_reason`, `usage` (with `prompt_tokens_details.cached_tokens`), made in the
reader's thread by `_text`. Stopping criteria (llama-cpp-python's template handlers pass one) are
checked on the tokens as `Llama.generate` checks them. A grammar is
sampled in the batch (see `_sampling`). A call the batched path cannot do (logprobs, mirostat,
logits processors, ...) runs on the Llama's own single-sequence path, one at a time, with its
reason logged once. A stream closed early (a client gone) cancels its request.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from snapcache.key import DEFAULT_SCOPE, TokenArray
from snapcache.llama.batch._request import Request
from snapcache.llama.batch._sampling import LazyGrammar, SamplingParams, batched_unsupported
from snapcache.llama.batch._scheduler import Scheduler
from snapcache.llama.batch._text import Call, RequestText
from snapcache.llama.hook.cache_hook import CacheHook
from snapcache.llama.hook.detached_stream import on_own_context
from snapcache.llama.hook.request_streams import stop_with_request
from snapcache.llama.media.chat_images import has_images
from snapcache.llama.stored.reports import CompletionListener
from snapcache.llama.templates.chat_prefix import (
    ChatPrefixFinder,
    agent_head,
    render_options,
    text_prompt_tokens,
)

__all__ = ["BatchedLlama"]

_log = logging.getLogger("snapcache")

_UTF8_TAIL = 3  # the bytes a UTF-8 character may still lack
_REMEMBERED_SCOPES = 64


class BatchedLlama:
    """The completion calls of `scheduler.llm`, run by `scheduler` (see the module docstring).

    `scope` is the scope of every call, or a function returning it; a call's own `scope=` wins.
    `listener` hears what each completion restored and did, on the thread that reads the
    completion; a call's own `listener=` wins. A call the batched path cannot do runs through `hook`
    (a `CacheHook` of the Llama, installed for that call) where given, else through the Llama's own
    `create_completion` (which `snapcache.attach` hooks). `own_context` is the lock of the Llama's
    own context, held by the calls that run there. `last_request` gives each scope's latest batched
    request (to explain what it restored).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        scope: str | Callable[[], str] = DEFAULT_SCOPE,
        listener: CompletionListener | None = None,
        hook: CacheHook | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.llm = scheduler.llm
        self._scope = scope
        self._listener = listener
        self._hook = hook
        # The Llama's own context serves one call at a time: its single-sequence calls, and whatever
        # else its owner runs on it (a server's warm), under this lock.
        self.own_context = threading.Lock()
        self._told: set[str] = set()
        self._renderer = _StandIn(self, Call(DEFAULT_SCOPE, None, False), None)
        self._prefixes = ChatPrefixFinder(self._renderer, self._render)  # type: ignore[arg-type]
        self._rendering = threading.Lock()
        self._last: OrderedDict[str, tuple[Request, float]] = OrderedDict()
        self._last_lock = threading.Lock()

    def create_completion(
        self,
        prompt: str | Sequence[int],
        *,
        scope: str | None = None,
        listener: CompletionListener | None = None,
        special_text: bool = False,
        **kwargs: Any,
    ) -> Any:
        """As `Llama.create_completion` (a dict, or an iterator of chunks with `stream=True`); the
        call's own `scope` and `listener` win over the object's, and `special_text` keeps the
        model's special tokens in its text."""
        call = Call(scope or self._current_scope(), listener or self._listener, special_text)
        return self._complete(prompt, kwargs, call, None, chat=False)

    def create_chat_completion(
        self,
        messages: list[Any],
        *,
        scope: str | None = None,
        listener: CompletionListener | None = None,
        special_text: bool = False,
        **kwargs: Any,
    ) -> Any:
        """As `Llama.create_chat_completion`, with `create_completion`'s own arguments;
        `max_completion_tokens` stands for `max_tokens`."""
        limit = kwargs.pop("max_completion_tokens", None)
        if kwargs.get("max_tokens") is None and limit is not None:
            kwargs["max_tokens"] = limit
        call = Call(scope or self._current_scope(), listener or self._listener, special_text)
        hook = self._hook
        if hook is not None and hook.reads_images and has_images(messages):
            # The scheduler's sequences read text only: mtmd reads images on the Llama's own context.
            chat = functools.partial(
                hook.create_chat_completion,
                messages,
                scope=call.scope,
                listener=call.listener,
                special_text=call.special_text,
            )
            reason = "chats with images (the batched sequences read text only)"
            return self._on_own_context(chat, _free_grammar(kwargs), reason)
        prefix = self._chat_prefix(messages, kwargs)
        stand_in = _StandIn(self, call, prefix)
        return type(self.llm).create_chat_completion(stand_in, messages=messages, **kwargs)  # type: ignore[arg-type]

    def _current_scope(self) -> str:
        return self._scope() if callable(self._scope) else self._scope

    def last_request(self, scope: str) -> tuple[Request, float] | None:
        """The scope's latest request on the batched path and when it was submitted (`time.time()`),
        for the last 64 scopes seen; None if none."""
        with self._last_lock:
            return self._last.get(scope)

    # -- one completion -----------------------------------------------------------------------------

    def _complete(
        self,
        prompt: str | Sequence[int],
        kwargs: dict[str, Any],
        call: Call,
        prefix: TokenArray | None,
        *,
        chat: bool,
    ) -> Any:
        llm = self.llm
        scope = call.scope
        reason = batched_unsupported(kwargs)
        if reason is not None:
            return self._single_path(prompt, kwargs, reason, call)
        tokens = text_prompt_tokens(llm, prompt, add_eos=True) if isinstance(prompt, str) else list(prompt)
        reason = self._too_long(len(tokens), kwargs.get("max_tokens"))
        if reason is not None:
            return self._single_path(prompt, kwargs, reason, call)
        kwargs.pop("model", None)
        stream = bool(kwargs.pop("stream", False))
        criteria = kwargs.pop("stopping_criteria", None)
        stop = kwargs.pop("stop", None)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        params = SamplingParams.from_completion_kwargs(kwargs)
        # As Llama._create_completion: none or <= 0 is up to the context's end, and never past it.
        room = self.scheduler.n_ctx - len(tokens)
        limit = params.max_tokens
        limit = room if limit is None or limit <= 0 else min(limit, room)
        # llama-cpp-python reads on past max_tokens to finish a UTF-8 character: a few tokens more.
        params = replace(params, max_tokens=min(limit + _UTF8_TAIL, room) if room > 0 else limit)
        submitted_at = time.time()
        request = self.scheduler.submit(tokens, params, scope=scope, chat_prefix=prefix, chat=chat)
        with self._last_lock:
            self._last[scope] = (request, submitted_at)
            self._last.move_to_end(scope)
            if len(self._last) > _REMEMBERED_SCOPES:
                self._last.popitem(last=False)
        text = RequestText(llm, request, [s.encode("utf-8") for s in stops if s], limit, criteria, call)
        if stream:
            stop_with_request(request.cancel)  # a reader gone frees the sequence when its request ends
            return text.chunks()
        return text.whole()

    def _too_long(self, n_prompt: int, max_tokens: Any) -> str | None:
        """Why a request must take the Llama's own context: its sequences hold fewer tokens than it
        may need (its prompt and `max_tokens`, or up to the context's end); None if it fits."""
        held = self.scheduler.n_ctx
        full = int(self.llm.n_ctx())
        if held >= full:
            return None
        wanted = full if not isinstance(max_tokens, int) or max_tokens <= 0 else n_prompt + max_tokens
        if wanted <= held:
            return None
        return f"requests that may need more than the {held} tokens a sequence holds (--seq-ctx)"

    def _single_path(
        self, prompt: str | Sequence[int], kwargs: dict[str, Any], reason: str, call: Call
    ) -> Any:
        prompt = prompt if isinstance(prompt, str) else list(prompt)
        hook = self._hook
        complete: Callable[..., Any]
        if hook is not None:
            complete = functools.partial(
                hook.create_completion,
                scope=call.scope,
                listener=call.listener,
                special_text=call.special_text,
            )
        else:  # the instance's own create_completion: a cache hook attached to the Llama serves it
            complete = self.llm.create_completion
        return self._on_own_context(functools.partial(complete, prompt), _free_grammar(kwargs), reason)

    def _on_own_context(self, run: Callable[..., Any], kwargs: dict[str, Any], reason: str) -> Any:
        """`run(**kwargs)` on the Llama's own context, one call at a time (`reason` logged once)."""
        if reason not in self._told:
            self._told.add(reason)
            _log.warning("%s; such calls run one at a time on the Llama's own context", reason)
        # A stream is made in a thread of its own: a reader who stops reading cannot keep the context.
        return on_own_context(lambda: run(**kwargs), self.own_context, stream=bool(kwargs.get("stream")))

    # -- chats --------------------------------------------------------------------------------------

    def _chat_prefix(self, messages: list[Any], kwargs: Mapping[str, Any]) -> TokenArray | None:
        """The tokens every conversation with this head (system messages and tools) starts with
        (None: no head, see `agent_head`)."""
        options = render_options(kwargs)
        head = agent_head(messages, options)
        if head is None:
            return None
        with self._rendering:
            shared = self._prefixes.shared(head, options)
            return None if shared is None else shared.tokens()

    def _render(self, messages: list[Any], options: dict[str, Any]) -> Any:
        return type(self.llm).create_chat_completion(self._renderer, messages=messages, **options)  # type: ignore[arg-type]


def _free_grammar(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` for the Llama's own sampler, which has no lazy grammar: free where one was given."""
    if isinstance(kwargs.get("grammar"), LazyGrammar):
        return {**kwargs, "grammar": None}
    return kwargs


class _StandIn:
    """The Llama to its chat handler, but for `create_completion`, which goes to a `BatchedLlama`."""

    def __init__(self, owner: BatchedLlama, call: Call, prefix: TokenArray | None) -> None:
        self._owner = owner
        self._call = call
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.llm, name)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(self._owner.llm.tokenize(text, add_bos, special))

    def create_completion(self, prompt: str | Sequence[int] | None = None, **kwargs: Any) -> Any:
        return self._owner._complete(prompt or "", kwargs, self._call, self._prefix, chat=True)
