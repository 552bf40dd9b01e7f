"""Warming: the tokens a prompt stands for (a system prompt as chats share it, raw text, token ids),
and their state stored ahead of the completions that will start with them."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import llama_cpp

from snapcache.errors import InvalidArgument
from snapcache.key import TokenArray, as_token_array, validate_priority
from snapcache.llama.exactness.readiness import Readiness
from snapcache.llama.hook.prefix_loader import PrefixLoader, Progress
from snapcache.llama.stored.checkpoints import MIN_PREFIX_TOKENS
from snapcache.llama.stored.reports import WarmResult
from snapcache.llama.templates.chat_prefix import system_head, text_prompt_tokens

# What every chat starting with these system messages shares (rendered with these options), or None
# when the chat format cannot render them.
SharedChatTokens = Callable[[list[Mapping[str, Any]], dict[str, Any]], TokenArray | None]


class Warmer:
    """Stores the state of a prompt's beginning for one Llama (see `CacheHook.warm`)."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        loader: PrefixLoader,
        readiness: Readiness,
        shared_chat_tokens: SharedChatTokens,
        scope_of: Callable[[str | None], str],
    ) -> None:
        self._llm = llm
        self._loader = loader
        self._readiness = readiness
        self._shared_chat_tokens = shared_chat_tokens
        self._scope_of = scope_of  # a scope given, checked; None: the hook's current one

    def warm(
        self,
        prompt: str | Sequence[int] | TokenArray,
        priority: int,
        *,
        raw: bool,
        progress: Progress | None,
        scope: str | None,
    ) -> WarmResult:
        """See `CacheHook.warm`."""
        started = time.perf_counter()
        self.ready_to_save()
        return self._warm(self.prompt_tokens(prompt, raw=raw), priority, scope, progress, started)

    def warm_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        priority: int,
        *,
        progress: Progress | None,
        scope: str | None,
    ) -> WarmResult:
        """See `CacheHook.warm_chat`."""
        started = time.perf_counter()
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidArgument("messages must be a list of chat messages")
        head = system_head(messages)
        if head == 0:
            raise InvalidArgument("nothing to warm: the messages do not start with a system message")
        self.ready_to_save()
        return self._warm(self._system_tokens(list(messages[:head])), priority, scope, progress, started)

    def prompt_tokens(self, prompt: str | Sequence[int] | TokenArray, *, raw: bool) -> TokenArray:
        """The tokens `prompt` stands for: a string is a system prompt (raw=True: the text as a
        completion prompt would start), a token list is taken as it is."""
        if isinstance(prompt, str) and not raw:
            return self._system_tokens([{"role": "system", "content": prompt}])
        return self._raw_tokens(prompt)

    def ready_to_save(self) -> None:
        """InvalidArgument when this Llama cannot be cached; else its fingerprint and alignment are
        current."""
        reason = self._readiness.reason_not(saving=True)
        if reason is not None:
            raise InvalidArgument(f"this Llama cannot be cached: {reason}")

    def _warm(
        self, tokens: TokenArray, priority: int, scope: str | None, progress: Progress | None, started: float
    ) -> WarmResult:
        priority = validate_priority(priority)
        scope = self._scope_of(scope)
        # States are saved only where reading on from them is a cold read (the split alignment,
        # clear of the ends of the cold read's batches: `ReadGrid`).
        grid = self._readiness.grid
        if grid.at_most(len(tokens)) == 0:
            raise InvalidArgument(
                f"nothing to warm: the prompt has {len(tokens)} tokens, and this model's states are "
                f"saved at multiples of {grid.alignment}, {grid.min_piece} tokens or more into a batch"
            )
        tokens = tokens[: grid.at_most(len(tokens))]
        total = len(tokens)
        n_ctx = int(self._llm.n_ctx())
        if total >= n_ctx:
            raise InvalidArgument(
                f"the prompt has {total} tokens, but this Llama's context holds {n_ctx} "
                f"(and needs room for one more): create the Llama with n_ctx > {total}"
            )
        return self._loader.store_prefix(tokens, scope, priority, grid, progress, started)

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
        return as_token_array(shared[: self._readiness.grid.at_most(len(shared))])

    def _raw_tokens(self, prompt: str | Sequence[int] | TokenArray) -> TokenArray:
        if isinstance(prompt, str):
            return as_token_array(text_prompt_tokens(self._llm, prompt, add_eos=False))
        if isinstance(prompt, (bytes, bytearray)):
            raise InvalidArgument("prompt must be a str or a sequence of token ids, not bytes")
        tokens = as_token_array(prompt)
        if len(tokens) == 0:
            raise InvalidArgument("nothing to warm: the prompt has no tokens")
        return tokens
