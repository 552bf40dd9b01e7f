"""The face for tools that run snapcache (`snapcache.admin`): every name it lists resolves, and
importing it loads no llama.cpp."""

from __future__ import annotations

import subprocess
import sys

import pytest

import snapcache.admin


@pytest.mark.parametrize("name", snapcache.admin.__all__)
def test_every_name_resolves(name: str) -> None:
    assert getattr(snapcache.admin, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'StoredStates'"):
        _ = snapcache.admin.StoredStates


def test_importing_it_loads_no_llama_cpp() -> None:
    """A command that never loads a model (ls, rm, stats) must not pay for llama_cpp's import."""
    code = "import sys, snapcache.admin; print('llama_cpp' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
