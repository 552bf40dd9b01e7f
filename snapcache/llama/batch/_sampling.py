"""Sampling parameters of one request, and the llama.cpp sampler chain built from them.

The chain is the one `llama_cpp.Llama` builds for a completion (`Llama._init_sampler`): a logit bias
first (llama-cpp-python applies it as a logits processor before its chain), repetition penalties
over the last `last_n_tokens_size` generated tokens, then greedy at temperature 0, a plain draw
below 0, and otherwise top-k, typical, top-p, min-p, temperature and a seeded draw. Same logits,
same parameters, same seed: same tokens. A grammar (a tool call's JSON schema, `response_format`)
is checked as llama.cpp's own sampler checks it: the chain picks a token from the whole vocabulary,
the grammar judges that one token, and only when it refuses it are all 262K (Gemma) candidates
constrained and the pick made again, so a grammar request costs a batch step little more than any
other (greedy picks what a fully constrained chain picks; a draw is rejection-sampled, as in
llama.cpp). A `LazyGrammar` (llama.cpp's lazy grammar) holds the answer only from a trigger token
on: until the model samples one, every token is allowed. What the chain cannot do (mirostat, logits
processors, log-probabilities) is named by `batched_unsupported` so that the caller can take the
single-sequence path for that request (which answers a lazy grammar's request free).
Stopping criteria are checked on the tokens, as the Llama does (see `BatchedLlama`).
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from snapcache.errors import InvalidArgument

__all__ = ["LazyGrammar", "SamplerChain", "SamplingParams", "batched_unsupported", "first_highest"]

# create_completion's keywords that the batched path cannot honour.
_UNSUPPORTED = ("logits_processor", "logprobs", "suffix")
# llama_token_data as numpy sees it: the candidates of a constrained pick are filled in one copy.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@dataclass(frozen=True, slots=True)
class LazyGrammar:
    """A grammar that applies from a trigger token on: the model writes freely until it samples one
    of `trigger_tokens`, then follows `gbnf`, which starts with that token (a tool call's marker,
    under `tool_choice: auto`). Pass it as `grammar`; only the batched path takes one."""

    gbnf: str
    trigger_tokens: tuple[int, ...]
    root: str = "root"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples and when it stops, with `Llama.create_completion`'s defaults.

    `max_tokens` None or <= 0 means up to the context's end. `seed` None draws one per request.
    Stop strings are checked on the text (see `snapcache.llama.batch.BatchedLlama`), not here.
    """

    max_tokens: int | None = 16
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    grammar: str | None = None  # GBNF text (llama-cpp-python's `LlamaGrammar` gives it)
    grammar_root: str = "root"
    grammar_triggers: tuple[int, ...] = ()  # a lazy grammar's: it applies from one of these on

    @classmethod
    def from_completion_kwargs(cls, kwargs: Mapping[str, Any]) -> SamplingParams:
        """From `create_completion` keywords (`max_completion_tokens` stands for `max_tokens`)."""
        names = set(cls.__dataclass_fields__)
        values = {k: v for k, v in kwargs.items() if k in names and v is not None}
        if kwargs.get("max_tokens") is None and kwargs.get("max_completion_tokens") is not None:
            values["max_tokens"] = kwargs["max_completion_tokens"]
        elif "max_tokens" in kwargs and kwargs["max_tokens"] is None:
            values["max_tokens"] = None
        if "logit_bias" in values:
            try:
                values["logit_bias"] = {int(k): float(v) for k, v in dict(values["logit_bias"]).items()}
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"logit_bias maps token ids to numbers: {exc}") from None
        grammar = kwargs.get("grammar")
        if isinstance(grammar, LazyGrammar):
            values["grammar"], values["grammar_root"] = grammar.gbnf, grammar.root
            values["grammar_triggers"] = tuple(grammar.trigger_tokens)
        elif grammar is not None and not isinstance(grammar, str):
            values["grammar"] = str(grammar._grammar)  # a LlamaGrammar
            values["grammar_root"] = str(getattr(grammar, "_root", "root"))
        return cls(**values)


def first_highest(logits: npt.NDArray[np.float32]) -> int | None:
    """The token of the first highest logit, as llama.cpp's greedy sampler picks it; None where a
    logit is NaN (the sampler's pick then depends on where the NaN lies: the chain decides)."""
    token = int(np.argmax(logits))
    return None if np.isnan(logits[token]) else token


def _grammar_sampler(llm: llama_cpp.Llama, params: SamplingParams) -> Any:
    """llama.cpp's grammar sampler of `params` (lazy where it has triggers); NULL where it refuses it."""
    assert params.grammar is not None
    vocab, gbnf, root = llm._model.vocab, params.grammar.encode("utf-8"), params.grammar_root.encode("utf-8")
    if not params.grammar_triggers:
        return llama_cpp.llama_sampler_init_grammar(vocab, gbnf, root)
    triggers = (llama_cpp.llama_token * len(params.grammar_triggers))(*params.grammar_triggers)
    no_patterns = (ctypes.c_char_p * 1)()
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        vocab, gbnf, root, no_patterns, 0, triggers, len(params.grammar_triggers)
    )


