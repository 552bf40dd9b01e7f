"""Worker: real completions on prompts that share 64-token blocks, saved into one store directory.

Usage:
  block_writer.py loop MODEL DIRECTORY DISK_BYTES SEED JOURNAL
      complete random prompts (each restored from the store, then saved) until killed; prints
      "ready" once the store is open and journals each completion ("put TEXT:LENGTH 0" before,
      "kept TEXT:LENGTH" after: journal.py). An even SEED writes every file on the calling thread
      with no RAM tier, an odd one through a RAM tier and the background writer, flushed (and
      journalled "flushed") after every other completion or so.
  block_writer.py run MODEL DIRECTORY DISK_BYTES SEED THREADS COUNT
      THREADS threads, each with its own Llama, share one store and complete COUNT random prompts
      each; prints one JSON line: per completion the prompt, what it restored, from where, and the
      context it left.
"""

from __future__ import annotations

import random
import sys
import threading
import traceback
from typing import Any

from block_prompts import LENGTHS, N_CTX, SCOPE, TEXTS, complete, dumps, prompt_tokens
from journal import Journal

from snapcache import CachedLlama, SnapshotStore, load_llama


def new_cached(model: str, store: SnapshotStore) -> CachedLlama:
    return CachedLlama(load_llama(model, n_ctx=N_CTX, n_threads=1), store, SCOPE)


def one_completion(cached: CachedLlama, rng: random.Random, journal: Journal | None = None) -> dict[str, Any]:
    text, length = rng.randrange(len(TEXTS)), rng.choice(LENGTHS)
    if journal is not None:
        journal.note("put", f"{text}:{length}", 0)
    cached.llm.reset()  # restore from the store, not from what the context holds
    context = complete(cached, prompt_tokens(cached.llm, text, length))
    info = cached.last_restore
    assert info is not None
    if journal is not None:
        journal.note("kept", f"{text}:{length}")
    return {
        "text": text,
        "length": length,
        "restored": info.restored_tokens,
        "source": info.source,
        "context": context,
    }


def loop(model: str, directory: str, disk_bytes: int, seed: int, journal_path: str) -> None:
    journal = Journal(journal_path)
    write_behind = seed % 2 == 1
    if not write_behind:
        store = SnapshotStore(directory, ram_bytes=0, disk_bytes=disk_bytes, background_writes=False)
    else:
        store = SnapshotStore(directory, ram_bytes=8 << 20, disk_bytes=disk_bytes)
    cached = new_cached(model, store)
    print("ready", flush=True)
    rng = random.Random(seed)
    while True:
        one_completion(cached, rng, journal)
        if write_behind and rng.random() < 0.5:
            store.flush()
            journal.note("flushed")


def run(model: str, directory: str, disk_bytes: int, seed: int, threads: int, count: int) -> None:
    done: list[dict[str, Any]] = []
    errors: list[str] = []
    with SnapshotStore(directory, ram_bytes=4 << 20, disk_bytes=disk_bytes) as store:
        # One Llama per thread, loaded here: loading models on several threads at once is not safe.
        llamas = [new_cached(model, store) for _ in range(threads)]

        def work(cached: CachedLlama, thread_seed: int) -> None:
            rng = random.Random(thread_seed)
            try:
                for _ in range(count):
                    done.append(one_completion(cached, rng))
            except BaseException:
                errors.append(traceback.format_exc())

        workers = [
            threading.Thread(target=work, args=(cached, seed * 100 + i)) for i, cached in enumerate(llamas)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for cached in llamas:
            cached.llm.close()
    print(dumps({"completions": done, "errors": errors}), flush=True)


if __name__ == "__main__":
    command, model, directory, disk_bytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if command == "loop":
        loop(model, directory, disk_bytes, int(sys.argv[5]), sys.argv[6])
    else:
        run(model, directory, disk_bytes, int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
