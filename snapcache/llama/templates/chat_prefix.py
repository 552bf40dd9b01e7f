"""The token prefix every chat that starts with the same system messages shares.

A chat template renders the system messages, then the first user turn; where the user's text starts
(and how the tokenizer merges it with the template's last characters) decides how many tokens all
such chats have in common. `ChatPrefixFinder` renders the system part with several different user
messages the way the Llama itself will (no generation), and keeps the text all of them start with;
its tokens, but for the last few that the next characters could merge with, are what every such
chat shares. Tokenizing a long system prompt takes a while (0.1 s for 9,000 Gemma tokens on 2
cores), so it happens only when asked for: a prompt restored up to the last checkpoint that text
could give needs none (`SharedPrefix.reached` decodes the restored tokens instead). Results are
memoized: an agent sends the same system prompt again and again. A chat format that hands over
tokens, not text, is probed by tokens.
"""

from __future__ import annotations

import ctypes
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import llama_cpp
import llama_cpp.llama_tokenizer
import numpy as np

from snapcache.key import IMAGE_KEY_BASE, TokenArray, as_token_array

__all__ = [
    "SYSTEM_ROLES",
    "ChatPrefixFinder",
    "RenderedText",
    "SharedPrefix",
    "agent_head",
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
_TOOL_OPTIONS = ("functions", "tools")
_MEMO_SIZE = 32
_MISSING = object()
# The last tokens of the shared text that the characters after it could merge with: dropped.
_MERGE_MARGIN_TOKENS = 2


@dataclass(frozen=True, slots=True)
class RenderedText:
    """A prompt as a chat handler rendered it: its bytes, and how they become tokens: as the handler
    tokenizes them (whether a BOS goes first), or (None) as `create_completion` tokenizes a text
    prompt (`text_prompt_tokens`)."""

    text: bytes
    add_bos: bool | None

    def tokens(self, llm: llama_cpp.Llama) -> list[int]:
        if self.add_bos is None:  # a cut inside a character drops its bytes: the end is dropped anyway
            return text_prompt_tokens(llm, self.text.decode("utf-8", "ignore"), add_eos=False)
        return list(llm.tokenize(self.text, add_bos=self.add_bos, special=True))


class SharedPrefix:
    """What every chat that starts with the same system messages shares: the rendered text they all
    start with (None where the chat format hands over tokens), and its tokens, worked out once."""

    def __init__(
        self, llm: llama_cpp.Llama, text: RenderedText | None, tokens: TokenArray | None = None
    ) -> None:
        self._llm = llm
        self.text = text
        self._tokens = tokens

    def tokens(self) -> TokenArray:
        """The tokens every such chat starts with."""
        if self._tokens is None:
            assert self.text is not None
            tokens = self.text.tokens(self._llm)
            self._tokens = as_token_array(tokens[: max(0, len(tokens) - _MERGE_MARGIN_TOKENS)])
        return self._tokens

    def reached(self, prompt: TokenArray, n_tokens: int, alignment: int) -> bool:
        """Whether a checkpoint at the end of this prefix, on a multiple of `alignment`, would lie
        within the first `n_tokens` of `prompt` (a chat starting with this prefix): then it spares
        nothing. Decodes those tokens and tokenizes only the text after them, a fraction of
        tokenizing the whole text; False whenever unsure."""
        if self._tokens is not None:
            return len(self._tokens) // alignment * alignment <= n_tokens
        if self.text is None or n_tokens <= 0:
            return False
        llm = self._llm
        lead = len(RenderedText(b"", self.text.add_bos).tokens(llm))  # a BOS or CLS, not in the text
        restored = prompt[lead:n_tokens]
        images = np.flatnonzero(restored >= IMAGE_KEY_BASE)
        if len(images):
            restored = restored[: images[0]]  # an image's key tokens are no text to decode
        text = self.text.text
        for decode in (_decode_at_once, _decode_by_token):
            decoded = decode(llm, restored)
            if decoded is None:
                continue
            shared = _common_bytes(decoded, text)
            if shared == len(text) or (shared == len(decoded) and not len(images)):
                break
        else:
            return False  # they part ways inside the text (or decoding does not give it back)
        rest = RenderedText(text[shared:], add_bos=False).tokens(llm) if shared < len(text) else []
        return (n_tokens + len(rest)) // alignment * alignment <= n_tokens


class _RenderedPrompt(Exception):
    """Carries the prompt a chat handler built out of the call it was about to make."""

    def __init__(self, prompt: RenderedText | TokenArray | None) -> None:
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
        self._memo: OrderedDict[str, SharedPrefix] = OrderedDict()

    def shared_tokens(self, head: list[Mapping[str, Any]], options: dict[str, Any]) -> TokenArray | None:
        """The tokens every chat starting with `head` shares; None when the chat format cannot render it."""
        prefix = self.shared(head, options)
        if prefix is None:
            return None
        tokens = prefix.tokens()
        if prefix.text is None:
            return tokens
        # The shared text's tokens, checked against a whole chat's (once per system prompt, for `warm`).
        probe = self.render([*head, {"role": "user", "content": _PROBE_USER_MESSAGES[0]}], options)
        return tokens if probe is None else as_token_array(tokens[: common_prefix(tokens, probe)])

    def shared(self, head: list[Mapping[str, Any]], options: dict[str, Any]) -> SharedPrefix | None:
        """What every chat starting with `head` shares; None when the chat format cannot render it."""
        try:
            memo_key = json.dumps([head, options], sort_keys=True, default=repr)
        except (TypeError, ValueError):
            memo_key = None
        if memo_key is not None and memo_key in self._memo:
            self._memo.move_to_end(memo_key)
            return self._memo[memo_key]
        renders: list[RenderedText | TokenArray] = []
        for text in _PROBE_USER_MESSAGES:
            rendered = self._render_prompt([*head, {"role": "user", "content": text}], options)
            if rendered is None:
                return None
            renders.append(rendered)
        texts = [r for r in renders if isinstance(r, RenderedText)]
        if len(texts) == len(renders) and len({t.add_bos for t in texts}) == 1:
            common = min(_common_bytes(texts[0].text, other.text) for other in texts[1:])
            prefix = SharedPrefix(self._llm, RenderedText(texts[0].text[:common], texts[0].add_bos))
        else:
            tokens = [self._as_tokens(r) for r in renders]
            common = min(common_prefix(tokens[0], other) for other in tokens[1:])
            prefix = SharedPrefix(self._llm, None, as_token_array(tokens[0][:common]))
        if memo_key is not None:
            self._memo[memo_key] = prefix
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return prefix

    def render(self, messages: list[Mapping[str, Any]], options: dict[str, Any]) -> TokenArray | None:
        """The prompt tokens a chat completion of `messages` would generate from, without generating."""
        rendered = self._render_prompt(messages, options)
        return None if rendered is None else self._as_tokens(rendered)

    def _as_tokens(self, rendered: RenderedText | TokenArray) -> TokenArray:
        if isinstance(rendered, RenderedText):
            return as_token_array(rendered.tokens(self._llm))
        return rendered

    def _render_prompt(
        self, messages: list[Mapping[str, Any]], options: dict[str, Any]
    ) -> RenderedText | TokenArray | None:
        """The prompt a chat completion of `messages` would generate from: the text the handler is
        about to tokenize (llama-cpp-python's template handlers tokenize it themselves: the first
        text holding the last message's content), or the text or tokens it hands to
        `create_completion`."""
        llm = self._llm
        last = messages[-1].get("content") if messages else None
        # Templates may trim a message: look for its content without the spaces around it.
        marker = last.strip().encode("utf-8") if isinstance(last, str) and last.strip() else None

        def intercept_tokenize(text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
            if marker is None or not isinstance(text, bytes) or marker not in text:
                return list(type(llm).tokenize(llm, text, add_bos, special))  # not the prompt
            raise _RenderedPrompt(RenderedText(text, bool(add_bos)))

        def intercept(prompt: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(prompt, str):
                raise _RenderedPrompt(RenderedText(prompt.encode("utf-8"), None))
            if isinstance(prompt, list):
                raise _RenderedPrompt(as_token_array(prompt))
            raise _RenderedPrompt(None)

        try:
            with patched(llm, "create_completion", intercept), patched(llm, "tokenize", intercept_tokenize):
                self._render_call(messages, options)
        except _RenderedPrompt as rendered:
            return rendered.prompt
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


def agent_head(
    messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any]
) -> list[Mapping[str, Any]] | None:
    """The leading messages whose rendering, with the tools in `options`, every conversation of an
    agent shares: its system (or developer) messages, none where only the tools lead (a template
    that renders them before the first user turn); None where nothing is shared before the
    conversation's own messages, or nothing follows (a prompt of system messages alone)."""
    head = system_head(messages)
    if head == len(messages) or (head == 0 and not any(options.get(name) for name in _TOOL_OPTIONS)):
        return None
    return list(messages[:head])


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


def _decode_at_once(llm: llama_cpp.Llama, tokens: TokenArray) -> bytes | None:
    """The text of `tokens` decoded by llama.cpp in one call (0.1 ms for 4,000 tokens, against 6 ms
    for `Llama.detokenize`, a call per token); None where the Llama has a tokenizer of its own.

    llama.cpp may drop a leading space or clean spaces up where the per-token decoding keeps them:
    a result that disagrees with the expected text is decoded again by `_decode_by_token`."""
    if type(llm.tokenizer_) is not llama_cpp.llama_tokenizer.LlamaTokenizer or not len(tokens):
        return None
    if not _in_vocabulary(llm, tokens):
        return None
    ids = np.ascontiguousarray(tokens, dtype=np.int32)
    pointer = ids.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
    vocab = llm._model.vocab
    capacity = 8 * len(ids) + 64
    for _attempt in range(2):
        buffer = ctypes.create_string_buffer(capacity)
        written = int(llama_cpp.llama_detokenize(vocab, pointer, len(ids), buffer, capacity, False, True))
        if written >= 0:
            return buffer.raw[:written]
        capacity = -written  # llama.cpp says how many bytes it needs
    return None


def _in_vocabulary(llm: llama_cpp.Llama, tokens: TokenArray) -> bool:
    """Whether every token is one of the model's: llama.cpp's detokenizer throws, and the process
    aborts, on any other (an image's key tokens, see `IMAGE_KEY_BASE`)."""
    return not len(tokens) or (int(tokens.min()) >= 0 and int(tokens.max()) < int(llm.n_vocab()))


def _decode_by_token(llm: llama_cpp.Llama, tokens: TokenArray) -> bytes | None:
    """The text of `tokens` as `Llama.detokenize` gives it; None when it cannot."""
    if not _in_vocabulary(llm, tokens):
        return None
    try:
        return llm.detokenize(tokens.tolist(), special=True)
    except (RuntimeError, ValueError, UnicodeError):
        return None


def _common_bytes(a: bytes, b: bytes) -> int:
    """The number of leading bytes `a` and `b` share."""
    return common_prefix(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


def _role(message: Mapping[str, Any]) -> object:
    try:
        return cast(Any, message)["role"]
    except (KeyError, TypeError):
        return None
