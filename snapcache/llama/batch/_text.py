"""The text of one batched request's tokens, as `Llama._create_completion` makes it, and the call
settings it is made under.

The text is made in the reader's thread, never the scheduler's: each token's text the Llama's
detokenizer gives (special tokens kept where the call asks), stop strings cut it, a partial stop
string or UTF-8 character is held back while streaming, `finish_reason` and `usage` (with
`prompt_tokens_details.cached_tokens`) as llama-cpp-python reports them; stopping criteria checked
on the tokens as `Llama.generate` checks them. The call's listener hears what the request restored
before its first token goes out, and what it did once it ends.
"""

from __future__ import annotations

import codecs
import functools
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp.llama_tokenizer import LlamaTokenizer

from snapcache.llama.batch._request import Request, SchedulerError
from snapcache.llama.stored.reports import CompletionListener, CompletionReport

__all__ = ["Call", "RequestText"]


@dataclass(frozen=True, slots=True)
class Call:
    """One call's own settings: its scope, who hears of it, and whether its text keeps special tokens."""

    scope: str
    listener: CompletionListener | None
    special_text: bool


class RequestText:
    """The text of one request's tokens, as `Llama._create_completion` makes it."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        request: Request,
        stops: list[bytes],
        max_tokens: int,
        criteria: Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool] | None,
        call: Call,
    ) -> None:
        self._llm = llm
        self._listener = call.listener
        self._special = call.special_text
        self._criteria = criteria
        self._request = request
        self._stops = stops
        self._max_tokens = max_tokens
        self._prompt = request.prompt.tolist()
        self._id = f"cmpl-{uuid.uuid4()}"
        self._created = int(time.time())
        self._model = llm.model_path
        self._told = False
        # llama-cpp-python's own tokenizer: the text grows a piece a token (`_detokenized`).
        self._joins_pieces = type(llm.tokenizer_) is LlamaTokenizer
        self._bos = int(llm.token_bos())
        self.tokens: list[int] = []
        self.text = b""
        self.finish_reason = "length"

    def _texts(self) -> Generator[bytes, None, None]:
        """The completion's bytes as they grow (each the whole so far, but while a UTF-8 character
        is incomplete); `text` and `finish_reason` hold the outcome. Stop strings, incomplete
        characters and max_tokens are checked in `Llama._create_completion`'s order."""
        request = self._request
        multibyte_fix = 0
        try:
            for token in request:
                if not self.tokens:
                    self._restored()
                if self._stopped_by_criteria():
                    self.finish_reason = "stop"
                    return
                self.tokens.append(token)
                self.text = text = self._detokenized(self.text)
                for k, char in enumerate(text[-3:]):
                    k = 3 - k
                    for num, pattern in ((2, 192), (3, 224), (4, 240)):
                        if num > k and pattern & char == pattern:
                            multibyte_fix = num - k
                if multibyte_fix > 0:
                    multibyte_fix -= 1
                    continue
                found = [text.index(s) for s in self._stops if s in text]
                if found:
                    self.text = text[: min(found)]
                    self.finish_reason = "stop"
                    yield self.text
                    return
                yield text
                if len(self.tokens) >= self._max_tokens:
                    return
        finally:
            request.cancel()
            self._restored()
            self._finished()
        if request.finish_reason == "stop":
            self.finish_reason = "stop"
        elif request.finish_reason == "error":
            raise SchedulerError(str(request.error))

    def _detokenized(self, before: bytes) -> bytes:
        """The text of all tokens so far, `before` being that of all but the last. llama-cpp-python's
        own tokenizer joins each token's piece, but for a space it takes off the front where the
        first token is BOS: the new token's piece is added to `before` where neither is BOS, so a
        completion's text costs a piece a token rather than all its tokens again each token. Any
        other tokenizer (a Hugging Face one, whose pieces depend on the tokens before) reads all."""
        tokens = self.tokens
        if self._joins_pieces and len(tokens) > 1 and self._bos not in (tokens[0], tokens[-1]):
            return before + self._llm.tokenizer_.detokenize(tokens[-1:], special=self._special)
        # The class's own detokenize: a call on the Llama's own context may shadow the instance's
        # for its special tokens (see `snapcache.llama.hook.special_text`).
        return llama_cpp.Llama.detokenize(self._llm, tokens, prev_tokens=self._prompt, special=self._special)

    def _restored(self) -> None:
        """Tell the listener what the request restored, once: before its first token goes out."""
        restore = self._request.restore
        if self._listener is not None and restore is not None and not self._told:
            self._told = True
            self._listener.restored(self._request.scope, restore)

    def _finished(self) -> None:
        restore = self._request.restore
        if self._listener is not None and restore is not None:
            report = CompletionReport(
                self._request.scope, restore, len(self.tokens), self._request.first_token_seconds
            )
            self._listener.finished(report)

    def _stopped_by_criteria(self) -> bool:
        """Whether the stopping criteria end the completion before its next token. As in
        `Llama.generate`, they see the tokens evaluated so far (the new one is not), and logits
        the Llama never wrote (logits_all=False): zeros."""
        if self._criteria is None:
            return False
        evaluated = np.asarray(self._prompt + self.tokens, dtype=np.intc)
        return bool(self._criteria(evaluated, _zero_logits(int(self._llm.n_vocab()))))

    def whole(self) -> dict[str, Any]:
        for _ in self._texts():
            pass
        result = self._chunk(self.text.decode("utf-8", errors="ignore"), self.finish_reason)
        n_prompt, n_completion = len(self._prompt), len(self.tokens)
        usage: dict[str, Any] = {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_completion,
            "total_tokens": n_prompt + n_completion,
        }
        restore = self._request.restore
        if restore is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": restore.cached_tokens}
        result["usage"] = usage
        return result

    def chunks(self) -> Iterator[dict[str, Any]]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        sent = 0
        texts = self._texts()
        try:
            for text in texts:
                # Hold back what could be the start of a stop string.
                held = max((_overlap(text, s) for s in self._stops), default=0)
                if len(text) - held > sent:
                    piece = decoder.decode(text[sent : len(text) - held])
                    sent = len(text) - held
                    if piece:
                        yield self._chunk(piece, None)
        finally:
            texts.close()  # a reader gone: its request is cancelled, its sequence freed
        rest = decoder.decode(self.text[sent:], final=True)
        if rest:
            yield self._chunk(rest, None)
        yield self._chunk("", self.finish_reason)

    def _chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        }


def _overlap(text: bytes, stop: bytes) -> int:
    """The length of the longest end of `text` that begins `stop`."""
    for i in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:i]):
            return i
    return 0


@functools.lru_cache(maxsize=4)
def _zero_logits(n_vocab: int) -> npt.NDArray[np.single]:
    row = np.zeros(n_vocab, dtype=np.single)
    row.flags.writeable = False
    return row
