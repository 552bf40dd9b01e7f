"""What every benchmark script shares: the machine line, aligned tables, timing, JSON, model loading."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
RESULTS_DIR = BENCH_DIR / "results"

# Measure the checked-out code, installed or not; tests/ holds the tiny model writer.
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

LLAMA_THREADS = 2


# -- the machine --------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        if package == "snapcache":
            import snapcache

            return f"{snapcache.__version__} (source tree)"
        return "not installed"


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, memory and the versions that shape the numbers."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    memory_gib = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {
        "cpu_model": _cpu_model(),
        "cores": usable,
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "llama_cpp_python": _version("llama-cpp-python"),
        "numpy": _version("numpy"),
        "zstandard": _version("zstandard"),
        "snapcache": _version("snapcache"),
    }


def machine_line(info: dict[str, Any] | None = None) -> str:
    info = info or machine_info()
    return (
        f"machine: {info['cpu_model']}, {info['cores']} cores, {info['memory_gib']} GiB RAM, "
        f"{info['os']}; Python {info['python']}, llama-cpp-python {info['llama_cpp_python']}"
    )


# -- tables -------------------------------------------------------------------------------------------


@dataclass
class Table:
    """A titled table of already formatted cells; numbers are right-aligned when printed."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def render(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))
        numeric = [
            all(_looks_numeric(row[i]) for row in self.rows) and bool(self.rows) for i in range(len(widths))
        ]

        def line(cells: Sequence[str]) -> str:
            out = []
            for i, cell in enumerate(cells):
                out.append(cell.rjust(widths[i]) if numeric[i] and i > 0 else cell.ljust(widths[i]))
            return "  ".join(out).rstrip()

        parts = [self.title, line(self.columns), "  ".join("-" * w for w in widths)]
        parts.extend(line(row) for row in self.rows)
        parts.extend(f"  {note}" for note in self.notes)
        return "\n".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "notes": self.notes}


def _looks_numeric(cell: str) -> bool:
    text = cell.strip().lstrip("~<>≥≤").rstrip("*").rstrip("x%").replace(",", "").replace(" ", "")
    for unit in ("ms", "µs", "us", "ns", "s", "MB", "KB", "GB", "MiB", "KiB", "GiB", "B"):
        if text.endswith(unit):
            text = text[: -len(unit)]
            break
    try:
        float(text)
    except ValueError:
        return cell.strip() in ("-", "n/a")
    return True


# -- formatting ---------------------------------------------------------------------------------------


def fmt_seconds(seconds: float | None) -> str:
    """A duration with a unit that keeps three significant digits."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def fmt_ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return "-"
    ratio = numerator / denominator
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


# -- timing -------------------------------------------------------------------------------------------


def time_call(fn: Callable[[], object], *, min_time: float = 0.2, max_iterations: int = 1000,
              min_iterations: int = 3) -> tuple[float, int]:
    """Median seconds per call of `fn` over at least `min_iterations` and about `min_time` seconds."""
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_iterations:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= min_iterations and time.perf_counter() - started >= min_time:
            break
    return statistics.median(samples), len(samples)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# -- command line and results -------------------------------------------------------------------------


def make_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the results as JSON to PATH")
    parser.add_argument("--quick", action="store_true", help="small sizes and the tiny model: a smoke run")
    return parser


def command_line(argv: Sequence[str] | None = None) -> str:
    """This process's command line as a reader would type it: paths in this checkout made relative."""
    parts = ["python"]
    for arg in sys.argv if argv is None else argv:
        path = Path(arg)
        if path.is_absolute() and path.resolve().is_relative_to(ROOT):
            arg = str(path.resolve().relative_to(ROOT))
        parts.append(shlex.quote(arg))
    return " ".join(parts)


def report(name: str, tables: Sequence[Table], json_path: Path | None, *, quick: bool,
           extra: dict[str, Any] | None = None) -> None:
    """Print the machine line and the tables; write them as JSON to `json_path` if given."""
    info = machine_info()
    print(machine_line(info))
    for table in tables:
        print()
        print(table.render())
    sys.stdout.flush()
    if json_path is not None:
        payload: dict[str, Any] = {
            "benchmark": name,
            "quick": quick,
            "machine": info,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command_line(),
            "tables": [table.as_json() for table in tables],
        }
        if extra:
            payload.update(extra)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# -- models -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    name: str
    is_tiny: bool


def choose_model(quick: bool, workdir: Path) -> ModelChoice:
    """Gemma-3-270M for a full run; the tiny test model for --quick or when Gemma is not installed."""
    if not quick:
        from snapcache.llama.setup.demo_model import DEMO_MODEL_NAME, default_model_path

        path = default_model_path()
        if path is not None:
            return ModelChoice(Path(path), DEMO_MODEL_NAME, is_tiny=False)
        print(f"note: {DEMO_MODEL_NAME} is not installed (pip install 'snapcache[demo]'); "
              "using the tiny test model", file=sys.stderr)
    from tiny_model import write_tiny_llama

    path = workdir / "tiny-llama-0.gguf"
    if not path.exists():
        write_tiny_llama(path, seed=0)
    return ModelChoice(path, "tiny llama (2 layers, 64 wide, random weights)", is_tiny=True)


