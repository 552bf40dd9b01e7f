"""Helpers shared by the CachedLlama tests: chat messages, what a Llama holds, greedy cold runs."""

from __future__ import annotations

from typing import Any

# Settings of the tiny-model tests.
N_CTX = 2048
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 24}
# The tiny model's byte vocabulary makes one token of every byte (a space is the three bytes of "▁").
SYSTEM = "You are a careful desktop assistant. Answer briefly and plainly. " * 6
DOCUMENT = "Document: the quick brown fox jumps over the lazy dog near the river bank. " * 9


def chat(system: str, *turns: str) -> list[dict[str, str]]:
    """A system message, then user and assistant turns in turn."""
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def context_of(llm: Any) -> list[int]:
    """The prompt and every generated token but the last: what greedy decoding fed back."""
    return [int(t) for t in llm.input_ids[: llm.n_tokens]]


def chat_reply(result: dict[str, Any]) -> str:
    return str(result["choices"][0]["message"]["content"])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def cold_chat(make_llama: Any, model_path: Any, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """A greedy chat turn on a fresh tiny-model Llama: the reply and the context it left."""
    llm = make_llama(model_path, n_ctx=N_CTX)
    reply = chat_reply(llm.create_chat_completion(messages=messages, **GREEDY))
    return reply, context_of(llm)
