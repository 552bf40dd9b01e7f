"""Sampling parameters of one request, and the llama.cpp sampler chain built from them.

The chain is the one `llama_cpp.Llama` builds for a completion (`Llama._init_sampler`): a logit bias
first (llama-cpp-python applies it as a logits processor before its chain), repetition penalties
over the last `last_n_tokens_size` generated tokens, then greedy at temperature 0, a plain draw
below 0, and otherwise top-k, typical, top-p, min-p, temperature and a seeded draw. Same logits,
same parameters, same seed: same tokens. What the chain cannot do (grammars, mirostat, logits
processors, log-probabilities) is named by `batched_unsupported` so that the caller can take the
single-sequence path for that request. Stopping criteria are checked on the tokens, as the Llama
does (see `BatchedLlama`).
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from snapcache.errors import InvalidArgument

__all__ = ["SamplerChain", "SamplingParams", "batched_unsupported"]

# create_completion's keywords that the batched path cannot honour.
_UNSUPPORTED = ("grammar", "logits_processor", "logprobs", "suffix")


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
        return cls(**values)


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
        """The next token from the logits of batch row `row` (the chain accepts it, for penalties)."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, ctypes.c_int32(row)))

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
