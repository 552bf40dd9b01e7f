"""Read the prompt a user hands the CLI: a UTF-8 text file, or standard input for `-`."""

from __future__ import annotations

import sys
from pathlib import Path

from .command_errors import CliError

# Far beyond any context window; stops a mistaken path (a model, an archive) being read into memory.
MAX_PROMPT_BYTES = 64 << 20


def read_prompt(source: str) -> str:
    """The text of `source` (`-` is standard input); CliError if missing, empty, binary or too large."""
    name = "standard input" if source == "-" else source
    data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1) if source == "-" else _read_file(Path(source))
    if len(data) > MAX_PROMPT_BYTES:
        raise CliError(f"{name} is larger than {MAX_PROMPT_BYTES >> 20} MiB: not a prompt")
    if b"\x00" in data:
        raise CliError(f"{name} looks like a binary file, not a text prompt")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CliError(f"{name} is not UTF-8 text (bad byte at offset {exc.start})") from None
    if not text.strip():
        raise CliError(f"{name} is empty")
    return text


def _read_file(path: Path) -> bytes:
    if not path.exists():
        raise CliError(f"prompt file not found: {path}")
    if path.is_dir():
        raise CliError(f"prompt file is a directory: {path}")
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_PROMPT_BYTES + 1)
    except PermissionError:
        raise CliError(f"cannot read prompt file (permission denied): {path}") from None
