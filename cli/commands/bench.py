"""`snapcache bench PROMPT_FILE`: time to first token with and without a snapshot, on your model."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ..formatting import format_duration, render_pairs
from ..model_source import choose_model, load_llama
from ..prompt_file import read_prompt
from ..settings import settings_of
from .warm import (
    ModelOption,
    NCtxOption,
    PromptArgument,
    RawOption,
    ThreadsOption,
    check_fits,
)

if TYPE_CHECKING:
    from llama_cpp import Llama

    from snapcache import CachedLlama

T = TypeVar("T")
DEFAULT_QUESTION = "In one sentence, what is this about?"
_SCOPE = "bench"


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Cold and warm time to first token, and whether greedy outputs agreed."""

    prompt_tokens: int
    restored_tokens: int
    cold_ttft_s: float
    warm_ttft_s: float
    speedup: float
    warm_store_s: float
    outputs_match: bool
    cold_output: str
    warm_output: str


def bench(
    ctx: typer.Context,
    prompt_file: PromptArgument,
    model: ModelOption = None,
    question: Annotated[
        str, typer.Option("--question", "-q", help="The user turn asked after the system prompt.")
    ] = DEFAULT_QUESTION,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Tokens generated to compare the outputs.", min=1)
    ] = 32,
    raw: RawOption = False,
    n_ctx: NCtxOption = None,
    threads: ThreadsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Time to first token cold and warm (from a snapshot file), outputs compared; your cache is untouched."""
    text = read_prompt(prompt_file)
    choice = choose_model(model)
    settings = settings_of(ctx)
    llm = load_llama(
        choice, n_ctx=n_ctx, threads=threads, verbose=settings.verbose, **settings.llama_options()
    )
    try:
        check_fits(llm, text)
        with tempfile.TemporaryDirectory(prefix="snapcache-bench-") as directory:
            result = _run(llm, Path(directory), text, question, max_tokens, raw)
    finally:
        llm.close()
    if as_json:
        typer.echo(json.dumps(asdict(result) | {"model": str(choice.path)}, indent=2))
        return
    typer.echo(
        render_pairs(
            [
                ("model", choice.path.name),
                (
                    "prompt",
                    f"{result.prompt_tokens} tokens, {result.restored_tokens} restored from the snapshot",
                ),
                ("cold TTFT", format_duration(result.cold_ttft_s)),
                ("warm TTFT", format_duration(result.warm_ttft_s)),
                ("speedup", f"{result.speedup:.1f}x"),
                ("outputs", "identical" if result.outputs_match else "DIFFERENT"),
            ]
        )
    )
    if not result.outputs_match:
        typer.echo(f"cold: {result.cold_output!r}\nwarm: {result.warm_output!r}")


def _run(llm: Llama, directory: Path, text: str, question: str, max_tokens: int, raw: bool) -> BenchResult:
    from snapcache import CachedLlama, SnapshotStore

    # One short completion first, so that neither timing pays for llama.cpp's first-use setup.
    _fresh(llm, lambda: _ask(llm, "Hello", "", 1, raw=True))
    # Cold: nothing cached; llama.cpp reads the whole prompt.
    cold_ttft = _timed(llm, lambda: _ask(llm, text, question, 1, raw))
    cold_output = _fresh(llm, lambda: _ask(llm, text, question, max_tokens, raw))
    with SnapshotStore(directory, disk_bytes=None) as store:
        warm_store = _timed(llm, lambda: CachedLlama(llm, store, scope=_SCOPE).warm(text, raw=raw))
    # Warm: a new store on the same directory, so the snapshot comes from its file as after a restart.
    # save=False: the timing is restore plus the rest of the prompt, not the saving of a new state.
    with SnapshotStore(directory, disk_bytes=None) as store:
        cached = CachedLlama(llm, store, scope=_SCOPE, save=False)
        warm_ttft = _timed(llm, lambda: _ask(cached, text, question, 1, raw))
        restore = cached.last_restore
        warm_output = _fresh(llm, lambda: _ask(cached, text, question, max_tokens, raw))
    return BenchResult(
        prompt_tokens=0 if restore is None else restore.prompt_tokens,
        restored_tokens=0 if restore is None else restore.restored_tokens,
        cold_ttft_s=cold_ttft,
        warm_ttft_s=warm_ttft,
        speedup=cold_ttft / warm_ttft if warm_ttft > 0 else float("inf"),
        warm_store_s=warm_store,
        outputs_match=cold_output == warm_output,
        cold_output=cold_output,
        warm_output=warm_output,
    )


def _ask(model: Llama | CachedLlama, text: str, question: str, max_tokens: int, raw: bool) -> str:
    """Greedy completion of the prompt (and question); returns the generated text."""
    if raw:
        completion: Any = model.create_completion(text + question, max_tokens=max_tokens, temperature=0.0)
        return str(completion["choices"][0]["text"])
    messages: Any = [{"role": "system", "content": text}, {"role": "user", "content": question}]
    chat: Any = model.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0)
    return str(chat["choices"][0]["message"]["content"] or "")


def _fresh(llm: Llama, call: Callable[[], T]) -> T:
    """Run `call` on an emptied context: llama-cpp-python would otherwise reuse the prompt it holds."""
    reset: Any = llm.reset  # untyped in llama-cpp-python
    reset()
    return call()


def _timed(llm: Llama, call: Callable[[], object]) -> float:
    """Seconds `call` takes on an emptied context."""
    started = time.perf_counter()
    _fresh(llm, call)
    return time.perf_counter() - started
