"""`snapcache export KEY... -o BUNDLE` and `snapcache import BUNDLE`: snapshots in one file, to ship."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..command_errors import CliError
from ..formatting import format_size, render_pairs
from ..model_source import choose_model, load_llama
from ..settings import settings_of
from .entries import SHORT_ID, JsonOption, resolve_key
from .warm import ExactOption, InexactOption, exactness

if TYPE_CHECKING:
    from snapcache.admin import ExportReport, ImportReport

ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="The GGUF model to restore into (default: $SNAPCACHE_MODEL, else the demo model).",
        show_default=False,
    ),
]


def export(
    ctx: typer.Context,
    keys: Annotated[list[str], typer.Argument(metavar="KEY", help="Key ids, or unique prefixes of them.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The bundle file to write.", show_default=False)
    ],
    as_json: JsonOption = False,
) -> None:
    """Write snapshots and the shared blocks they need to one file (with a MAC under $SNAPCACHE_SECRET)."""
    from snapcache import export_bundle

    if output.is_dir():
        raise CliError(f"--output {output} is a directory; name the bundle file")
    with settings_of(ctx).open_store() as store:
        entries = store.entries()
        chosen = [resolve_key(entries, text).key for text in keys]
        report = export_bundle(store, chosen, output)
    if as_json:
        typer.echo(json.dumps(_export_json(report), indent=2))
        return
    typer.echo(
        render_pairs(
            [
                ("bundle", str(report.path)),
                ("snapshots", ", ".join(key.id[:SHORT_ID] for key in report.snapshots)),
                ("shared blocks", str(report.blocks)),
                ("state", format_size(report.state_bytes)),
                ("file", format_size(report.file_bytes)),
                ("MAC", "yes (SNAPCACHE_SECRET)" if report.authenticated else "none (no secret set)"),
            ]
        )
    )


def import_(
    ctx: typer.Context,
    bundle: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A bundle written by `snapcache export`.")],
    model: ModelOption = None,
    as_json: JsonOption = False,
    exact: ExactOption = False,
    inexact: InexactOption = False,
) -> None:
    """Verify a bundle against the model and this llama.cpp, then store its snapshots."""
    from snapcache import import_bundle

    if not bundle.is_file():
        raise CliError(f"no bundle file at {bundle}")
    choice = choose_model(model)
    settings = settings_of(ctx)
    from snapcache import model_fingerprint
    from snapcache.admin import FingerprintNotes, choose_exactness

    asked = exactness(exact, inexact)
    with settings.open_store() as store:
        llm = load_llama(choice, verbose=settings.verbose, **settings.llama_options())
        try:
            # The states this model's cache would find: under the exactness it chooses here.
            chosen = choose_exactness(llm, asked, FingerprintNotes(store.directory))
            fingerprint = model_fingerprint(llm, exact=chosen.exact)
        finally:
            llm.close()
        report = import_bundle(store, bundle, fingerprint=fingerprint)
    if as_json:
        typer.echo(json.dumps(_import_json(report), indent=2))
        return
    typer.echo(
        render_pairs(
            [
                ("bundle", str(report.path)),
                ("snapshots", ", ".join(key.id[:SHORT_ID] for key in report.snapshots)),
                ("stored", f"{len(report.stored)} entries"),
                ("skipped", f"{len(report.skipped)} entries held already at that priority or higher"),
                ("dropped", f"{len(report.dropped)} entries the store did not keep"),
                ("MAC", "verified" if report.authenticated else "not checked (no secret set)"),
            ]
        )
    )


def _export_json(report: ExportReport) -> dict[str, Any]:
    return {
        "path": str(report.path),
        "snapshots": [key.id for key in report.snapshots],
        "blocks": report.blocks,
        "state_bytes": report.state_bytes,
        "file_bytes": report.file_bytes,
        "mac": report.authenticated,
    }


def _import_json(report: ImportReport) -> dict[str, Any]:
    return {
        "path": str(report.path),
        "snapshots": [key.id for key in report.snapshots],
        "stored": [key.id for key in report.stored],
        "skipped": [key.id for key in report.skipped],
        "dropped": [key.id for key in report.dropped],
        "model_fingerprints": list(report.model_fingerprints),
        "mac_verified": report.authenticated,
    }
