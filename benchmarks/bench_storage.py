"""What the store keeps: bytes for a chat and for agents, 8B-sized states, budgets, first-request cost.

    python benchmarks/bench_storage.py [--quick] [--json PATH]

Everything goes through the public API (SnapshotStore, CachedLlama, load_llama), so the same script
measures any store behind it.

- chat: a 10-turn chat through CachedLlama (greedy, 16-token replies, a system prompt of 600+
  tokens, user messages of about 100 tokens) on Gemma-3-270M and on the tiny test llama: the bytes
  of the files under the store's directory after close, and the RAM the store reported before it,
  beside ONE snapshot of the final context (warmed into a fresh store) and their ratio.
- agents: 3 agents whose system prompts share nothing, 2 rounds of raw completions each (a new
  question appended every round): the bytes stored, beside one snapshot per agent's last prompt.
- 8B geometry: a random llama with an 8B model's KV (32 layers x 8 K/V heads x 128 values, f16):
  state bytes per token, a 1,024-token prompt's state, capture and restore (from RAM, and from disk
  through a newly opened store as after a restart), and a stream of distinct prompts through a store
  with small RAM and disk budgets, whose use must stay within them.
- first request: time to first token of a cold 1,500-token raw prompt through CachedLlama (empty
  store, saving on) against a plain Llama, alternating, on Gemma-3-270M.

--quick runs the tiny llama only, with small sizes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import numpy as np
from _common import (
    ModelChoice,
    Table,
    choose_model,
    directory_bytes,
    first_token_seconds,
    fmt_bytes,
    fmt_seconds,
    geometry_model,
    make_parser,
    new_llama,
    prompt_paragraphs,
    report,
    text_of_tokens,
    tiny_model,
)

from snapcache import CachedLlama, RestoreInfo, SnapshotStore, attach, detach

REPLY_TOKENS = 16
BIG_RAM = 4 << 30  # stores whose bytes are counted: nothing may be evicted
BIG_DISK = 16 << 30
QUESTIONS = [
    "Which of these points matters most this week, and why?",
    "Summarise the rules above in three short bullet points.",
]


@dataclass(frozen=True)
class Sizes:
    turns: int
    system_tokens: int
    user_tokens: int
    agent_tokens: int
    geometry_layers: int
    geometry_prompts: tuple[int, ...]  # the first is read; the others filled from its rows
    stream_prompt: int
    ram_budget: int
    disk_budget: int
    first_request_tokens: int
    first_request_reps: int


FULL = Sizes(10, 620, 100, 1_200, 32, (1_024, 8_192), 512, 256 << 20, 512 << 20, 1_500, 3)
QUICK = Sizes(3, 200, 40, 200, 4, (128, 256), 64, 2 << 20, 4 << 20, 300, 1)


def _store(
    directory: Path | None, ram: int = BIG_RAM, disk: int = BIG_DISK, compression: str | None = None
) -> SnapshotStore:
    return SnapshotStore(
        directory,
        ram_bytes=ram,
        disk_bytes=disk if directory is not None else None,
        compression=compression,  # type: ignore[arg-type]
    )


def _one_snapshot_bytes(model: ModelChoice, n_ctx: int, tokens: list[int], workdir: Path) -> tuple[int, int]:
    """Disk and RAM bytes of a fresh store holding the state of exactly `tokens` (warmed, one snapshot)."""
    llm = new_llama(model.path, n_ctx)
    directory = workdir / "one-snapshot"
    store = _store(directory)
    try:
        CachedLlama(llm, store).warm(tokens)
        store.flush()
        ram = store.stats().ram_used_bytes
    finally:
        store.close()
        llm.close()
    disk = directory_bytes(directory)
    return disk, ram


def _ratio(stored: int, reference: int) -> str:
    return f"{stored / reference:.2f}x" if reference else "-"


# -- a: a chat, and agents ----------------------------------------------------------------------------


def chat_bytes(model: ModelChoice, sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """A `sizes.turns`-turn chat through CachedLlama; what the store holds against one snapshot."""
    n_ctx = 8192
    llm = new_llama(model.path, n_ctx)
    pieces = prompt_paragraphs()
    system = text_of_tokens(llm, pieces, sizes.system_tokens)
    sentences = [s.strip() + "." for p in pieces[::-1] for s in p.split(". ") if len(s.strip()) > 20]
    directory = workdir / "chat"
    store = _store(directory)
    cached = CachedLlama(llm, store, scope="chat")
    messages: list[Mapping[str, Any]] = [{"role": "system", "content": system}]
    started = time.perf_counter()
    try:
        for turn in range(sizes.turns):
            user = text_of_tokens(llm, sentences, sizes.user_tokens, start=turn * 7, sep=" ")
            messages.append({"role": "user", "content": user})
            reply = cached.create_chat_completion(messages, max_tokens=REPLY_TOKENS, temperature=0.0)
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""})
        final_context = [int(t) for t in llm.input_ids[: llm.n_tokens]]
        store.flush()
        stats = store.stats()
    finally:
        store.close()
        llm.close()
    chat_s = time.perf_counter() - started
    disk = directory_bytes(directory)
    one_disk, one_ram = _one_snapshot_bytes(model, n_ctx, final_context, workdir)
    return {
        "model": model.name,
        "turns": sizes.turns,
        "context_tokens": len(final_context),
        "entries": stats.ram_entries,
        "disk_entries": stats.disk_entries,
        "evictions": stats.evictions,
        "ram_bytes": stats.ram_used_bytes,
        "disk_bytes": disk,
        "one_snapshot_ram_bytes": one_ram,
        "one_snapshot_disk_bytes": one_disk,
        "seconds": chat_s,
    }


def agent_bytes(model: ModelChoice, sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """3 agents x 2 rounds of raw completions (scope per agent); what the store holds."""
    n_ctx = 8192
    llm = new_llama(model.path, n_ctx)
    paragraphs = {
        path.stem: [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        for path in sorted((_common.BENCH_DIR / "prompts").glob("*.txt"))
    }
    systems = {name: text_of_tokens(llm, text, sizes.agent_tokens) for name, text in paragraphs.items()}
    directory = workdir / "agents"
    store = _store(directory)
    last_prompts: list[list[int]] = []
    try:
        for question in QUESTIONS:
            for name, system in systems.items():
                prompt = f"{system}\n\nQuestion: {question}\nAnswer:"
                CachedLlama(llm, store, scope=name).create_completion(prompt, max_tokens=8, temperature=0.0)
                if question is QUESTIONS[-1]:
                    last_prompts.append(llm.tokenize(prompt.encode("utf-8")))
        store.flush()
        stats = store.stats()
    finally:
        store.close()
        llm.close()
    disk = directory_bytes(directory)
    one_disk = one_ram = 0
    for i, tokens in enumerate(last_prompts):
        d, r = _one_snapshot_bytes(model, n_ctx, tokens, workdir / f"agent-{i}")
        one_disk += d
        one_ram += r
    return {
        "model": model.name,
        "prompt_tokens": [len(t) for t in last_prompts],
        "entries": stats.ram_entries,
        "disk_entries": stats.disk_entries,
        "evictions": stats.evictions,
        "ram_bytes": stats.ram_used_bytes,
        "disk_bytes": disk,
        "one_snapshot_ram_bytes": one_ram,
        "one_snapshot_disk_bytes": one_disk,
    }


# -- b: states of an 8B model's size ------------------------------------------------------------------


def _distinct_prompt(i: int, n_tokens: int) -> list[int]:
    """A byte-vocabulary prompt of `n_tokens` tokens that differs from every other i's at token 1."""
    text = f"{i:04d} " + " ".join(f"word{(i * 7919 + k * 104729) % 100003}" for k in range(n_tokens))
    return [1] + [3 + b for b in text.encode("ascii")[: n_tokens - 1]]  # <s>, then byte tokens


