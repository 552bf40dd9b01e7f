"""Commands that need only the store: ls, inspect, rm, prune, clear, stats."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from snapcache import SavingsLedger, ScopeSavings

from ..command_errors import CliError
from ..formatting import (
    format_age,
    format_duration,
    format_size,
    format_time,
    parse_age,
    parse_size,
    render_pairs,
    render_table,
)
from ..settings import settings_of

if TYPE_CHECKING:
    from snapcache import EntryInfo
    from snapcache.admin import RemoteStats

SHORT_ID = 12

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
ScopeFilter = Annotated[
    str | None, typer.Option("--scope", help="Only snapshots of this scope.", show_default=False)
]
KeyArgument = Annotated[
    str, typer.Argument(metavar="KEY", help="A snapshot key id, or a unique prefix of one.")
]


def list_entries(ctx: typer.Context, scope: ScopeFilter = None, as_json: JsonOption = False) -> None:
    """List the stored snapshots, most recently used first."""
    with settings_of(ctx).open_store() as store:
        everything = store.entries(scope=scope, blocks=True)
        remote = store.remote_stats()
    rows = [e for e in everything if not e.key.is_block]
    blocks = [e for e in everything if e.key.is_block]
    rows.sort(key=lambda e: e.last_used_at, reverse=True)
    if as_json:
        _print_json([entry_json(e) for e in rows])
        return
    if not rows:
        typer.echo("no snapshots" + (f" in scope {scope!r}" if scope else ""))
        _echo_remote(remote)
        return
    now = time.time()
    table = [
        [
            e.key.id[:SHORT_ID],
            e.key.scope,
            str(e.key.token_count),
            str(e.priority),
            format_size(e.nbytes),
            format_size(e.state_bytes),
            format_age(e.last_used_at, now),
            e.key.model_fingerprint[:SHORT_ID],
        ]
        for e in rows
    ]
    headers = ["KEY", "SCOPE", "TOKENS", "PRIORITY", "SIZE", "STATE", "LAST USED", "MODEL"]
    typer.echo(render_table(headers, table, right=(2, 3, 4, 5)))
    total = sum(e.nbytes for e in rows)
    line = f"{len(rows)} snapshot{'s' if len(rows) != 1 else ''}, {format_size(total)}"
    if blocks:
        shared = sum(e.nbytes for e in blocks)
        plural = "s" if len(blocks) != 1 else ""
        line += f"; plus {len(blocks)} shared 64-token block{plural} ({format_size(shared)})"
    typer.echo(line)
    _echo_remote(remote)


def _echo_remote(remote: RemoteStats | None) -> None:
    """Below a listing of this machine's snapshots: the remote tier's, in sum."""
    for name, value in _remote_lines(remote):
        typer.echo(f"{name.strip()}: {value}")


def inspect(ctx: typer.Context, key: KeyArgument, as_json: JsonOption = False) -> None:
    """Verify one snapshot (header, checksum, tokens) and print what it holds."""
    with settings_of(ctx).open_store() as store:
        entry = resolve_key(store.entries(), key)
        # get() checks the file's checksum and that its tokens hash to the key; None is any failure.
        snapshot = store.get(entry.key)
        if snapshot is None:
            raise CliError(
                f"snapshot {entry.key.id[:SHORT_ID]} could not be read or verified (see the warning above)"
            )
        state_bytes = memoryview(snapshot.state).nbytes
        logits = 0 if snapshot.logits is None else int(snapshot.logits.size)
    info = entry_json(entry) | {
        "verified": True,
        "state_bytes": state_bytes,
        "logits": logits,
        "first_tokens": [int(t) for t in snapshot.tokens[:16]],
    }
    if as_json:
        _print_json(info)
        return
    ratio = state_bytes / entry.nbytes if entry.nbytes else 0.0
    typer.echo(
        render_pairs(
            [
                ("key", entry.key.id),
                ("model", entry.key.model_fingerprint),
                ("scope", entry.key.scope),
                ("tokens", str(entry.key.token_count)),
                ("prefix hash", entry.key.prefix_hash),
                ("priority", str(entry.priority)),
                ("tier", entry.tier),
                ("state", format_size(state_bytes)),
                ("stored", f"{format_size(entry.nbytes)} (ratio {ratio:.2f})"),
                ("logits", f"{logits} values" if logits else "none"),
                ("created", format_time(entry.created_at)),
                ("last used", format_time(entry.last_used_at)),
                ("first tokens", " ".join(str(t) for t in info["first_tokens"])),
                ("verified", "ok (checksum and token hash)"),
            ]
        )
    )


def remove(
    ctx: typer.Context,
    keys: Annotated[list[str], typer.Argument(metavar="KEY", help="Key ids, or unique prefixes of them.")],
    as_json: JsonOption = False,
) -> None:
    """Remove snapshots by key id (a unique prefix is enough)."""
    with settings_of(ctx).open_store() as store:
        entries = store.entries()
        chosen = [resolve_key(entries, text) for text in keys]
        removed = [e for e in _dedupe(chosen) if store.remove(e.key)]
    if as_json:
        _print_json({"removed": [e.key.id for e in removed], "freed_bytes": sum(e.nbytes for e in removed)})
        return
    for e in removed:
        typer.echo(f"removed {e.key.id[:SHORT_ID]} ({e.key.scope}, {e.key.token_count} tokens)")


def prune(
    ctx: typer.Context,
    max_bytes: Annotated[
        str | None,
        typer.Option("--max-bytes", help="Shrink to at most this size, e.g. 500M or 2G.", show_default=False),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", help="Remove snapshots unused for this long, e.g. 7d or 12h.", show_default=False
        ),
    ] = None,
    scope: ScopeFilter = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would go; remove nothing.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Remove old snapshots, then the lowest priority / least recently used until under --max-bytes."""
    if max_bytes is None and older_than is None:
        raise CliError("prune needs --max-bytes SIZE, --older-than AGE, or both")
    try:
        budget = None if max_bytes is None else parse_size(max_bytes)
        max_age = None if older_than is None else parse_age(older_than)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    with settings_of(ctx).open_store() as store:
        candidates = store.entries(scope=scope, blocks=True)
        doomed = choose_prunable(candidates, budget, max_age, time.time())
        removed = doomed if dry_run else [e for e in doomed if store.remove(e.key)]
    freed = sum(e.nbytes for e in removed)
    gone = {e.key.id for e in removed}
    kept = [e for e in candidates if e.key.id not in gone]
    if as_json:
        _print_json(
            {
                "dry_run": dry_run,
                "removed": [e.key.id for e in removed],
                "freed_bytes": freed,
                "remaining": len(kept),
                "remaining_bytes": sum(e.nbytes for e in kept),
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    for e in removed:
        what = "block of " if e.key.is_block else ""
        typer.echo(
            f"{verb} {e.key.id[:SHORT_ID]} ({what}{e.key.user_scope}, priority {e.priority}, "
            f"{format_size(e.nbytes)})"
        )
    typer.echo(
        f"{verb} {_how_many(removed)} ({format_size(freed)}); "
        f"{_how_many(kept)} left ({format_size(sum(e.nbytes for e in kept))})"
    )


def _how_many(entries: list[EntryInfo]) -> str:
    """`entries` counted as users see them: "2 snapshots", then " and 9 shared blocks" if any."""
    blocks = sum(1 for e in entries if e.key.is_block)
    snapshots = len(entries) - blocks
    said = f"{snapshots} snapshot{'s' if snapshots != 1 else ''}"
    if blocks:
        said += f" and {blocks} shared block{'s' if blocks != 1 else ''}"
    return said


def choose_prunable(
    entries: list[EntryInfo], budget: int | None, max_age: float | None, now: float
) -> list[EntryInfo]:
    """Entries unused for longer than `max_age`, then the rest in the store's eviction order until
    they fit in `budget` bytes."""
    from snapcache import SnapshotStore

    doomed = [e for e in entries if max_age is not None and now - e.last_used_at > max_age]
    if budget is not None:
        gone = {e.key.id for e in doomed}
        rest = SnapshotStore.eviction_order(e for e in entries if e.key.id not in gone)
        total = sum(e.nbytes for e in rest)
        for e in rest:
            if total <= budget:
                break
            doomed.append(e)
            total -= e.nbytes
    return doomed


def clear(
    ctx: typer.Context,
    scope: ScopeFilter = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Remove every snapshot (or every one of --scope)."""
    with settings_of(ctx).open_store() as store:
        doomed = store.entries(scope=scope, blocks=True)
        if not doomed:
            typer.echo("nothing to clear")
            return
        n = sum(1 for e in doomed if not e.key.is_block)
        what = f"all {n} snapshot{'s' if n != 1 else ''} and their shared blocks"
        what += f" of scope {scope!r}" if scope else ""
        if not yes:
            typer.confirm(f"Remove {what} ({format_size(sum(e.nbytes for e in doomed))})?", abort=True)
        removed = [e for e in doomed if store.remove(e.key) and not e.key.is_block]
    typer.echo(f"removed {len(removed)} snapshot{'s' if len(removed) != 1 else ''}")


def stats(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """How many snapshots the cache holds, their size, and their scopes and models."""
    with settings_of(ctx).open_store() as store:
        everything = store.entries(blocks=True)
        directory = store.directory
        counters = store.stats()
        remote = store.remote_stats()
        compression = store.compression
    entries = [e for e in everything if not e.key.is_block]
    blocks = [e for e in everything if e.key.is_block]
    savings = SavingsLedger(directory).totals() if directory is not None else []
    stored = sum(e.nbytes for e in everything)
    state = sum(e.state_bytes for e in everything)
    tokens = sum(e.key.token_count for e in entries)
    scopes = Counter(e.key.scope for e in entries)
    models = Counter(e.key.model_fingerprint for e in entries)
    if as_json:
        _print_json(
            {
                "cache_dir": str(directory),
                "snapshots": len(entries),
                "shared_blocks": len(blocks),
                "shared_block_bytes": sum(e.nbytes for e in blocks),
                "stored_bytes": stored,
                "state_bytes": state,
                "compression": compression,
                "tokens": tokens,
                "disk_budget_bytes": counters.disk_budget_bytes,
                "scopes": dict(scopes),
                "models": dict(models),
                "store": asdict(counters),
                "remote": None if remote is None else asdict(remote),
                "savings": [asdict(row) for row in savings],
            }
        )
        return
    ratio = f"{state / stored:.2f}" if stored else "-"
    typer.echo(
        render_pairs(
            [
                ("cache directory", str(directory)),
                ("snapshots", str(len(entries))),
                ("shared blocks", f"{len(blocks)} ({format_size(sum(e.nbytes for e in blocks))})"),
                ("stored", f"{format_size(stored)} of {format_size(counters.disk_budget_bytes)} budget"),
                ("state", f"{format_size(state)} (compression ratio {ratio}, new states: {compression})"),
                ("tokens", str(tokens)),
                ("scopes", ", ".join(f"{s} ({n})" for s, n in sorted(scopes.items())) or "-"),
                ("models", ", ".join(f"{m[:SHORT_ID]} ({n})" for m, n in sorted(models.items())) or "-"),
                *_remote_lines(remote),
                *_savings_lines(savings),
            ]
        )
    )


def _remote_lines(remote: RemoteStats | None) -> list[tuple[str, str]]:
    """The remote tier, if there is one: where, whether it answers, and what it holds."""
    if remote is None:
        return []
    if not remote.reachable:
        return [("remote", f"{remote.url} (prefix {remote.prefix}): not reachable")]
    held = "-" if remote.used_bytes is None else format_size(remote.used_bytes)
    entries = "-" if remote.entries is None else str(remote.entries)
    return [
        ("remote", f"{remote.url} (prefix {remote.prefix}): reachable"),
        ("  holds", f"{entries} values, {held} of {format_size(remote.budget_bytes)} budget"),
    ]


def _savings_lines(savings: list[ScopeSavings]) -> list[tuple[str, str]]:
    """What the cache saved, across restarts: tokens not read and the estimated prefill seconds."""
    if not savings:
        return [("saved", "nothing recorded yet (completions through snapcache serve or attach record it)")]
    lines = [("saved", _saved_text(savings))]
    if len({row.scope for row in savings}) > 1:
        scopes = sorted({row.scope for row in savings})
        lines += [(f"  {scope}", _saved_text([r for r in savings if r.scope == scope])) for scope in scopes]
    return lines


def _saved_text(rows: list[ScopeSavings]) -> str:
    tokens = sum(row.cached_tokens for row in rows)
    requests = sum(row.requests for row in rows)
    prompt = sum(row.prompt_tokens for row in rows)
    share = f" ({tokens / prompt:.0%} of {prompt})" if prompt else ""
    text = f"{tokens} prompt tokens not read{share} in {requests} requests"
    seconds = [row.seconds_saved for row in rows if row.seconds_saved is not None]
    return text + (f", about {format_duration(sum(seconds))} of prefill" if seconds else "")


def resolve_key(entries: Iterable[EntryInfo], text: str) -> EntryInfo:
    """The one entry whose key id starts with `text`; CliError when none or several do."""
    prefix = text.strip().lower()
    if not prefix or any(ch not in "0123456789abcdef" for ch in prefix):
        raise CliError(f"not a key id: {text!r} (key ids are hexadecimal; see `snapcache ls`)")
    matches = _dedupe(e for e in entries if e.key.id.startswith(prefix))
    if not matches:
        raise CliError(f"no snapshot with a key id starting with {prefix!r}")
    if len(matches) > 1:
        shown = ", ".join(e.key.id[: max(SHORT_ID, len(prefix) + 2)] for e in matches[:4])
        raise CliError(f"key prefix {prefix!r} is ambiguous: it matches {len(matches)} snapshots ({shown})")
    return matches[0]


def entry_json(entry: EntryInfo) -> dict[str, Any]:
    """One entry as plain JSON types."""
    return {
        "id": entry.key.id,
        "model_fingerprint": entry.key.model_fingerprint,
        "scope": entry.key.scope,
        "token_count": entry.key.token_count,
        "prefix_hash": entry.key.prefix_hash,
        "priority": entry.priority,
        "tier": entry.tier,
        "stored_bytes": entry.nbytes,
        "state_bytes": entry.state_bytes,
        "created_at": entry.created_at,
        "last_used_at": entry.last_used_at,
    }


def _dedupe(entries: Iterable[EntryInfo]) -> list[EntryInfo]:
    seen: dict[str, EntryInfo] = {}
    for entry in entries:
        seen.setdefault(entry.key.id, entry)
    return list(seen.values())


def _print_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False))
