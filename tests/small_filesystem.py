"""A small real filesystem for full-disk tests: tmpfs, else a loop-mounted ext4 image (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


@contextmanager
def mounted(tmp_path: Path, size_bytes: int) -> Iterator[Path]:
    """A fresh filesystem of `size_bytes` mounted under `tmp_path`; skips the test where none can be."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root and mount(8)")
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    if not _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(mount_point)):
        image = tmp_path / "fs.img"
        with open(image, "wb") as file:
            file.truncate(size_bytes)
        if not (
            _run("mkfs.ext4", "-q", "-F", str(image))
            and _run("mount", "-o", "loop", str(image), str(mount_point))
        ):
            pytest.skip("neither a tmpfs nor a loop-mounted ext4 image could be mounted here")
    try:
        yield mount_point
    finally:
        _run("umount", "-l", str(mount_point))