def cold_read_seconds(llm: Any, tokens: list[int]) -> float:
    """Seconds `llm` takes to read `tokens` from an empty context (its `eval`, nothing sampled)."""
    llm.reset()
    started = time.perf_counter()
    llm.eval(tokens)
    return time.perf_counter() - started


def new_llama(model_path: Path, n_ctx: int, **kwargs: Any) -> Any:
    """A quiet Llama on the benchmark's thread count, via load_llama (Gemma 3 template if needed)."""
    from snapcache import load_llama

    kwargs.setdefault("n_threads_batch", LLAMA_THREADS)
    return load_llama(model_path, n_ctx=n_ctx, n_threads=kwargs.pop("n_threads", LLAMA_THREADS), **kwargs)


def gguf_with_chat_template(source: Path, target: Path, template: str) -> Path:
    """A copy of the GGUF `source` at `target` whose `tokenizer.chat_template` is `template`.

    Every key-value pair and tensor is copied as it is (any chat template replaced); written beside
    `target` and renamed into place, and kept when `target` already holds that template.
    """
    import gguf

    if target.exists():
        field = gguf.GGUFReader(str(target)).get_field(gguf.Keys.Tokenizer.CHAT_TEMPLATE)
        if field is not None and field.contents() == template:
            return target
    reader = gguf.GGUFReader(str(source))
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if architecture is None:
        raise ValueError(f"{source} has no {gguf.Keys.General.ARCHITECTURE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(partial), architecture.contents(), endianess=reader.endianess)
    try:
        for field in reader.fields.values():
            # The writer adds the architecture and the GGUF.* header fields itself.
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            if field.name.startswith(gguf.Keys.Tokenizer.CHAT_TEMPLATE):
                continue
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
        writer.add_chat_template(template)
        for tensor in reader.tensors:
            writer.add_tensor_info(
                tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in reader.tensors:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
        writer.close()
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def tiny_model(workdir: Path) -> ModelChoice:
    """The test suite's tiny llama (2 layers, 64 wide, random weights), written into `workdir` once."""
    from tiny_model import write_tiny_llama

    path = workdir / "tiny-llama-0.gguf"
    if not path.exists():
        write_tiny_llama(path, seed=0)
    return ModelChoice(path, "tiny llama (2 layers, 64 wide, random weights)", is_tiny=True)


def geometry_model(workdir: Path, n_layers: int = 32) -> ModelChoice:
    """A random llama with an 8B model's KV geometry (32 layers x 8 K/V heads x 128), 256 wide.

    Fewer `n_layers` make states of the same layout, smaller (a smoke run).
    """
    from tiny_model import write_geometry_model

    path = workdir / f"geometry-llama-{n_layers}-0.gguf"
    if not path.exists():
        write_geometry_model(path, n_layers=n_layers, seed=0)
    kind = "8B KV geometry" if n_layers == 32 else "8B KV geometry, fewer layers"
    return ModelChoice(path, f"{kind} ({n_layers} layers x 8 KV heads x 128, 256 wide)", is_tiny=True)


# -- prompts and stores -------------------------------------------------------------------------------


def prompt_paragraphs() -> list[str]:
    """The paragraphs of benchmarks/prompts/*.txt, in a fixed order: deterministic text to build on."""
    paragraphs: list[str] = []
    for path in sorted((BENCH_DIR / "prompts").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        paragraphs.extend(p.strip() for p in text.split("\n\n") if p.strip())
    return paragraphs


def text_of_tokens(
    llm: Any, pieces: Sequence[str], n_tokens: int, *, start: int = 0, sep: str = "\n\n"
) -> str:
    """`pieces` from `start` on (cycling), joined by `sep` and cut to about `n_tokens` tokens of `llm`."""
    if not pieces:
        raise ValueError("no text to build a prompt from")
    chosen: list[str] = []
    i = start
    while True:
        chosen.append(pieces[i % len(pieces)])
        i += 1
        tokens = llm.tokenize(sep.join(chosen).encode("utf-8"), add_bos=False, special=False)
        if len(tokens) >= n_tokens:
            text: str = llm.detokenize(tokens[:n_tokens]).decode("utf-8", errors="ignore")
            return text


def directory_bytes(path: Path) -> int:
    """The sizes of every regular file under `path` added up (0 when it does not exist)."""
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def first_token_seconds(stream: Any) -> tuple[float, str]:
    """Drain a streamed completion (chat or raw); seconds to its first chunk and the text it gave."""
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    for chunk in stream:
        if first is None:
            first = time.perf_counter() - started
        choice = chunk["choices"][0]
        parts.append((choice["delta"].get("content") if "delta" in choice else choice.get("text")) or "")
    return (time.perf_counter() - started if first is None else first), "".join(parts)


def all_at_once(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Each call on its own thread, all started together; their results in order. The first failure
    is raised as a RuntimeError once every call has ended."""
    results: list[T | BaseException | None] = [None] * len(calls)

    def one(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as exc:  # reported below, after every call has ended
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise RuntimeError(f"a request failed: {result!r}")
    return results  # type: ignore[return-value]  # every entry is a T once no call failed