class _RestoreTimer:
    """A completion listener: the seconds from `started` until the hook has put the prefix in place."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0
        self.info: RestoreInfo | None = None

    def restored(self, scope: str, info: RestoreInfo) -> None:
        self.seconds = time.perf_counter() - self.started
        self.info = info

    def finished(self, report: Any) -> None:
        pass


def _median_time(fn: Any, reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def geometry(sizes: Sizes, workdir: Path, reps: int, budgets: bool = True) -> dict[str, Any]:
    """Each of `sizes.geometry_prompts` through one reader and one restorer Llama (large enough for
    the longest), then the budget stream."""
    model = geometry_model(workdir, sizes.geometry_layers)
    n_ctx = max(256, max(sizes.geometry_prompts) + 512)  # room for the request after the prefix
    reader, restorer = new_llama(model.path, n_ctx), new_llama(model.path, n_ctx)
    result: dict[str, Any] = {"model": model.name, "sizes": []}
    try:
        # Untimed: the model's first reads, and the split alignment snapcache measures once per model.
        probe_store = SnapshotStore(None, ram_bytes=BIG_RAM)
        t0 = time.perf_counter()
        CachedLlama(reader, probe_store).create_completion(_distinct_prompt(3, 80), max_tokens=1)
        result["first_cached_call_s"] = time.perf_counter() - t0
        probe_store.close()
        restorer.create_completion(_distinct_prompt(3, 80), max_tokens=1)
        first: bytes | None = None
        for n in sizes.geometry_prompts:
            print(f"           8B geometry, {n:,} tokens", file=sys.stderr, flush=True)
            run, blob = geometry_size(reader, restorer, n, first, workdir / f"geometry-{n}", reps)
            first = blob if first is None else first
            result["sizes"].append(run)
    finally:
        reader.close()
        restorer.close()
    result["budgets"] = budget_stream(model, sizes, workdir) if budgets else None
    return result


def _fill_context(llm: Any, first: bytes, prompt: list[int]) -> None:
    """Put the state of `prompt` into `llm` without reading it: the rows of `first` (a captured
    prompt's state, whole blocks of it) repeated along it, as if the prompt had been read.

    Storage moves these bytes whatever they hold; reading an 8,192-token prompt on this model would
    take minutes of 2 cores (its attention alone). Greedy output after it means nothing."""
    from snapcache import Snapshot, SnapshotKey
    from snapcache.llama import restore_sequence
    from snapcache.llama.hook.prefix_loader import _CONTEXT_PROMPT_ATTRIBUTE
    from snapcache.llama.state.assembly import assemble
    from snapcache.llama.state.blocks import split_state

    split = split_state(first)
    assert split is not None
    have = split.n_cells // 64
    blob = assemble([split.block(i % have) for i in range(len(prompt) // 64)], None)
    key = SnapshotKey.for_tokens("f" * 64, "default", prompt)
    llm.reset()
    tokens = np.asarray(prompt, dtype=np.int32)
    if not restore_sequence(llm, Snapshot(key, tokens, blob), prompt):
        raise SystemExit(f"could not put a {len(prompt)}-token state into the reader")
    setattr(llm, _CONTEXT_PROMPT_ATTRIBUTE, len(prompt))  # read as a prompt: warm captures it as it is


def geometry_size(
    reader: Any, restorer: Any, n: int, first: bytes | None, directory: Path, reps: int
) -> tuple[dict[str, Any], bytes]:
    """One `n`-token prompt's state: capture, put, restore from RAM and from disk, and the floors.

    `first`: a smaller size's captured state, whose rows fill this one's context (see
    `_fill_context`); None: the prompt is read."""
    import llama_cpp

    prompt = _distinct_prompt(0, n)
    tail = _distinct_prompt(1, 17)[1:]  # 16 more tokens: the request that follows the restored prefix
    result: dict[str, Any] = {"prompt_tokens": n, "filled": first is not None}
    if first is not None:
        _fill_context(reader, first, prompt)
    store = _store(directory)
    warmed = CachedLlama(reader, store).warm(prompt)
    store.flush()  # the disk write ends before anything is timed
    result["warm_s"] = warmed.seconds
    result["state_bytes"] = warmed.state_bytes

    size_n = llama_cpp.llama_state_seq_get_size(reader.ctx, 0)
    buffer = (ctypes.c_uint8 * size_n)()
    result["llama_capture_s"] = _median_time(
        lambda: llama_cpp.llama_state_seq_get_data(reader.ctx, buffer, size_n, 0), reps
    )
    blob = bytes(buffer)

    put_s, settled_s = [], []
    for _ in range(reps):
        # The prompt is in the reader's context already: warm captures it and puts it, nothing else.
        # Timed: the request's part; then, apart, until the store has stored it (off the request).
        ram_only = SnapshotStore(None, ram_bytes=BIG_RAM)
        try:
            t0 = time.perf_counter()
            found = CachedLlama(reader, ram_only).warm(prompt)
            put_s.append(time.perf_counter() - t0)
            ram_only.flush()
            settled_s.append(time.perf_counter() - t0)
            assert not found.from_cache
        finally:
            ram_only.close()
    _note(n, "capture and put")
    result["capture_put_s"] = statistics.median(put_s)
    result["capture_put_settled_s"] = statistics.median(settled_s)

    def restore(target: SnapshotStore, expected: str) -> tuple[float, float]:
        """(seconds until the prefix is in the context, seconds of the whole request)."""
        restorer.reset()
        timer = _RestoreTimer()
        attach(restorer, target, save=False, listener=timer)
        try:
            timer.started = time.perf_counter()
            restorer.create_completion(prompt + tail, max_tokens=1, temperature=0.0)
            request = time.perf_counter() - timer.started
        finally:
            detach(restorer)
        info = timer.info
        if info is None or info.source != expected or info.restored_tokens != n:
            raise SystemExit(f"expected a {expected} restore of {n} tokens, got {info}")
        return timer.seconds, request

    # Untimed: the process's first restore also pays for its decoding threads and the first
    # mapping of a blob this size; every restore from disk below comes after it.
    restore(store, "ram")
    from_ram = [restore(store, "ram") for _ in range(reps)]
    _note(n, "restores from RAM")
    result["restore_ram_s"] = statistics.median(r for r, _ in from_ram)
    result["request_ram_s"] = statistics.median(q for _, q in from_ram)
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(restorer.ctx), 0, -1, -1)
    result["llama_restore_s"] = _median_time(
        lambda: llama_cpp.llama_state_seq_set_data(restorer.ctx, buffer, size_n, 0), reps
    )
    restorer.reset()
    store.close()

    from_disk, opens = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        reopened = _store(directory)
        opens.append(time.perf_counter() - t0)
        try:
            from_disk.append(restore(reopened, "disk"))
        finally:
            reopened.close()
    _note(n, "restores from disk")
    result["restore_disk_s"] = statistics.median(r for r, _ in from_disk)
    result["request_disk_s"] = statistics.median(q for _, q in from_disk)
    result["open_s"] = statistics.median(opens)
    result["disk_bytes"] = directory_bytes(directory)
    result["compression"] = store.compression
    # The same state written compressed (--compression zstd: what every state was before "auto").
    zstd_directory = directory.parent / f"{directory.name}-zstd"
    with _store(zstd_directory, compression="zstd") as zstd_store:
        CachedLlama(reader, zstd_store).warm(prompt)
    zstd_restores = []
    for _ in range(reps):
        with _store(zstd_directory, compression="zstd") as reopened:
            zstd_restores.append(restore(reopened, "disk")[0])
    _note(n, "restores from compressed files")
    result["restore_disk_zstd_s"] = statistics.median(zstd_restores)
    result["disk_bytes_zstd"] = directory_bytes(zstd_directory)
    result["read_file_s"] = _read_file_seconds(directory.parent / f"one-file-{n}", blob, reps)
    result["copy_s"] = _copy_seconds(blob, reps)
    restorer.reset()
    return result, blob


def _note(n: int, done: str) -> None:
    print(f"           {time.strftime('%H:%M:%S')} {n:,} tokens: {done}", file=sys.stderr, flush=True)


def _copy_seconds(blob: bytes, reps: int) -> float:
    """Median seconds to copy `blob` once into a buffer already touched (as the Llama's capture
    buffer is): the one copy a restore from RAM makes, and this machine's memory speed."""
    source = np.frombuffer(blob, dtype=np.uint8)
    target = np.zeros_like(source)
    return _median_time(lambda: np.copyto(target, source), reps)


def _read_file_seconds(path: Path, blob: bytes, reps: int) -> float:
    """Median seconds to read a file of `blob`'s size, just written (so the page cache holds it, as
    it holds the store's files), into one new buffer: the disk part of a restore's floor."""
    path.write_bytes(blob)

    def read() -> None:
        out = np.empty(len(blob), dtype=np.uint8)
        with path.open("rb", buffering=0) as file:
            view = memoryview(out)
            done = 0
            while done < len(blob):
                got = file.readinto(view[done:])
                if not got:
                    raise SystemExit(f"{path} is shorter than it was written")
                done += got

    try:
        return _median_time(read, reps)
    finally:
        path.unlink()


def budget_stream(model: ModelChoice, sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """Distinct prompts warmed one after another into a store with small budgets; the most it used."""
    n = sizes.stream_prompt
    state_bytes = n * sizes.geometry_layers * (4 << 10)  # f16 K and V, 8 heads x 128 a layer
    count = -(-3 * sizes.disk_budget // (2 * state_bytes))  # half as much again as the disk holds
    llm = new_llama(model.path, n + 64)
    directory = workdir / "budgets"
    store = _store(directory, sizes.ram_budget, sizes.disk_budget)
    most_ram = most_disk = most_files = most_pending = 0
    started = time.perf_counter()
    try:
        for i in range(count):
            CachedLlama(llm, store).warm(_distinct_prompt(100 + i, n))
            stats = store.stats()
            most_ram = max(most_ram, stats.ram_used_bytes)
            most_disk = max(most_disk, stats.disk_used_bytes)
            most_pending = max(most_pending, stats.pending_write_bytes)
            most_files = max(most_files, directory_bytes(directory))
        store.flush()
        stats = store.stats()
    finally:
        store.close()
        llm.close()
    files = directory_bytes(directory)
    return {
        "prompts": count,
        "prompt_tokens": n,
        "offered_bytes": count * state_bytes,
        "ram_budget": sizes.ram_budget,
        "disk_budget": sizes.disk_budget,
        "most_ram": most_ram,
        "most_pending": most_pending,
        "most_disk": most_disk,
        "most_files": max(most_files, files),
        "files_after_close": files,
        "ram_entries": stats.ram_entries,
        "disk_entries": stats.disk_entries,
        "ram_evictions": stats.ram_evictions,
        "disk_evictions": stats.disk_evictions,
        "seconds": time.perf_counter() - started,
    }


# -- c: the first request -----------------------------------------------------------------------------


def first_request(model: ModelChoice, sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """TTFT of one cold raw prompt: plain Llama and CachedLlama over an empty store, alternating."""
    llm = new_llama(model.path, sizes.first_request_tokens + 1024)
    prompt = text_of_tokens(llm, prompt_paragraphs(), sizes.first_request_tokens) + "\n\nAnswer:"
    n_tokens = len(llm.tokenize(prompt.encode("utf-8")))
    plain: list[float] = []
    cached: list[float] = []
    checkpoints = 0
    try:
        # Untimed: the Llama's first read, and the split alignment snapcache measures once per model.
        llm.create_completion("Warm up.", max_tokens=1)
        probe_store = SnapshotStore(None, ram_bytes=BIG_RAM)
        t0 = time.perf_counter()
        CachedLlama(llm, probe_store).create_completion("Warm up.", max_tokens=1)
        probe_s = time.perf_counter() - t0
        probe_store.close()
        for rep in range(2 * sizes.first_request_reps):
            llm.reset()
            if (rep % 2 == 0) == (rep // 2 % 2 == 0):  # plain, cached, cached, plain, plain, cached ...
                stream = llm.create_completion(prompt, max_tokens=4, temperature=0.0, stream=True)
                plain.append(first_token_seconds(stream)[0])
                continue
            store = _store(workdir / f"first-{rep}")
            try:
                wrapped = CachedLlama(llm, store)
                stream = wrapped.create_completion(prompt, max_tokens=4, temperature=0.0, stream=True)
                cached.append(first_token_seconds(stream)[0])
                info = wrapped.last_restore
                checkpoints = 0 if info is None else info.checkpoints
            finally:
                store.close()  # its disk writes end before the next run starts
    finally:
        llm.close()
    return {
        "model": model.name,
        "prompt_tokens": n_tokens,
        "plain_s": plain,
        "cached_s": cached,
        "checkpoints": checkpoints,
        "first_cached_call_s": probe_s,
    }


# -- tables -------------------------------------------------------------------------------------------


def _chat_table(chats: list[dict[str, Any]], sizes: Sizes) -> Table:
    chat = Table(
        f"Bytes stored by a {sizes.turns}-turn chat through CachedLlama (greedy, "
        f"{REPLY_TOKENS}-token replies) against one snapshot of its final context",
        [
            "model",
            "context tokens",
            "snapshots",
            "disk files",
            "RAM",
            "one snapshot: disk",
            "RAM",
            "ratio disk",
            "ratio RAM",
        ],
    )
    for row in chats:
        chat.add(
            row["model"],
            row["context_tokens"],
            row["disk_entries"],
            fmt_bytes(row["disk_bytes"]),
            fmt_bytes(row["ram_bytes"]),
            fmt_bytes(row["one_snapshot_disk_bytes"]),
            fmt_bytes(row["one_snapshot_ram_bytes"]),
            _ratio(row["disk_bytes"], row["one_snapshot_disk_bytes"]),
            _ratio(row["ram_bytes"], row["one_snapshot_ram_bytes"]),
        )
    chat.notes.append(
        f"system prompt >= {sizes.system_tokens} tokens, user messages >= {sizes.user_tokens} tokens; disk: "
        "every file under the store directory after close; RAM: the store's stats before close"
    )
    chat.notes.append("one snapshot: the final context (prompt and reply) warmed into a fresh store")
    chat.notes.append("targets of the block store: ratio <= 1.3x on the tiny llama, <= 2x on Gemma-3-270M")
    return chat


def _agent_table(agents: list[dict[str, Any]]) -> Table:
    agent = Table(
        "Bytes stored by 3 agents x 2 rounds of raw completions (system prompts share nothing)",
        [
            "model",
            "prompt tokens",
            "snapshots",
            "disk files",
            "RAM",
            "3 snapshots: disk",
            "RAM",
            "ratio disk",
        ],
    )
    for row in agents:
        agent.add(
            row["model"],
            "/".join(str(t) for t in row["prompt_tokens"]),
            row["disk_entries"],
            fmt_bytes(row["disk_bytes"]),
            fmt_bytes(row["ram_bytes"]),
            fmt_bytes(row["one_snapshot_disk_bytes"]),
            fmt_bytes(row["one_snapshot_ram_bytes"]),
            _ratio(row["disk_bytes"], row["one_snapshot_disk_bytes"]),
        )
    agent.notes.append("3 snapshots: each agent's round-2 prompt warmed alone into a fresh store, added up")
    return agent


# The targets of the request path and the restores (see _geometry_tables).
PUT_OVER_CAPTURE = 1.5
RAM_GBPS = 3.5
DISK_OVER_FLOOR = 0.9


def _geometry_tables(geo: dict[str, Any], reps: int) -> list[Table]:
    runs = geo["sizes"]
    geometry_table = Table(
        f"{geo['model']}: one prompt's state, "
        + " and ".join(f"{run['prompt_tokens']:,}" for run in runs)
        + " tokens",
        ["what", *(h for run in runs for h in (f"{run['prompt_tokens']:,}: time", "GB/s"))],
    )

    def row(label: str, seconds: list[float], rates: bool = True) -> None:
        cells: list[str] = []
        for run, value in zip(runs, seconds, strict=True):
            gbps = run["state_bytes"] / value / 1e9 if value > 0 and rates else None
            cells += [fmt_seconds(value), "-" if gbps is None else f"{gbps:.2f}"]
        geometry_table.add(label, *cells)

    def floor(run: dict[str, Any]) -> float:
        return float(run["read_file_s"] + run["llama_restore_s"])

    def ram_floor(run: dict[str, Any]) -> float:
        return float(run["copy_s"] + run["llama_restore_s"])

    row("warm (read or fill the prompt, capture, put)", [r["warm_s"] for r in runs], rates=False)
    for label, key in (
        ("llama.cpp capture alone (seq_get_data, reused buffer)", "llama_capture_s"),
        ("capture + put into RAM: the request's part (warm, prompt in context)", "capture_put_s"),
        ("  ... until the store holds it (off the request path)", "capture_put_settled_s"),
        ("llama.cpp restore alone (seq_set_data)", "llama_restore_s"),
        ("one copy of the state into a touched buffer (numpy copyto)", "copy_s"),
    ):
        row(label, [r[key] for r in runs])
    row("floor from RAM: that copy, then llama.cpp's restore alone", [ram_floor(r) for r in runs])
    for label, key in (
        ("restore from RAM (lookup + restore)", "restore_ram_s"),
        ("read one file of the state's size into one buffer", "read_file_s"),
        ("restore from disk, store reopened (lookup + read + restore)", "restore_disk_s"),
    ):
        row(label, [r[key] for r in runs])
    if all("restore_disk_zstd_s" in r for r in runs):
        row("  ... the files compressed (--compression zstd)", [r["restore_disk_zstd_s"] for r in runs])
    row("floor from disk: that read, then llama.cpp's restore alone", [floor(r) for r in runs])
    row("whole request restoring from RAM", [r["request_ram_s"] for r in runs], rates=False)
    row("whole request restoring from disk", [r["request_disk_s"] for r in runs], rates=False)
    row("opening the store again", [r["open_s"] for r in runs], rates=False)
    for run in runs:
        state = run["state_bytes"]
        put_ratio = run["capture_put_s"] / run["llama_capture_s"]
        ram_gbps = state / run["restore_ram_s"] / 1e9
        ram_ratio = ram_floor(run) / run["restore_ram_s"]
        disk_ratio = floor(run) / run["restore_disk_s"]
        geometry_table.notes.append(
            f"{run['prompt_tokens']:,} tokens: state {fmt_bytes(state)} "
            f"({state / run['prompt_tokens'] / 1024:.2f} KiB per token, header included), files on disk "
            f"{fmt_bytes(run['disk_bytes'])} (compression {run.get('compression', 'zstd')}"
            + (f"; {fmt_bytes(run['disk_bytes_zstd'])} compressed" if "disk_bytes_zstd" in run else "")
            + f"); targets: capture + put {put_ratio:.2f}x llama.cpp's capture "
            f"(<= {PUT_OVER_CAPTURE}x: {'met' if put_ratio <= PUT_OVER_CAPTURE else 'NOT met'}), from RAM "
            f"{ram_gbps:.2f} GB/s (>= {RAM_GBPS}: {'met' if ram_gbps >= RAM_GBPS else 'NOT met'}; "
            f"{ram_ratio:.2f}x its floor of one copy and llama.cpp's restore, "
            f"{state / ram_floor(run) / 1e9:.2f} GB/s here), from disk "
            f"{disk_ratio:.2f}x its floor (>= {DISK_OVER_FLOOR}: "
            f"{'met' if disk_ratio >= DISK_OVER_FLOOR else 'NOT met'})"
        )
    filled = [f"{r['prompt_tokens']:,}" for r in runs if r["filled"]]
    if filled:
        geometry_table.notes.append(
            f"{' and '.join(filled)} tokens: the context filled with the first size's rows repeated, "
            "not read (reading it takes minutes of attention on 2 cores; storage moves the same bytes)"
        )
    geometry_table.notes.append(
        "page cache: it held every file read here (the store's, written before the restores, and the "
        "one file, written just before its reads; neither dropped)"
    )
    geometry_table.notes.append(
        f"median of {reps}; a request is a raw completion of the prompt and "
        "16 more tokens (max_tokens=1) through snapcache.attach(save=False); its restore is timed "
        "up to the listener's `restored` call, before the 16 tokens are read; one untimed restore "
        "from RAM comes first (a process's first restore also starts its decoding threads)"
    )
    geometry_table.notes.append(
        f"before, untimed here: the first CachedLlama call of the process on this model took "
        f"{fmt_seconds(geo['first_cached_call_s'])} (it measures the model's split alignment once)"
    )

    b = geo["budgets"]
    if b is None:
        return [geometry_table]
    budgets = Table(
        f"Budgets under a stream of {b['prompts']} distinct {b['prompt_tokens']}-token prompts "
        f"({fmt_bytes(b['offered_bytes'])} of state), {geo['model']}",
        ["tier", "budget", "most used", "after", "entries", "evictions", "within budget"],
    )
    budgets.add(
        "RAM",
        fmt_bytes(b["ram_budget"]),
        fmt_bytes(b["most_ram"]),
        "-",
        b["ram_entries"],
        b["ram_evictions"],
        "yes" if b["most_ram"] <= b["ram_budget"] else "NO",
    )
    budgets.add(
        "disk: snapshot files",
        fmt_bytes(b["disk_budget"]),
        fmt_bytes(b["most_disk"]),
        "-",
        b["disk_entries"],
        b["disk_evictions"],
        "yes" if b["most_disk"] <= b["disk_budget"] else "NO",
    )
    over = b["most_files"] - b["disk_budget"]
    budgets.add(
        "directory, index too",
        "-",
        fmt_bytes(b["most_files"]),
        fmt_bytes(b["files_after_close"]),
        "-",
        "-",
        "the index adds " + fmt_bytes(over) if over > 0 else "yes",
    )
    budgets.notes.append(
        f"most used: the largest value seen after each prompt; queued for disk outside RAM at most "
        f"{fmt_bytes(b['most_pending'])}; {fmt_seconds(b['seconds'])} in all"
    )
    return [geometry_table, budgets]


def _first_table(first: dict[str, Any]) -> Table:
    first_table = Table(
        f"First request: time to first token of a cold {first['prompt_tokens']:,}-token raw prompt "
        f"({first['model']}, {_common.LLAMA_THREADS} threads)",
        ["Llama", "runs", "median", "best", "vs plain"],
    )
    plain_median = statistics.median(first["plain_s"])
    cached_median = statistics.median(first["cached_s"])
    first_table.add(
        "plain", len(first["plain_s"]), fmt_seconds(plain_median), fmt_seconds(min(first["plain_s"])), "-"
    )
    first_table.add(
        "CachedLlama, empty store, saving",
        len(first["cached_s"]),
        fmt_seconds(cached_median),
        fmt_seconds(min(first["cached_s"])),
        f"{(cached_median / plain_median - 1) * 100:+.1f}%",
    )
    first_table.notes.append(
        f"runs alternate (plain, cached, cached, plain, ...); CachedLlama saved {first['checkpoints']} "
        "checkpoints before the first token; target: <= +5%"
    )
    first_table.notes.append(
        f"before the runs, untimed here: the first CachedLlama call of the process on this model took "
        f"{fmt_seconds(first['first_cached_call_s'])} (it measures the model's split alignment once)"
    )
    return first_table


PARTS = ("first", "chat", "agents", "geometry")


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each capture and restore")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    parser.add_argument(
        "--geometry-tokens",
        type=int,
        nargs="+",
        help="the prompt sizes of the 8B geometry (default 1024 8192; the first is read, the others "
        "filled from its rows)",
    )
    parser.add_argument("--skip-budgets", action="store_true", help="leave out the geometry's budget stream")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.geometry_tokens:
        sizes = dataclasses.replace(sizes, geometry_prompts=tuple(args.geometry_tokens))
    reps = 1 if args.quick else args.reps
    load_before = os.getloadavg()[0]
    extra: dict[str, Any] = {}
    tables: list[Table] = []
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as tmp:
        workdir = Path(tmp)
        models = [tiny_model(workdir)]
        gemma = choose_model(args.quick, workdir)
        if not gemma.is_tiny:
            models.insert(0, gemma)
        started = time.perf_counter()

        def step(what: str) -> None:
            print(f"  {time.perf_counter() - started:6.1f} s  {what}", file=sys.stderr, flush=True)

        # The first request first: its CachedLlama is the process's first on this model.
        if "first" in args.parts:
            step("first request")
            extra["first_request"] = first_request(gemma, sizes, workdir)
        if "chat" in args.parts:
            step("chat")
            extra["chat"] = [chat_bytes(m, sizes, workdir / f"chat-{i}") for i, m in enumerate(models)]
            tables.append(_chat_table(extra["chat"], sizes))
        if "agents" in args.parts:
            step("agents")
            extra["agents"] = [agent_bytes(m, sizes, workdir / f"agents-{i}") for i, m in enumerate(models)]
            tables.append(_agent_table(extra["agents"]))
        if "geometry" in args.parts:
            step("8B geometry")
            extra["geometry"] = geometry(sizes, workdir, reps, budgets=not args.skip_budgets)
            tables.extend(_geometry_tables(extra["geometry"], reps))
        step("done")
    if "first_request" in extra:
        tables.append(_first_table(extra["first_request"]))
    load_after = os.getloadavg()[0]
    tables[-1].notes.append(
        f"load average {load_before:.1f} before, {load_after:.1f} after (a shared machine: other work "
        "slows it)"
    )
    report("bench_storage", tables, args.json, quick=args.quick, extra=extra)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(_common.LLAMA_THREADS))
    main()
