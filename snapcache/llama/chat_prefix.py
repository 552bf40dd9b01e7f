"""The token prefix every chat that starts with the same system messages shares.

A chat template renders the system messages, then the first user turn; where the user's text starts
(and how the tokenizer merges it with the template's last characters) decides how many tokens all
such chats have in common. `ChatPrefixFinder` renders the system part with several different user
messages the way the Llama itself will, and keeps the tokens all of them share. Results are memoized:
an agent sends the same system prompt again and again.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import llama_cpp
import numpy as np

from snapcache.key import TokenArray, as_token_array

__all__ = [
    "SYSTEM_ROLES",
    "ChatPrefixFinder",
    "common_prefix",
    "patched",
    "system_head",
    "text_prompt_tokens",
]

_log = logging.getLogger("snapcache")

# User messages that differ from their first character on: what all of their renderings share is
# what every chat with the same earlier messages shares, even where the tokenizer merges the start of
# the user's text with the template's last characters.
_PROBE_USER_MESSAGES = ("Hello.", " What can you do?", "\n\n1 + 1 = ?", "¿Qué tal?")
SYSTEM_ROLES = ("system", "developer")
# The chat options that can change how a template renders the messages.
RENDER_OPTIONS = ("functions", "function_call", "tools", "tool_choice")
_MEMO_SIZE = 32
_MISSING = object()


class _RenderedPrompt(Exception):
    """Carries the prompt a chat handler built out of the call it was about to make."""

    def __init__(self, prompt: Any) -> None:
        super().__init__("rendered")
        self.prompt = prompt


class ChatPrefixFinder:
    """Renders chats the way one Llama will, without generating; memoizes shared system prefixes."""

    def __init__(
        self, llm: llama_cpp.Llama, render: Callable[[list[Mapping[str, Any]], dict[str, Any]], Any]
    ) -> None:
        """`render(messages, options)` calls the Llama's chat completion path for those messages."""
        self._llm = llm
        self._render_call = render
        self._memo: OrderedDict[str, TokenArray] = OrderedDict()

    def shared_tokens(self, head: list[Mapping[str, Any]], options: dict[str, Any]) -> TokenArray | None:
        """The tokens every chat starting with `head` shares; None when the chat format cannot render it."""
        try:
            memo_key = json.dumps([head, options], sort_keys=True, default=repr)
        except (TypeError, ValueError):
            memo_key = None
        if memo_key is not None and memo_key in self._memo:
            self._memo.move_to_end(memo_key)
            return self._memo[memo_key]
        renders: list[TokenArray] = []
        for text in _PROBE_USER_MESSAGES:
            rendered = self.render([*head, {"role": "user", "content": text}], options)
            if rendered is None:
                return None
            renders.append(rendered)
        common = min(common_prefix(renders[0], other) for other in renders[1:])
        prefix = as_token_array(renders[0][:common])
        if memo_key is not None:
            self._memo[memo_key] = prefix
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return prefix

    def render(self, messages: list[Mapping[str, Any]], options: dict[str, Any]) -> TokenArray | None:
        """The prompt tokens a chat completion of `messages` would generate from, without generating."""
        llm = self._llm

        def intercept(prompt: Any = None, *args: Any, **kwargs: Any) -> Any:
            raise _RenderedPrompt(prompt)

        try:
            with patched(llm, "create_completion", intercept):
                self._render_call(messages, options)
        except _RenderedPrompt as rendered:
            if isinstance(rendered.prompt, str):
                return as_token_array(text_prompt_tokens(llm, rendered.prompt, add_eos=True))
            if isinstance(rendered.prompt, list):
                return as_token_array(rendered.prompt)
            return None
        except Exception as exc:  # a template that rejects the probe just means no checkpoint
            _log.debug("chat format could not render the probe messages: %s", exc)
            return None
        return None


def system_head(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many leading messages are system (or developer) messages."""
    head = 0
    while head < len(messages) and _role(messages[head]) in SYSTEM_ROLES:
        head += 1
    return head


def render_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The chat options of a call that can change how its messages render."""
    return {name: kwargs[name] for name in RENDER_OPTIONS if kwargs.get(name) is not None}


@contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Shadow an attribute on one instance for the duration of a call."""
    previous = vars(obj).get(name, _MISSING)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if previous is _MISSING:
            delattr(obj, name)
        else:
            setattr(obj, name, previous)


def text_prompt_tokens(llm: llama_cpp.Llama, text: str, *, add_eos: bool) -> list[int]:
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


def common_prefix(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    """The number of leading elements `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _role(message: Mapping[str, Any]) -> object:
    try:
        return cast(Any, message)["role"]
    except (KeyError, TypeError):
        return None
