"""A progress bar on stderr while llama.cpp reads a prompt; silent when stderr is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ProgressCallback = Callable[[int, int], None]


@contextmanager
def prompt_progress(description: str) -> Iterator[ProgressCallback | None]:
    """Yield a `(tokens_done, tokens_total)` callback drawing a bar, or None when nobody would see it."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
