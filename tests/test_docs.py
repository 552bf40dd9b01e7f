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
from xml.etree import ElementTree

import pytest

import snapcache

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "benchmarks"))

import _charts  # noqa: E402
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
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return site, output


def test_site_builds_strict_without_warnings(built_site: tuple[Path, str]) -> None:
    site, output = built_site
    problems = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert problems == [], output
    for page in (
        "index.html",
        "getting-started/index.html",
        "reference/api/index.html",
        "how-it-works/architecture/index.html",
        "benchmarks/index.html",
    ):
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
    (results / "bench_codec.json").write_text(
        json.dumps(
            {
                "cpu_count": 2,
                "codec": [
                    {"state": "gemma f16 KV", "ratio": 1.159},
                    {"state": "gemma q8_0 KV", "ratio": 1.044},
                ],
            }
        ),
        encoding="utf-8",
    )
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
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run_all.py"),
            "--quick",
            "--only",
            "lookup_scaling",
            "--results",
            str(results),
            "--pages",
            str(pages),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (pages / "lookup_scaling.md").read_text(encoding="utf-8")
    assert '!!! warning "Quick run"' in page
    assert "| command | `python benchmarks/lookup_scaling.py --quick --json " in page
    assert "[lookup_scaling](lookup_scaling.md)" in (pages / "index.md").read_text(encoding="utf-8")
    # Results written elsewhere leave the published pages alone.
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run_all.py"),
            "--quick",
            "--only",
            "lookup_scaling",
            "--results",
            str(tmp_path / "other"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
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


# -- charts beside the tables -------------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"


def _bars(svg_path: Path) -> dict[str, float]:
    """The bars of a chart written by _charts: each bar's tooltip ("row: series = value") -> its width."""
    root = ElementTree.fromstring(svg_path.read_text(encoding="utf-8"))
    bars = {}
    for rect in root.iter(f"{SVG}rect"):
        if rect.get("class") == "bar":
            tip = rect.find(f"{SVG}title")
            assert tip is not None
            assert tip.text
            bars[tip.text] = float(rect.get("width", "nan"))
    return bars


def test_a_table_of_times_gets_a_chart_whose_bars_follow_the_values(tmp_path: Path) -> None:
    table = _common.Table("restore time (median)", ["case", "restore", "kept", "backend"])
    table.add("one", "1.00 s", "yes", "RAM")
    table.add("two", "2.00 s", "no", "disk")
    table.add("half", "500 ms", "yes", "RAM")
    table.add("fast", "250 ms", "yes", "RAM")
    path = tmp_path / "results" / "bench_restore.json"
    _common.report("bench_restore", [table], path, quick=False)
    docs = tmp_path / "docs"
    write_reports.write_reports(path.parent, docs)
    page = (docs / "bench_restore.md").read_text(encoding="utf-8")
    # The image comes right after its table, its alt text naming the table and the series.
    assert (
        "| fast | 250 ms | yes | RAM |\n\n![Bar chart of restore time (median): restore (s), by case]"
        "(bench_restore-1.svg)\n" in page
    )
    bars = _bars(docs / "bench_restore-1.svg")
    assert set(bars) == {
        "one: restore = 1.00 s",
        "two: restore = 2.00 s",
        "half: restore = 500 ms",
        "fast: restore = 250 ms",
    }
    one = bars["one: restore = 1.00 s"]
    assert one > 0
    assert bars["two: restore = 2.00 s"] == pytest.approx(2 * one, rel=1e-3)
    assert bars["half: restore = 500 ms"] == pytest.approx(one / 2, rel=1e-3)  # ms and s on one axis
    assert bars["fast: restore = 250 ms"] == pytest.approx(one / 4, rel=1e-3)
    svg = (docs / "bench_restore-1.svg").read_text(encoding="utf-8")
    assert "RAM" not in svg  # text columns are not plotted
    assert "kept" not in svg


def test_a_chart_groups_series_by_unit_and_splits_two_value_cells() -> None:
    chart = _charts.table_chart(
        "burst",
        ["server", "first / last token", "size", "tokens/s", "speed-up", "target", "threads"],
        [
            ["a", "500 ms / 2.00 s", "128 MiB", "40.0", "2.4x met", "≤ 1 ms", "2"],
            ["b", "1.50 s / 3.00 s", "1.0 GiB", "80.0", "1.2x missed", "≤ 1 ms", "2"],
            ["c", "- / 4.00 s", "-", "-", "-", "<1 ms", "2"],
        ],
    )
    assert chart is not None
    assert chart.alt == (
        "Bar chart of burst: first / last token (left of /) and first / last token (right of /) (s); "
        "size (GiB); tokens/s; speed-up (x), by server"
    )
    root = ElementTree.fromstring(chart.svg)
    tips = [t.text for r in root.iter(f"{SVG}rect") if r.get("class") == "bar" for t in r.iter(f"{SVG}title")]
    assert "a: first / last token (left of /) = 500 ms" in tips
    assert "c: first / last token (right of /) = 4.00 s" in tips
    assert not any(t and t.startswith("c: first / last token (left") for t in tips)  # "-" has no bar
    assert "b: speed-up = 1.2x" in tips
    assert not any("target" in (t or "") or "threads" in (t or "") for t in tips)  # bounds, one setting


@pytest.mark.parametrize(
    ("cell", "kind", "base"),
    [
        ("894 ms", "time", 0.894),
        ("1.80 s", "time", 1.8),
        ("2.3 min", "time", 138.0),
        ("37.7 µs", "time", 37.7e-6),
        ("~3.1 s", "time", 3.1),
        ("128 MiB", "size", 128 * 2**20),
        ("1.2 GiB", "size", 1.2 * 2**30),
        ("998.9 KiB", "size", 998.9 * 2**10),
        ("3.5 GB/s", "rate", 3.5e9),
        ("2.4x", "ratio", 2.4),
        ("13.33\u00d7", "ratio", 13.33),  # a multiplication sign, as the README writes ratios
        ("1.68x missed", "ratio", 1.68),
        ("12%", "percent", 12.0),
        ("1,024", "number", 1024.0),
        ("86.4", "number", 86.4),
        ("12.4 ms*", "time", 0.0124),
    ],
)
def test_units_are_parsed(cell: str, kind: str, base: float) -> None:
    value = _charts.parse_value(cell)
    assert value is not None
    assert value.kind == kind
    assert value.base == pytest.approx(base)


@pytest.mark.parametrize("cell", ["-", "", "yes", "n/a", "<1 ms", "≤ 1 ms", "3 of 4", "10 tokens", "f16"])
def test_cells_that_are_not_measurements_are_not_parsed(cell: str) -> None:
    assert _charts.parse_value(cell) is None


def test_a_plain_number_takes_the_rate_its_header_names() -> None:
    value = _charts.parse_value("4.77", "state GB/s")
    assert value is not None
    assert (value.kind, value.base) == ("rate", pytest.approx(4.77e9))
    tokens = _charts.parse_value("54.6", "tokens/s, 1 sequence")
    assert tokens is not None
    assert tokens.kind == "tokens/s"


def test_a_table_with_no_numbers_gets_no_chart(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    path = _result(tmp_path, "hot_path", quick=False, rows=[["x", "1 ms", ""], ["y", "2 ms", ""]])
    write_reports.write_reports(path.parent, docs)
    assert (docs / "hot_path-1.svg").exists()
    # A new run of the same benchmark whose table holds only text: no chart, and the old one goes.
    table = _common.Table("exactness", ["--kv-cache", "flash attention", "restored = cold"])
    table.add("f16", "no", "yes")
    table.add("q8_0", "yes", "3 of 4")
    _common.report("hot_path", [table], path, quick=False)
    write_reports.write_reports(path.parent, docs)
    page = (docs / "hot_path.md").read_text(encoding="utf-8")
    assert "![" not in page
    assert list(docs.glob("*.svg")) == []
    assert _charts.table_chart("settings", ["what", "value"], [["threads", "2"], ["cores", "2"]]) is None


def test_every_published_chart_is_in_the_site(built_site: tuple[Path, str]) -> None:
    site, _ = built_site
    charts = sorted((DOCS / "benchmarks").glob("*.svg"))
    assert charts, "the generated pages show their tables' charts"
    for chart in charts:
        assert (site / "benchmarks" / chart.name).is_file(), chart.name
        stem = chart.name.rsplit("-", 1)[0]
        html = (site / "benchmarks" / stem / "index.html").read_text(encoding="utf-8")
        assert f'src="../{chart.name}"' in html, chart.name
