"""The `snapcache` command: global options, the commands, and the one place errors become messages."""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

import snapcache

from .command_errors import CliError, describe
from .commands import bench, bundle, check, doctor, entries, serve, warm, why
from .formatting import parse_size
from .settings import (
    FLASH_ATTN_ENV,
    GPU_LAYERS_ENV,
    KV_CACHE_ENV,
    REMOTE_BUDGET_ENV,
    SWA_CACHE_ENV,
    Settings,
)

DEBUG_ENV = "SNAPCACHE_DEBUG"


class _CleanErrors(TyperGroup):
    """Every command runs inside this: a failure is one line on stderr and a non-zero exit status.

    The global options may also come after the command (`snapcache serve --cache-dir DIR`), as
    users type them: they are moved before it before the arguments are parsed.
    """

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        return super().parse_args(ctx, _global_options_first(args, self._global_option_names()))

    def _global_option_names(self) -> dict[str, bool]:
        """Each global option's names, and whether it takes a value (--version stays where it is)."""
        return {
            name: not getattr(param, "is_flag", False)
            for param in self.params
            if param.param_type_name == "option" and not param.is_eager
            for name in param.opts
        }

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            # Usage errors from the argument parser report themselves (exit status 2).
            if hasattr(exc, "exit_code") and hasattr(exc, "show"):
                raise
            if os.environ.get(DEBUG_ENV):
                traceback.print_exc()
            typer.echo(f"snapcache: error: {describe(exc)}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 1)) from None


def _global_options_first(args: list[str], options: dict[str, bool]) -> list[str]:
    """`args` with the global options found after the command moved before it (up to a `--`)."""
    start = 0
    while start < len(args) and args[start].startswith("-"):
        width = _option_width(args[start], options)
        if width == 0:
            return args  # an unknown option before the command: the parser reports it
        start += width
    if start >= len(args):
        return args
    moved: list[str] = []
    kept: list[str] = []
    index = start + 1
    while index < len(args):
        if args[index] == "--":
            kept += args[index:]
            break
        width = _option_width(args[index], options)
        if index + width > len(args):
            raise typer.BadParameter("requires a value", param_hint=f"'{args[index]}'")
        (moved if width else kept).extend(args[index : index + max(width, 1)])
        index += max(width, 1)
    return [*args[:start], *moved, args[start], *kept]


def _option_width(arg: str, options: dict[str, bool]) -> int:
    """How many arguments a global option takes up at `arg` (0: `arg` is not one)."""
    name, equals, _value = arg.partition("=")
    if name not in options:
        return 0
    return 2 if options[name] and not equals else 1


app = typer.Typer(
    cls=_CleanErrors,
    name="snapcache",
    help="Save and restore the llama.cpp state of prompts a local model has already read. "
    "The global options (--cache-dir, --remote, --remote-budget, --kv-cache, --swa-cache, --flash-attn, "
    "--compression, -v) may come before or after the command.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"snapcache {snapcache.__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    ctx: typer.Context,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="Cache directory (default: $SNAPCACHE_DIR, else the user cache directory).",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the library's and llama.cpp's log lines.")
    ] = False,
    remote: Annotated[
        str | None,
        typer.Option(
            "--remote",
            help="A Redis (or Valkey) tier shared by machines, redis://HOST:PORT/DB "
            "(default: $SNAPCACHE_REMOTE, else none).",
            show_default=False,
        ),
    ] = None,
    remote_budget: Annotated[
        str | None,
        typer.Option(
            "--remote-budget",
            envvar=REMOTE_BUDGET_ENV,
            help="Bytes the remote tier may hold, e.g. 2GiB (default: $SNAPCACHE_REMOTE_BUDGET, else 4GiB).",
            show_default=False,
        ),
    ] = None,
    kv_cache: Annotated[
        str | None,
        typer.Option(
            "--kv-cache",
            envvar=KV_CACHE_ENV,
            help="The models' K/V cache: f16 (default), or q8_0 / q4_0 with flash attention (less memory, "
            "slower prompt reads; q8_0 generates faster). States are found only under the type they "
            "were saved with: give warm and serve the same. Default: $SNAPCACHE_KV_CACHE, else f16.",
            show_default=False,
        ),
    ] = None,
    swa_cache: Annotated[
        str | None,
        typer.Option(
            "--swa-cache",
            envvar=SWA_CACHE_ENV,
            help="A sliding-window model's window cache (Gemma 2 and 3): window (the window's cells "
            "only, as llama-server keeps it: long prompts read faster, 1.5-1.7x at 8K tokens on Gemma "
            "3; restores where a read stopped and stored it) or full (a cell per position: a stored "
            "state restores any prefix its blocks cover). States are found only under the one they "
            "were saved with: give warm and serve the same. Default: $SNAPCACHE_SWA_CACHE, else window.",
            show_default=False,
        ),
    ] = None,
    flash_attn: Annotated[
        str | None,
        typer.Option(
            "--flash-attn",
            envvar=FLASH_ATTN_ENV,
            help="Flash attention: auto (llama.cpp's default, on, except over an f16 K/V cache on the CPU, "
            "where restores would not stay exact), on or off. States are found only under the setting "
            "they were saved with. Default: $SNAPCACHE_FLASH_ATTN, else auto.",
            show_default=False,
        ),
    ] = None,
    gpu_layers: Annotated[
        int | None,
        typer.Option(
            "--gpu-layers",
            envvar=GPU_LAYERS_ENV,
            help="How many of the model's layers run on the GPU: -1 for all, 0 for none. States go "
            "to and from the GPU through pinned memory ($SNAPCACHE_PINNED_MEMORY bounds it). "
            "Default: $SNAPCACHE_GPU_LAYERS, else all on a GPU build of llama.cpp.",
            show_default=False,
        ),
    ] = None,
    compression: Annotated[
        str | None,
        typer.Option(
            "--compression",
            help="How the disk tier stores states: auto (raw where zstd saves under a quarter, as on "
            "f16 K/V: read at the disk's speed), zstd or none. Any setting reads every file. "
            "Default: $SNAPCACHE_COMPRESSION, else auto.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Save and restore the llama.cpp state of prompts a local model has already read."""
    _configure_logging(ctx, verbose)
    budget = None
    if remote_budget is not None:
        try:
            budget = parse_size(remote_budget)
        except ValueError as exc:
            raise CliError(f"--remote-budget: {exc}") from None
    if kv_cache is not None:
        # Imported only here: it loads llama.cpp, which most commands never need.
        from snapcache.admin import KV_CACHE_TYPES

        if kv_cache not in KV_CACHE_TYPES:
            raise CliError(f"--kv-cache must be one of {', '.join(KV_CACHE_TYPES)}, got {kv_cache!r}")
    if swa_cache is not None:
        from snapcache.admin import SWA_CACHES

        if swa_cache not in SWA_CACHES:
            raise CliError(f"--swa-cache must be one of {', '.join(SWA_CACHES)}, got {swa_cache!r}")
    if flash_attn is not None:
        from snapcache.admin import FLASH_ATTN_MODES

        if flash_attn not in FLASH_ATTN_MODES:
            raise CliError(f"--flash-attn must be one of {', '.join(FLASH_ATTN_MODES)}, got {flash_attn!r}")
    if compression is not None:
        choices = snapcache.SnapshotStore.COMPRESSIONS
        if compression not in choices:
            raise CliError(f"--compression must be one of {', '.join(choices)}, got {compression!r}")
    ctx.obj = Settings(
        cache_dir=cache_dir,
        verbose=verbose,
        remote=remote,
        remote_budget=budget,
        kv_cache=kv_cache,
        swa_cache=swa_cache,
        flash_attn=flash_attn,
        compression=compression,
        gpu_layers=gpu_layers,
    )


class _EchoHandler(logging.Handler):
    """Writes to whatever stderr is now (CliRunner swaps it per invocation)."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.echo(f"snapcache: {record.levelname.lower()}: {record.getMessage()}", err=True)


def _configure_logging(ctx: typer.Context, verbose: bool) -> None:
    """Library warnings (a corrupt file skipped, a snapshot too large) reach stderr as one line each.

    The logger is put back as it was when the command ends, so that a host process is left untouched.
    """
    logger = logging.getLogger("snapcache")
    handler = _EchoHandler()
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logger.propagate = False

    def restore() -> None:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]

    ctx.call_on_close(restore)


app.command("warm")(warm.warm)
app.command("ls")(entries.list_entries)
app.command("inspect")(entries.inspect)
app.command("rm")(entries.remove)
app.command("prune")(entries.prune)
app.command("clear")(entries.clear)
app.command("stats")(entries.stats)
app.command("doctor")(doctor.doctor)
app.command("check")(check.check)
app.command("bench")(bench.bench)
app.command("serve")(serve.serve)
app.command("why")(why.why)
app.command("export")(bundle.export)
app.command("import")(bundle.import_)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="snapcache")
