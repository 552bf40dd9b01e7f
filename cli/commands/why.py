"""`snapcache why PROMPT_FILE`: what the cache holds for a prompt, and why the rest would be read."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from snapcache import DEFAULT_SCOPE

from ..formatting import render_pairs
from ..model_source import choose_model, load_llama
from ..prompt_file import read_prompt
from ..settings import settings_of
from .warm import (
    ExactOption,
    InexactOption,
    ModelOption,
    NCtxOption,
    PromptArgument,
    RawOption,
    ThreadsOption,
    check_fits,
    exactness,
)

if TYPE_CHECKING:
    from snapcache import MissExplanation

SHORT_ID = 12


def why(
    ctx: typer.Context,
    prompt_file: PromptArgument,
    model: ModelOption = None,
    scope: Annotated[str, typer.Option("--scope", "-s", help="Look in this scope.")] = DEFAULT_SCOPE,
    raw: RawOption = False,
    n_ctx: NCtxOption = None,
    threads: ThreadsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    exact: ExactOption = False,
    inexact: InexactOption = False,
) -> None:
    """Say how much of PROMPT_FILE the cache would restore, and why not more."""
    text = read_prompt(prompt_file)
    asked = exactness(exact, inexact)
    choice = choose_model(model)
    settings = settings_of(ctx)
    from snapcache import CachedLlama

    with settings.open_store() as store:
        llm = load_llama(
            choice, n_ctx=n_ctx, threads=threads, verbose=settings.verbose, **settings.llama_options()
        )
        try:
            check_fits(llm, text)
            cached = CachedLlama(llm, store, scope=scope, save=False, exact=asked)
            explanation = cached.explain_prompt(text, raw=raw)
        finally:
            llm.close()
    if as_json:
        typer.echo(json.dumps({**explanation.as_json(), "exactness": cached.exactness.as_dict()}, indent=2))
        return
    typer.echo(render_pairs([*_lines(explanation), ("restores", cached.exactness.describe())]))


def _lines(e: MissExplanation) -> list[tuple[str, str]]:
    lines = [
        ("scope", e.scope),
        ("prompt", f"{e.prompt_tokens} tokens"),
        ("restorable", f"{e.restored_tokens} tokens"),
    ]
    if e.closest is not None:
        lines.append(
            (
                "closest",
                f"{e.closest.id[:SHORT_ID]} ({e.closest.token_count} tokens, {e.matched_tokens} shared)",
            )
        )
    if e.diverged_at is not None:
        lines += [
            ("diverges at", f"token {e.diverged_at}"),
            ("  prompt", repr(e.text_before + "|" + e.prompt_text)),
            ("  stored", repr(e.text_before + "|" + e.stored_text)),
        ]
    if e.other_fingerprints:
        others = ", ".join(f[:SHORT_ID] for f in e.other_fingerprints)
        differs = f"; differs in {', '.join(e.differing_parts)}" if e.differing_parts else ""
        lines.append(("other models", others + differs))
    lines.append(("why", e.reason))
    return lines
