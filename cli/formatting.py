"""Human-readable sizes, durations and plain-text tables, and parsers for the sizes users type."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse `500M`, `2G`, `1.5GiB` or a plain byte count; raise ValueError on anything else."""
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (examples: 500M, 2G, 1048576)")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.upper()])


def parse_age(text: str) -> float:
    """Parse `7d`, `12h`, `30m`, `45s` or `2w` into seconds; raise ValueError on anything else."""
    match = _AGE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an age: {text!r} (examples: 7d, 12h, 30m)")
    number, unit = match.groups()
    return float(number) * _AGE_UNITS[unit.lower()]


def format_size(nbytes: int) -> str:
    """1536 -> '1.5 KiB'; sizes below 1 KiB are shown in bytes."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """0.0036 -> '3.6 ms'; 3.52 -> '3.52 s'."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def format_age(timestamp: float, now: float | None = None) -> str:
    """How long ago `timestamp` was: '12s ago', '5m ago', '3h ago', '2d ago'."""
    elapsed = max(0.0, (time.time() if now is None else now) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if elapsed >= size:
            return f"{int(elapsed // size)}{unit} ago"
    return f"{int(elapsed)}s ago"


def format_time(timestamp: float) -> str:
    """A local timestamp as 'YYYY-MM-DD HH:MM:SS'."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; the columns numbered in `right` are right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def render_pairs(pairs: Sequence[tuple[str, str]]) -> str:
    """`name: value` lines with the values aligned."""
    width = max((len(name) for name, _ in pairs), default=0)
    return "\n".join(f"{name + ':':<{width + 1}} {value}" for name, value in pairs)
