"""`snapcache check`: compare the cache's index with its files, and repair what is broken."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..formatting import render_pairs
from ..settings import settings_of
from .entries import SHORT_ID


def check(
    ctx: typer.Context,
    repair: Annotated[
        bool, typer.Option("--repair", help="Remove what is broken or left over; keep the rest.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option("--verify/--no-verify", help="Read and verify every snapshot file (the default)."),
    ] = True,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0.0,
            help="Seconds a temporary or unindexed file is left to a writer that may still own it "
            "(default: the library's, 10 minutes).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Check the index against the files (missing, orphan, temporary and corrupt files).

    Exit status 1 when problems remain: found without --repair, or not repaired.
    """
    with settings_of(ctx).open_store() as store:
        report = store.check(repair=repair, verify=verify, grace_seconds=grace)
        directory = store.directory
    left = 0 if report.repaired else report.problems
    if as_json:
        payload = {
            "cache_dir": str(directory),
            "entries": report.entries,
            "verified": verify,
            "missing_files": list(report.missing_files),
            "orphan_files": list(report.orphan_files),
            "temp_files": list(report.temp_files),
            "corrupt_files": list(report.corrupt_files),
            "unauthenticated_files": list(report.unauthenticated_files),
            "problems": report.problems,
            "repaired": report.repaired,
            "problems_left": left,
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        pairs = [
            ("cache directory", str(directory)),
            ("indexed", f"{report.entries} snapshot{'s' if report.entries != 1 else ''}"),
            ("files verified", "all" if verify else "no (--no-verify)"),
            ("missing files", _listed(report.missing_files)),
            ("orphan files", _listed(report.orphan_files)),
            ("temporary files", _listed(report.temp_files)),
            ("corrupt files", _listed(report.corrupt_files) if verify else "-"),
        ]
        if report.unauthenticated_files:
            pairs.append(("other secret", f"{_listed(report.unauthenticated_files)} (kept)"))
        typer.echo(render_pairs(pairs))
        if report.ok:
            typer.echo("ok: the index and the files agree")
        elif report.repaired:
            typer.echo(f"repaired {report.problems} problem{'s' if report.problems != 1 else ''}")
        else:
            typer.echo(
                f"{report.problems} problem{'s' if report.problems != 1 else ''} found; "
                "`snapcache check --repair` removes them"
            )
    if left:
        raise typer.Exit(1)


def _listed(names: tuple[str, ...], shown: int = 3) -> str:
    """A count and the first few names, shortened as `snapcache ls` shortens key ids."""
    if not names:
        return "0"
    short = [name if name.startswith(".") else name[:SHORT_ID] for name in names[:shown]]
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} ({', '.join(short)}{more})"
