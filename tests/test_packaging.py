"""The package list in pyproject.toml names every package of the tree, the CLI as snapcache_cli."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tree_packages() -> set[str]:
    found = {"snapcache", "snapcache_cli"}
    for top, name in ((ROOT / "snapcache", "snapcache"), (ROOT / "cli", "snapcache_cli")):
        for init in top.rglob("__init__.py"):
            relative = init.parent.relative_to(top)
            if relative.parts and "__pycache__" not in relative.parts:
                found.add(".".join((name, *relative.parts)))
    return found


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_pyproject_lists_every_package() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == _tree_packages()
    assert config["package-dir"] == {"snapcache_cli": "cli"}
