"""Which model file the CLI uses, checking that it is a GGUF file, and loading it quietly."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .command_errors import CliError

if TYPE_CHECKING:
    from llama_cpp import Llama

MODEL_ENV = "SNAPCACHE_MODEL"
DEFAULT_N_CTX = 4096
_NO_MODEL = (
    "no model: pass --model PATH, set SNAPCACHE_MODEL=PATH, "
    "or install the demo model with `pip install 'snapcache[demo]'`"
)

# llama.cpp's own log lines go here instead of the terminal (shown with --verbose).
_llama_log = logging.getLogger("snapcache.cli.llama_cpp")


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """A model file and how it was chosen: `--model`, `SNAPCACHE_MODEL` or `demo model`."""

    path: Path
    source: str


def choose_model(option: str | None) -> ModelChoice:
    """The model from `--model`, else SNAPCACHE_MODEL, else the demo model; checked to be GGUF."""
    if option:
        choice = ModelChoice(Path(option).expanduser(), "--model")
    elif os.environ.get(MODEL_ENV):
        choice = ModelChoice(Path(os.environ[MODEL_ENV]).expanduser(), MODEL_ENV)
    else:
        from snapcache.admin import DEMO_MODEL_NAME, default_model_path

        path = default_model_path()
        if path is None:
            raise CliError(_NO_MODEL)
        choice = ModelChoice(path, f"demo model {DEMO_MODEL_NAME}")
    check_gguf(choice)
    return choice


def check_gguf(choice: ModelChoice) -> None:
    """CliError unless `choice.path` is a readable file that starts with the GGUF magic."""
    from snapcache import ModelError
    from snapcache.admin import check_gguf_file

    try:
        check_gguf_file(choice.path)
    except ModelError as exc:
        raise CliError(f"{exc} (from {choice.source})") from None


def load_llama(
    choice: ModelChoice,
    *,
    n_ctx: int | None = None,
    threads: int | None = None,
    verbose: bool = False,
    kv_cache: str | None = None,
    swa_cache: str | None = None,
    flash_attention: str | None = None,
    gpu_layers: int | None = None,
) -> Llama:
    """`snapcache.load_llama` of `choice`, with the --kv-cache, --swa-cache, --flash-attn and
    --gpu-layers every command shares (states are found only under the settings they were saved
    with); llama.cpp's log reaches the terminal only when `verbose`. `gpu_layers` None: every layer
    on the GPU of a build that has one (as llama-server does), none on the CPU's."""
    if gpu_layers is not None and gpu_layers < -1:
        raise CliError(f"--gpu-layers must be -1 (all), 0 (none) or a number of layers, got {gpu_layers}")
    if n_ctx is not None and n_ctx < 1:
        raise CliError(f"--n-ctx must be at least 1, got {n_ctx}")
    if threads is not None and threads < 1:
        raise CliError(f"--threads must be at least 1, got {threads}")
    quiet_llama_cpp()
    from snapcache import InvalidArgument, ModelError, load_llama
    from snapcache.admin import default_gpu_layers

    if gpu_layers is None:
        gpu_layers = default_gpu_layers()
    try:
        return load_llama(
            choice.path,
            n_ctx=n_ctx or DEFAULT_N_CTX,
            n_threads=threads,
            verbose=verbose,
            kv_cache=kv_cache,
            swa_cache=swa_cache,
            flash_attention=flash_attention,
            n_gpu_layers=gpu_layers,
        )
    except (ModelError, InvalidArgument) as exc:
        raise CliError(f"{exc} (run with -v to see llama.cpp's log)") from None


def quiet_llama_cpp() -> None:
    """Send llama.cpp's log lines to a Python logger, as debug lines: shown with --verbose only."""
    from snapcache.admin import route_llama_cpp_log

    route_llama_cpp_log(_llama_log, level=logging.DEBUG)
