"""The documentation site: it builds with `mkdocs build --strict`, documents every public name, and its
benchmark pages are written from the benchmarks' JSON results."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import snapcache

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "benchmarks"))

import _common  # noqa: E402
import write_reports  # noqa: E402

DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _require_mkdocs() -> None:
    missing = []
    for name in DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package of a dotted name is missing
            found = False
        if not found:
            missing.append(name)
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}): pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The site built once with --strict into a temporary folder, and the build's output."""
    _require_mkdocs()
    site = tmp_path_factory.mktemp("site")
    # Material prints a banner about MkDocs 2.0 on every build unless told not to.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return site, output


def test_site_builds_strict_without_warnings(built_site: tuple[Path, str]) -> None:
    site, output = built_site
    problems = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert problems == [], output
    for page in ("index.html", "getting-started/index.html", "reference/api/index.html",
                 "how-it-works/architecture/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page


def test_site_loads_nothing_from_other_hosts(built_site: tuple[Path, str]) -> None:
    site, _ = built_site
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis.com" not in home
    assert "fonts.gstatic.com" not in home


def test_api_page_renders_every_public_name(built_site: tuple[Path, str]) -> None:
    site, _ = built_site
    html = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for name in snapcache.__all__:
        assert f'id="snapcache.{name}"' in html, name
    # A docstring's own words, not just the heading.
    assert "found by exact key or by longest stored prefix of a prompt" in html


def test_every_generated_benchmark_page_is_in_the_navigation(built_site: tuple[Path, str]) -> None:
    site, _ = built_site
    nav = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    for page in write_reports.generated_pages(DOCS / "benchmarks"):
        assert (site / "benchmarks" / page.stem / "index.html").is_file(), page.name
        assert f'href="{page.stem}/"' in nav, page.name


def test_api_page_lists_exactly_the_public_names() -> None:
    text = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: snapcache\.(\w+)$", text, flags=re.MULTILINE)
    assert sorted(documented) == sorted(snapcache.__all__)


# -- benchmark pages from JSON results ----------------------------------------------------------------


def _result(tmp_path: Path, name: str, *, quick: bool, rows: list[list[str]]) -> Path:
    """A result written by _common.report itself, as a benchmark script writes it."""
    table = _common.Table("lookup latency (median)", ["prompt tokens", "snapcache", "note"])
    for row in rows:
        table.add(*row)
    table.notes.append("* extrapolated")
    path = tmp_path / "results" / f"{name}.json"
    _common.report(name, [table], path, quick=quick, extra={"model": "tiny llama", "rows": rows})
    return path


def test_a_result_becomes_a_page_with_its_machine_date_and_command(tmp_path: Path) -> None:
    result_path = _result(tmp_path, "lookup_scaling", quick=False, rows=[["512", "37.7 µs", "a|b"]])
    docs = tmp_path / "docs"
    written = write_reports.write_reports(result_path.parent, docs)
    assert written == [docs / "lookup_scaling.md"]
    result = json.loads(result_path.read_text(encoding="utf-8"))
    page = written[0].read_text(encoding="utf-8")
    assert page.startswith(write_reports.MARKER)
    assert "# lookup_scaling" in page
    assert f"| date | {result['created_at']} |" in page
    assert result["command"].startswith("python ")
    assert f"| command | `{result['command']}` |" in page
    assert f"| machine | {result['machine']['cpu_model']}, {result['machine']['cores']} cores usable" in page
    assert "| model | tiny llama |" in page
    assert "## lookup latency (median)" in page
    assert "| 512 | 37.7 µs | a\\|b |" in page  # a pipe in a cell does not split it
    assert "| --- | ---: | --- |" in page  # numbers right-aligned
    assert "- \\* extrapolated" in page
    assert "Quick run" not in page
    index = (docs / "index.md").read_text(encoding="utf-8")
    assert "[lookup_scaling](lookup_scaling.md)" in index
    assert result["created_at"] in index


def test_a_quick_run_is_labelled_and_never_replaces_a_full_one(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    quick = _result(tmp_path, "bench_store", quick=True, rows=[["1", "2 ms", ""]])
    write_reports.write_reports(quick.parent, docs)
    page = (docs / "bench_store.md").read_text(encoding="utf-8")
    assert '!!! warning "Quick run"' in page
    assert "| run | quick (`--quick`) |" in page

    full = _result(tmp_path, "bench_store", quick=False, rows=[["1", "3 ms", ""]])
    write_reports.write_reports(full.parent, docs)
    page = (docs / "bench_store.md").read_text(encoding="utf-8")
    assert "Quick run" not in page
    assert "| 1 | 3 ms |  |" in page

    _result(tmp_path, "bench_store", quick=True, rows=[["1", "9 ms", ""]])
    assert write_reports.write_reports(full.parent, docs) == []
    assert "| 1 | 3 ms |  |" in (docs / "bench_store.md").read_text(encoding="utf-8")


def test_pages_of_results_no_longer_present_are_kept_and_indexed(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    first = _result(tmp_path, "hot_path", quick=False, rows=[["x", "1 ms", ""]])
    write_reports.write_reports(first.parent, docs)
    first.unlink()
    second = _result(tmp_path, "bench_remote", quick=False, rows=[["y", "2 ms", ""]])
    write_reports.write_reports(second.parent, docs)
    assert [p.name for p in write_reports.generated_pages(docs)] == ["bench_remote.md", "hot_path.md"]
    index = (docs / "index.md").read_text(encoding="utf-8")
    assert "[hot_path](hot_path.md)" in index
    assert "[bench_remote](bench_remote.md)" in index


def test_a_result_of_another_shape_is_paged_with_what_it_lacks_said(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_codec.json").write_text(json.dumps({
        "cpu_count": 2,
        "codec": [{"state": "gemma f16 KV", "ratio": 1.159}, {"state": "gemma q8_0 KV", "ratio": 1.044}],
    }), encoding="utf-8")
    (results / "broken.json").write_text("{not json", encoding="utf-8")
    docs = tmp_path / "docs"
    written = write_reports.write_reports(results, docs)
    assert [p.name for p in written] == ["bench_codec.md"]
    page = written[0].read_text(encoding="utf-8")
    assert f"| date | {write_reports.NOT_RECORDED} |" in page
    assert f"| command | {write_reports.NOT_RECORDED} |" in page
    assert "## codec" in page
    assert "| gemma q8_0 KV | 1.044 |" in page


def test_the_command_line_is_recorded_relative_to_the_checkout() -> None:
    line = _common.command_line([str(ROOT / "benchmarks" / "hot_path.py"), "--json", "/elsewhere/x y.json"])
    assert line == "python benchmarks/hot_path.py --json '/elsewhere/x y.json'"


def test_run_all_writes_the_pages_of_its_results(tmp_path: Path) -> None:
    index = DOCS / "benchmarks" / "index.md"
    before = index.read_text(encoding="utf-8")
    results, pages = tmp_path / "results", tmp_path / "pages"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--only", "lookup_scaling",
         "--results", str(results), "--pages", str(pages)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (pages / "lookup_scaling.md").read_text(encoding="utf-8")
    assert '!!! warning "Quick run"' in page
    assert "| command | `python benchmarks/lookup_scaling.py --quick --json " in page
    assert "[lookup_scaling](lookup_scaling.md)" in (pages / "index.md").read_text(encoding="utf-8")
    # Results written elsewhere leave the published pages alone.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--only", "lookup_scaling",
         "--results", str(tmp_path / "other")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert index.read_text(encoding="utf-8") == before


def test_an_excerpt_quotes_a_results_table_where_its_markers_are(tmp_path: Path) -> None:
    result_path = _result(tmp_path, "lookup_scaling", quick=False, rows=[["512", "37.7 µs", "a"]])
    root = tmp_path / "repo"
    guide = root / "docs" / "guides" / "serving.md"
    guide.parent.mkdir(parents=True)
    stale = "| old | table |\n"
    guide.write_text(
        f"Before.\n<!-- excerpt: lookup_scaling columns=0,1 -->\n{stale}<!-- /excerpt -->\nAfter.\n"
        "<!-- excerpt: no_such_result -->\nkept\n<!-- /excerpt -->\n",
        encoding="utf-8",
    )
    changed = write_reports.write_excerpts(result_path.parent, root, root / "docs" / "benchmarks")
    assert changed == [guide]
    text = guide.read_text(encoding="utf-8")
    result = json.loads(result_path.read_text(encoding="utf-8"))
    assert stale not in text
    assert f"`{result['command']}`, {result['machine']['cpu_model']}" in text
    assert "([report](../benchmarks/lookup_scaling.md))" in text
    assert "| prompt tokens | snapcache |\n| --- | ---: |\n| 512 | 37.7 µs |\n<!-- /excerpt -->" in text
    assert text.startswith("Before.\n")
    assert "<!-- /excerpt -->\nAfter.\n" in text
    assert "no_such_result -->\nkept\n" in text  # without its result an excerpt stays as it was
    assert write_reports.write_excerpts(result_path.parent, root, root / "docs" / "benchmarks") == []
