"""`snapcache warm PROMPT_FILE`: read a prompt once and keep its llama.cpp state on disk."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from snapcache import DEFAULT_SCOPE
from snapcache.admin import BLOCK_TOKENS, block_keys

from ..command_errors import CliError
from ..formatting import format_duration, format_size, render_pairs
from ..model_source import choose_model, load_llama
from ..progress import prompt_progress
from ..prompt_file import read_prompt
from ..remote import warm_on_server
from ..settings import Settings, settings_of

if TYPE_CHECKING:
    from llama_cpp import Llama

PromptArgument = Annotated[
    str, typer.Argument(metavar="PROMPT_FILE", help="A UTF-8 text file, or - for standard input.")
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="A GGUF model file (default: $SNAPCACHE_MODEL, else the demo model).",
        show_default=False,
    ),
]
NCtxOption = Annotated[
    int | None,
    typer.Option("--n-ctx", help="Context size in tokens (default 4096).", show_default=False, min=1),
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        "--threads", "-t", help="CPU threads (default: all usable cores).", show_default=False, min=1
    ),
]
InexactOption = Annotated[
    bool,
    typer.Option(
        "--inexact",
        help="Restore at any token, also where output may drift from a cold run (own snapshots; see README). "
        "Default: exact where this llama.cpp build keeps restores bit for bit, inexact where it cannot.",
    ),
]
ExactOption = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Restore only where output stays bit for bit a cold run's; where this build cannot, "
        "cache nothing.",
    ),
]


def exactness(exact: bool, inexact: bool) -> bool | Literal["auto"]:
    """What --exact and --inexact ask for: one of them, or "auto" (this build's choice)."""
    if exact and inexact:
        raise CliError("--exact and --inexact ask for opposite things: give one of them, or neither")
    return True if exact else False if inexact else "auto"


RawOption = Annotated[
    bool,
    typer.Option("--raw", help="Warm the text as it is, not as the system prompt of a chat."),
]


def warm(
    ctx: typer.Context,
    prompt_file: PromptArgument,
    model: ModelOption = None,
    scope: Annotated[
        str, typer.Option("--scope", "-s", help="Keep the snapshot in this scope.")
    ] = DEFAULT_SCOPE,
    priority: Annotated[int, typer.Option("--priority", "-p", help="Higher survives eviction longer.")] = 0,
    raw: RawOption = False,
    n_ctx: NCtxOption = None,
    threads: ThreadsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    exact: ExactOption = False,
    inexact: InexactOption = False,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Warm in a running `snapcache serve` at this URL (e.g. http://127.0.0.1:8000) instead.",
            show_default=False,
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", help="With --server: its API key (default: $SNAPCACHE_API_KEY).", show_default=False
        ),
    ] = None,
) -> None:
    """Read PROMPT_FILE with the model once and store its state, so later chats skip reading it."""
    text = read_prompt(prompt_file)
    asked = exactness(exact, inexact)
    if server is not None:
        if model is not None or n_ctx is not None or threads is not None or exact or inexact:
            raise CliError(
                "--model, --n-ctx, --threads, --exact and --inexact belong to the server; leave them out "
                "with --server"
            )
        report = warm_on_server(server, text, scope=scope, priority=priority, raw=raw, api_key=api_key)
        typer.echo(json.dumps(report, indent=2) if as_json else render_pairs(_report_lines(report)))
        return
    choice = choose_model(model)
    settings = settings_of(ctx)
    # Imported only now: it imports llama_cpp, which takes a moment that bad input should not wait for.
    from snapcache import CachedLlama

    with settings.open_store() as store:
        llm = load_llama(
            choice, n_ctx=n_ctx, threads=threads, verbose=settings.verbose, **settings.llama_options()
        )
        try:
            check_fits(llm, text)
            cached = CachedLlama(llm, store, scope=scope, exact=asked)
            with prompt_progress("reading prompt") as progress:
                result = cached.warm(text, priority, raw=raw, progress=progress)
            chosen = cached.exactness.as_dict()
        finally:
            llm.close()
        store.flush()
    stored_bytes = _stored_bytes(settings, result.key.id, scope)
    report = {
        "key": result.key.id,
        "scope": scope,
        "priority": priority,
        "token_count": result.token_count,
        "state_bytes": result.state_bytes,
        "stored_bytes": stored_bytes,
        "seconds": result.seconds,
        "from_cache": result.from_cache,
        "model": str(choice.path),
        "model_fingerprint": result.key.model_fingerprint,
        "exactness": chosen,
    }
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(render_pairs(_report_lines(report)))


def _report_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    done = "already cached, checked in" if report["from_cache"] else "read in"
    stored = "-" if report["stored_bytes"] is None else format_size(report["stored_bytes"])
    return [
        ("tokens", f"{report['token_count']} ({done} {format_duration(report['seconds'])})"),
        ("state", format_size(report["state_bytes"])),
        ("on disk", stored),
        ("scope", f"{report['scope']} (priority {report['priority']})"),
        ("key", report["key"]),
        *_exactness_line(report.get("exactness")),
    ]


def _exactness_line(chosen: Any) -> list[tuple[str, str]]:
    """What `auto` (or the option given) chose for the model's cache, and why."""
    if not isinstance(chosen, dict) or "mode" not in chosen:
        return []
    how = "auto" if chosen.get("asked") == "auto" else "asked for"
    return [("exactness", f"{chosen['mode']} ({how}: {chosen.get('reason', '')})")]


def check_fits(llm: Llama, text: str) -> None:
    """CliError when `text` alone needs more tokens than the context holds."""
    count = len(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
    if count >= llm.n_ctx():
        raise CliError(
            f"the prompt is {count} tokens but the context holds {llm.n_ctx()}; "
            f"pass --n-ctx {_round_up(count + 256)} or more"
        )


def _stored_bytes(settings: Settings, key_id: str, scope: str) -> int | None:
    """The size of the snapshot's files: its record and the shared blocks it needs (a fresh store has
    nothing in RAM, so its rows are the disk's)."""
    with settings.open_store() as store:
        rows = {entry.key: entry for entry in store.entries(scope=scope, blocks=True) if entry.tier == "disk"}
        record = next((key for key in rows if key.id == key_id), None)
        tokens = None if record is None else store.stored_tokens(record)
    if record is None or tokens is None:
        return None
    needed = block_keys(record.model_fingerprint, scope, tokens, len(tokens) // BLOCK_TOKENS)
    return int(rows[record].nbytes) + sum(int(rows[key].nbytes) for key in needed if key in rows)


def _round_up(count: int, step: int = 1024) -> int:
    return -(-count // step) * step
