"""MkDocs hook: every generated benchmark report in docs/benchmarks/ goes into the navigation.

benchmarks/write_reports.py writes one page per JSON result; which pages exist depends on which
benchmarks have been run, so mkdocs.yml names only the section's index and the page of earlier
runs, and this hook puts the generated pages between them, in file-name order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SECTION = "Benchmark reports"
FIXED = ("benchmarks/index.md", "benchmarks/earlier-runs.md")


def on_config(config: Any) -> Any:
    """Fill the benchmark section of `nav` with the report pages found on disk."""
    reports_dir = Path(config["docs_dir"]) / "benchmarks"
    pages = (f"benchmarks/{path.name}" for path in reports_dir.glob("*.md"))
    reports = sorted(page for page in pages if page not in FIXED)
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and SECTION in entry:
            pages = entry[SECTION]
            earlier = [page for page in pages if _target(page) == FIXED[1]]
            kept = [page for page in pages if _target(page) != FIXED[1]]
            entry[SECTION] = kept + reports + earlier
    return config


def _target(page: Any) -> Any:
    """The file a nav entry points to (`"a.md"` or `{"Title": "a.md"}`)."""
    if isinstance(page, dict):
        return next(iter(page.values()))
    return page
