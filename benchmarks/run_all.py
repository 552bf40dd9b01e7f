"""Run every benchmark script in this folder, print their tables and write their JSON into results/.

`python benchmarks/run_all.py` (what `make bench` runs) for the full run; `--quick` for a smoke run;
`--only NAME ...` to pick scripts. Each script runs in its own process, one after the other, so that
they do not compete for the cores. At the end write_reports.py turns the JSON results into the
documentation's benchmark pages (docs/benchmarks/); `--no-pages` skips that. Results written
elsewhere (`--results DIR`) make pages only where `--pages DIR` says.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import _common
import write_reports
from _common import BENCH_DIR, RESULTS_DIR, machine_line, make_parser

# Order: the quick store-level ones first, the model-driven ones last.
SCRIPTS = [
    "bench_codec.py",
    "bench_disk_hit.py",
    "bench_store.py",
    "lookup_scaling.py",
    "hot_path.py",
    "bench_restore.py",
    "agent_rotation.py",
    "serve_vs_peers.py",
]
# Scripts here that are not benchmarks.
NOT_BENCHMARKS = {"run_all.py", "write_reports.py"}


def _supports(script: Path, option: str) -> bool:
    """Whether `script` takes `option`: it names it, or builds its parser with _common.make_parser."""
    text = script.read_text(encoding="utf-8")
    return option in text or "make_parser(" in text


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scripts (e.g. hot_path)")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where the JSON files go")
    parser.add_argument("--pages", type=Path, metavar="DIR",
                        help="where the pages go (default: docs/benchmarks/ for the default --results)")
    parser.add_argument("--no-pages", action="store_true", help="write no benchmark pages")
    args = parser.parse_args(argv)

    wanted = {name.removesuffix(".py") for name in args.only} if args.only else None
    scripts = [BENCH_DIR / name for name in SCRIPTS if (BENCH_DIR / name).exists()]
    # Any other benchmark script someone adds later runs too, after the known ones.
    scripts += sorted(
        path for path in BENCH_DIR.glob("*.py")
        if not path.name.startswith("_") and path.name not in NOT_BENCHMARKS and path.name not in SCRIPTS
    )
    if wanted is not None:
        scripts = [path for path in scripts if path.stem in wanted]
    if not scripts:
        print("no benchmark scripts to run", file=sys.stderr)
        return 2

    print(machine_line())
    print(f"running {len(scripts)} benchmark(s){' (--quick)' if args.quick else ''}: "
          + ", ".join(path.stem for path in scripts))
    args.results.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    summary: list[tuple[str, str, float]] = []
    for script in scripts:
        command = [sys.executable, str(script)]
        if args.quick and _supports(script, "--quick"):
            command.append("--quick")
        json_path = args.results / f"{script.stem}.json"
        if _supports(script, "--json"):
            command += ["--json", str(json_path)]
        print(f"\n=== {script.name} ===", flush=True)
        started = time.perf_counter()
        proc = subprocess.run(command, check=False)  # its tables go straight to our stdout
        elapsed = time.perf_counter() - started
        status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        if proc.returncode != 0:
            failures.append(script.name)
        summary.append((script.name, status, elapsed))

    print("\n=== summary ===")
    width = max(len(name) for name, _, _ in summary)
    for name, status, elapsed in summary:
        print(f"{name.ljust(width)}  {status}  {elapsed:7.1f} s")
    shown = args.results.resolve()
    if shown.is_relative_to(_common.ROOT):
        shown = shown.relative_to(_common.ROOT)
    print(f"JSON results in {shown}")
    pages_dir = args.pages
    if pages_dir is None and args.results.resolve() == RESULTS_DIR.resolve():
        pages_dir = write_reports.DOCS_DIR
    if pages_dir is not None and not args.no_pages:
        pages = write_reports.write_reports(args.results, pages_dir)
        print(f"{len(pages)} benchmark page(s) written into {pages_dir}")
        if pages_dir == write_reports.DOCS_DIR:
            for path in write_reports.write_excerpts(args.results):
                print(f"excerpts written into {path.relative_to(_common.ROOT)}")
    return 1 if failures else 0


if __name__ == "__main__":
    _ = _common.ROOT
    sys.exit(main())