def batched_unsupported(kwargs: Mapping[str, Any]) -> str | None:
    """Why a `create_completion` call with these keywords must take the single-sequence path, or None."""
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            return f"{name} is not supported by the batched path"
    if kwargs.get("echo"):
        return "echo is not supported by the batched path"
    if int(kwargs.get("mirostat_mode") or 0) != 0:
        return "mirostat is not supported by the batched path"
    return None


class SamplerChain:
    """One request's llama.cpp sampler chain; `close` frees it (the chain frees its samplers)."""

    def __init__(self, params: SamplingParams, llm: llama_cpp.Llama) -> None:
        n_vocab = int(llm.n_vocab())
        self._n_vocab = n_vocab
        # Greedy with nothing that changes the logits (no bias, penalties off as llama.cpp's penalty
        # sampler turns itself off, no grammar): the chain's pick is the first highest logit, which
        # `_first_highest` finds without filling llama.cpp's 262K candidates (1 ms a token on Gemma).
        self._argmax = (
            params.temperature == 0.0
            and params.grammar is None
            and not params.logit_bias
            and (
                int(llm.last_n_tokens_size) == 0
                or (
                    params.repeat_penalty == 1.0
                    and params.frequency_penalty == 0.0
                    and params.presence_penalty == 0.0
                )
            )
        )
        self._grammar = None
        if params.grammar is not None:
            self._grammar = _grammar_sampler(llm, params)
            if not self._grammar:
                raise InvalidArgument("llama.cpp cannot use this grammar")
            self._candidates = (llama_cpp.llama_token_data * n_vocab)()
            self._rows = np.frombuffer(memoryview(self._candidates).cast("B"), dtype=_TOKEN_DATA)
            self._ids = np.arange(n_vocab, dtype=np.int32)
            self._one = (llama_cpp.llama_token_data * 1)()
        self.seed = params.seed if params.seed is not None else random.randint(0, 2**32 - 1)
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        if not self._chain:
            raise InvalidArgument("llama.cpp could not make a sampler chain")
        add = self._add
        if params.logit_bias:
            bias = [(k, v) for k, v in params.logit_bias.items() if 0 <= k < n_vocab]
            array = (llama_cpp.llama_logit_bias * len(bias))()
            for i, (token, value) in enumerate(bias):
                array[i] = llama_cpp.llama_logit_bias(token, value)
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), array))
        add(
            llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                int(llm.last_n_tokens_size),
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
        )
        if params.temperature < 0.0:
            add(llama_cpp.llama_sampler_init_dist(self.seed))
        elif params.temperature == 0.0:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
            add(llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            add(llama_cpp.llama_sampler_init_dist(self.seed))

    def _add(self, sampler: Any) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, ctx: llama_cpp.llama_context_p, row: int) -> int:
        """The next token from the logits of batch row `row` (the chain, and the grammar if any,
        accept it: penalties and the grammar's state follow the tokens)."""
        if self._argmax:
            token = self._first_highest(ctx, row)
            if token is not None:
                return token
        if self._grammar is None:
            return int(llama_cpp.llama_sampler_sample(self._chain, ctx, ctypes.c_int32(row)))
        logits = llama_cpp.llama_get_logits_ith(ctx, ctypes.c_int32(row))
        token = self._pick(logits, constrained=False)
        if not self._allowed(token):
            token = self._pick(logits, constrained=True)
        if not self._allowed(token):
            # Logits the chain made NaN (a repeat_penalty of 0 times the grammar's -inf) let it pick
            # a token the grammar refuses, and llama.cpp aborts the process on accepting one.
            token = self._best_allowed(logits)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _first_highest(self, ctx: llama_cpp.llama_context_p, row: int) -> int | None:
        """`first_highest` of batch row `row`'s logits (None where llama.cpp has none)."""
        pointer = llama_cpp.llama_get_logits_ith(ctx, ctypes.c_int32(row))
        if not pointer:
            return None
        return first_highest(np.ctypeslib.as_array(pointer, shape=(self._n_vocab,)))

    def _pick(self, logits: Any, *, constrained: bool) -> int:
        """The chain's pick among all candidates (`constrained`: those the grammar allows)."""
        rows = self._rows
        rows["id"] = self._ids
        rows["logit"] = np.ctypeslib.as_array(logits, shape=(len(self._ids),))
        rows["p"] = 0.0
        candidates = llama_cpp.llama_token_data_array(self._candidates, len(rows), -1, False)
        if constrained:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        if not 0 <= candidates.selected < candidates.size:
            raise InvalidArgument("the grammar allows no token here")
        return int(candidates.data[candidates.selected].id)

    def _best_allowed(self, logits: Any) -> int:
        """The token of the highest logit among those the grammar allows."""
        rows = self._rows
        rows["id"] = self._ids
        rows["logit"] = np.ctypeslib.as_array(logits, shape=(len(self._ids),))
        candidates = llama_cpp.llama_token_data_array(self._candidates, len(rows), -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        kept = rows[: candidates.size]
        finite = np.isfinite(kept["logit"])
        if not finite.any():
            raise InvalidArgument("the grammar allows no token here")
        return int(kept["id"][finite][np.argmax(kept["logit"][finite])])

    def _allowed(self, token: int) -> bool:
        one = self._one
        one[0] = llama_cpp.llama_token_data(token, 1.0, 0.0)
        single = llama_cpp.llama_token_data_array(one, 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(single))
        return bool(np.isfinite(one[0].logit))

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
