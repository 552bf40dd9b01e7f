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

from .commands import bench, bundle, check, doctor, entries, serve, warm, why
from .errors import describe
from .settings import Settings

DEBUG_ENV = "SNAPCACHE_DEBUG"


class _CleanErrors(TyperGroup):
    """Every command runs inside this: a failure is one line on stderr and a non-zero exit status."""

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


app = typer.Typer(
    cls=_CleanErrors,
    name="snapcache",
    help="Save and restore the llama.cpp state of prompts a local model has already read.",
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
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Save and restore the llama.cpp state of prompts a local model has already read."""
    _configure_logging(ctx, verbose)
    ctx.obj = Settings(cache_dir=cache_dir, verbose=verbose, remote=remote)


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
