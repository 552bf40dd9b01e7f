"""Several requests at once on one Llama: one context of N sequences, batched steps, per-sequence cache.

`Scheduler(llm, store, n_seq=4)` runs requests (prompt tokens and `SamplingParams`) side by side,
each restoring its longest cached prefix into its own sequence and saving its states under the
Llama's own fingerprint; `BatchedLlama` puts `create_completion` and `create_chat_completion` on
top, rendered by the Llama's own chat handler. See `_scheduler` for the steps and the two modes.
"""

from __future__ import annotations

from snapcache.llama.batch._completion import BatchedLlama
from snapcache.llama.batch._request import FinishReason, Request, SchedulerError
from snapcache.llama.batch._sampling import LazyGrammar, SamplingParams, batched_unsupported
from snapcache.llama.batch._scheduler import Mode, Scheduler, unbatched_reason

__all__ = [
    "BatchedLlama",
    "FinishReason",
    "LazyGrammar",
    "Mode",
    "Request",
    "SamplingParams",
    "Scheduler",
    "SchedulerError",
    "batched_unsupported",
    "unbatched_reason",
]
