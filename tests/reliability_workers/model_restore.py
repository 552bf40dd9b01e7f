"""Worker: a real llama.cpp process that saves a prompt's state, or restores it from (damaged) stores.

Usage:
  model_restore.py prepare MODEL DIRECTORY SECRET
      evaluate the system prompt and two longer prefixes of the full prompt, and store their states
  model_restore.py answer MODEL SECRET DIRECTORY...
      answer the full prompt greedily once cold, then once per directory after restoring whatever
      the store there serves; prints one JSON line: the cold tokens and, per directory, how many
      tokens the store served and how many of them llama.cpp restored, and the answer
SECRET is "-" for none. Restores go through the store's lookup and snapcache.llama.restore_sequence,
so only snapshots that passed the store's checks ever reach llama.cpp.
"""

from __future__ import annotations

import json
import sys

from llama_cpp import Llama

from snapcache import SnapcacheError, SnapshotKey, SnapshotStore, model_fingerprint
from snapcache.llama import capture_sequence, restore_sequence

SCOPE = "reliability-model"
SYSTEM = "You are a careful assistant. Answer briefly and exactly. " * 3
QUESTION = "Question: what is seven times six? Answer:"
N_PREDICT = 24
# Prefix lengths stored by `prepare`, as fractions of the system prompt's tokens.
PREFIX_FRACTIONS = (0.5, 1.0)


def new_llama(model: str) -> Llama:
    return Llama(model_path=model, n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False, seed=0)


def greedy(llm: Llama, prompt: list[int]) -> list[int]:
    out: list[int] = []
    for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(token))
        if len(out) == N_PREDICT or token == llm.token_eos():
            break
    return out


def prepare(model: str, directory: str, secret: bytes | None) -> None:
    llm = new_llama(model)
    fp = model_fingerprint(llm)
    # Prefixes of the full prompt's tokens (the system text alone may tokenize differently at its end).
    system_length = len(llm.tokenize(SYSTEM.encode()))
    prompt = llm.tokenize((SYSTEM + QUESTION).encode())
    lengths = [max(1, int(system_length * fraction)) - 1 for fraction in PREFIX_FRACTIONS]
    with SnapshotStore(directory, ram_bytes=0, disk_bytes=64 << 20, secret=secret) as store:
        for n in lengths:
            llm.reset()
            llm.eval(prompt[:n])
            captured = capture_sequence(llm)
            key = SnapshotKey.for_tokens(fp, SCOPE, captured.tokens)
            store.put(key, captured.tokens, captured.state, logits=captured.logits)
    print(json.dumps({"fingerprint": fp, "lengths": lengths}))


def answer(model: str, secret: bytes | None, directories: list[str]) -> None:
    llm = new_llama(model)
    fp = model_fingerprint(llm)
    prompt = llm.tokenize((SYSTEM + QUESTION).encode())
    llm.reset()
    cold = greedy(llm, prompt)
    results = []
    for directory in directories:
        llm.reset()
        served = restored = 0
        error = None
        try:
            store = SnapshotStore(directory, ram_bytes=0, disk_bytes=64 << 20, secret=secret)
        except SnapcacheError as exc:  # e.g. an unreadable index: answer without the cache
            store = None
            error = f"{type(exc).__name__}: {exc}"
        if store is not None:
            with store:
                snap = store.lookup(fp, SCOPE, prompt)
                served = 0 if snap is None else len(snap.tokens)
                if snap is not None and restore_sequence(llm, snap, prompt):
                    restored = len(snap.tokens)
        tokens = greedy(llm, prompt)
        results.append(
            {"directory": directory, "served": served, "restored": restored, "tokens": tokens, "error": error}
        )
    print(json.dumps({"cold": cold, "prompt_tokens": len(prompt), "results": results}))


if __name__ == "__main__":
    command, model = sys.argv[1], sys.argv[2]
    if command == "prepare":
        prepare(model, sys.argv[3], None if sys.argv[4] == "-" else sys.argv[4].encode())
    else:
        answer(model, None if sys.argv[3] == "-" else sys.argv[3].encode(), sys.argv[4:])
