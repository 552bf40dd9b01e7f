"""Running the worker scripts of this folder as child processes of a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).resolve().parent
REPO = WORKERS.parents[1]


def worker_env() -> dict[str, str]:
    """The test's environment, with the repository importable (whether or not it is installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def worker_command(script: str, *args: object) -> list[str]:
    return [sys.executable, str(WORKERS / script), *(str(a) for a in args)]


def run_worker(script: str, *args: object, timeout: float = 300) -> dict[str, Any]:
    """Run a worker to completion; it must exit 0 and print one JSON line last."""
    proc = subprocess.run(
        worker_command(script, *args), capture_output=True, text=True, env=worker_env(), timeout=timeout
    )
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
