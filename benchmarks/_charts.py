"""A bar chart of a report table, as a small SVG written in plain Python.

The first column of a table names the rows; every other column whose cells are measurements (times,
sizes, rates, ratios, percentages or plain numbers) is a series. Series of one kind share a panel and
an axis, in one unit: the largest unit the cells themselves use that the largest value reaches. Text
columns, bounds ("≤ 1 ms", "<1 ms": not measured values) and columns of one repeated value (a setting
of the run, not a result) are left out. A cell of two values ("595 ms / 3.09 s") gives two series.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from html import escape

# unit -> (kind, factor to the kind's base unit, name shown); the kinds' base units are s, B, B/s.
UNITS: dict[str, tuple[str, float, str]] = {
    "ns": ("time", 1e-9, "ns"),
    "µs": ("time", 1e-6, "µs"),
    "\u03bcs": ("time", 1e-6, "µs"),  # a Greek mu, where "µs" above is the micro sign
    "us": ("time", 1e-6, "µs"),
    "ms": ("time", 1e-3, "ms"),
    "s": ("time", 1.0, "s"),
    "min": ("time", 60.0, "min"),
    "h": ("time", 3600.0, "h"),
    "B": ("size", 1.0, "B"),
    "KB": ("size", 1e3, "KB"),
    "MB": ("size", 1e6, "MB"),
    "GB": ("size", 1e9, "GB"),
    "TB": ("size", 1e12, "TB"),
    "KiB": ("size", 2.0**10, "KiB"),
    "MiB": ("size", 2.0**20, "MiB"),
    "GiB": ("size", 2.0**30, "GiB"),
    "TiB": ("size", 2.0**40, "TiB"),
    "B/s": ("rate", 1.0, "B/s"),
    "KB/s": ("rate", 1e3, "KB/s"),
    "MB/s": ("rate", 1e6, "MB/s"),
    "GB/s": ("rate", 1e9, "GB/s"),
    "KiB/s": ("rate", 2.0**10, "KiB/s"),
    "MiB/s": ("rate", 2.0**20, "MiB/s"),
    "GiB/s": ("rate", 2.0**30, "GiB/s"),
    "tokens/s": ("tokens/s", 1.0, "tokens/s"),
    "tok/s": ("tokens/s", 1.0, "tokens/s"),
    "x": ("ratio", 1.0, "x"),
    "\u00d7": ("ratio", 1.0, "x"),  # a multiplication sign
    "%": ("percent", 1.0, "%"),
    "": ("number", 1.0, ""),
}
KIND_NAMES = {"time": "time", "size": "size", "rate": "rate", "ratio": "ratio", "percent": "percent",
              "number": "numbers"}
MISSING = {"", "-", "\u2013", "\u2014", "n/a", "na", "none", "?"}  # nothing, a dash, an en or em dash

_UNIT_PATTERN = "|".join(re.escape(unit) for unit in sorted(UNITS, key=len, reverse=True) if unit)
# A number, its unit, then at most a footnote mark or, after a unit, one word ("1.68x missed").
_VALUE = re.compile(
    rf"^[~≈]?\s*(?P<number>[-+]?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|[-+]?\.\d+)"
    rf"\s*(?P<unit>{_UNIT_PATTERN})?(?P<rest>\s+[A-Za-z]+)?\**$"
)
# The unit a column's header gives its plain numbers ("GB/s", "tokens/s at 4").
_HEADER_RATE = re.compile(r"(?<![\w/])(tokens/s|tok/s|(?:[KMGT]i?)?B/s)(?![\w/])")
_LIST = " / "


@dataclass(frozen=True, slots=True)
class Value:
    """One measurement: `base` in its kind's base unit (seconds, bytes, bytes/s), `unit` as written."""

    base: float
    kind: str
    unit: str
    text: str


def parse_value(text: str, header: str = "") -> Value | None:
    """The measurement a cell holds, or None (text, a bound, a missing value)."""
    cleaned = text.strip()
    if cleaned.lower() in MISSING:
        return None
    match = _VALUE.match(cleaned)
    if match is None:
        return None
    unit = match["unit"] or ""
    if match["rest"] and not unit:
        return None  # "3 of 4", "10 tokens": a number inside words
    if not unit:
        named = _HEADER_RATE.search(header)
        unit = named[1] if named else ""
    kind, factor, _ = UNITS[unit]
    number = float(match["number"].replace(",", ""))
    shown = cleaned[: match.start("rest")] if match["rest"] else cleaned
    return Value(number * factor, kind, unit, shown.rstrip("*").strip())


@dataclass(frozen=True, slots=True)
class Series:
    """A column (or one value of a two-value column) as bars: None where a row has no value."""

    name: str
    kind: str
    values: tuple[Value | None, ...]
    column: int


@dataclass(frozen=True, slots=True)
class Chart:
    """A table's chart: the SVG and a sentence naming what it shows (the image's alt text)."""

    svg: str
    alt: str


def table_series(columns: Sequence[object], rows: Sequence[Sequence[object]], first: int = 1) -> list[Series]:
    """The plottable series of a table, in column order, from column `first` on (before it: names)."""
    found: list[Series] = []
    for index in range(first, len(columns)):
        header = str(columns[index])
        cells = [str(row[index]) if index < len(row) and row[index] is not None else "" for row in rows]
        present = [c for c in cells if c.strip().lower() not in MISSING]
        if not present:
            continue
        parts = [c.split(_LIST) if c.strip().lower() not in MISSING else [] for c in cells]
        width = max(len(p) for p in parts)
        parsed = [[parse_value(part, header) for part in p] for p in parts]
        # A column counts when most of its cells are measurements; a column of names does not.
        readable = sum(1 for p in parsed if p and all(v is not None for v in p))
        if readable * 2 < len(present):
            continue
        for part in range(width):
            values = [p[part] if part < len(p) else None for p in parsed]
            kinds = Counter(v.kind for v in values if v is not None)
            if not kinds:
                continue
            kind = kinds.most_common(1)[0][0]
            kept = tuple(v if v is not None and v.kind == kind else None for v in values)
            measured = {v.base for v in kept if v is not None}
            if len(measured) == 1 and len(rows) > 1 and all(v is not None for v in kept):
                continue  # one value in every row: a setting of the run, not a result
            name = header.strip() or f"column {index + 1}"
            if width > 1:
                name = f"{name} ({_ordinal(part, width)} of /)"
            found.append(Series(name, kind, kept, index))
    # Columns of one header ("GB/s" after each prompt size's time) are told apart by their place.
    repeated = Counter(s.name for s in found)
    return [
        replace(s, name=f"{s.name} (column {s.column + 1})") if repeated[s.name] > 1 else s for s in found
    ]


def _ordinal(part: int, width: int) -> str:
    if width == 2:
        return ("left", "right")[part]
    return f"#{part + 1}"


def row_labels(columns: Sequence[object], rows: Sequence[Sequence[object]]) -> tuple[list[str], int]:
    """The rows' names and how many columns make them: the first, and the next while names repeat."""
    def cell(row: Sequence[object], i: int) -> str:
        return str(row[i]).strip() if i < len(row) and row[i] is not None else ""

    labels = [cell(row, 0) for row in rows]
    used = 1
    while len(set(labels)) < len(labels) and used < len(columns) - 1:
        labels = [f"{label}, {str(columns[used]).strip()} {cell(row, used)}".strip(", ")
                  for label, row in zip(labels, rows, strict=True)]
        used += 1
    return labels, used


def table_chart(title: str, columns: Sequence[object], rows: Sequence[Sequence[object]]) -> Chart | None:
    """The chart of a table, or None when no column holds measurements."""
    labels, named_by = row_labels(columns, rows)
    series = table_series(columns, rows, named_by)
    if not series or not rows:
        return None
    panels: dict[str, list[Series]] = {}
    # Plain numbers last: they are often a run's parameters, where a unit marks a measurement.
    for one in sorted(series, key=lambda s: s.kind == "number"):
        panels.setdefault(one.kind, []).append(one)
    built = [_Panel.build(kind, members, labels) for kind, members in panels.items()]
    shown = [p for p in built if p.rows]
    if not shown:
        return None
    what = "; ".join(p.description for p in shown)
    naming = _join([str(c).strip() for c in columns[:named_by] if str(c).strip()] or ["row"])
    alt = f"Bar chart of {title}: {what}, by {naming}"
    return Chart(_svg(title, shown), alt)


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# -- layout -------------------------------------------------------------------------------------------

WIDTH = 720
CHAR = 7.0  # about the widest mean width of a 12px sans-serif character, for sizing the label column
BAR = 12.0
GAP = 2.0
GROUP_GAP = 10.0
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#7f7f7f", "#f0e442")


@dataclass(frozen=True, slots=True)
class _Panel:
    """One kind's series over the rows that have a value of it, in one display unit."""

    kind: str
    unit: str
    factor: float
    series: list[Series]
    rows: list[tuple[str, list[Value | None]]]

    @classmethod
    def build(cls, kind: str, series: list[Series], labels: list[str]) -> _Panel:
        rows = []
        for i, label in enumerate(labels):
            values = [s.values[i] for s in series]
            if any(v is not None for v in values):
                rows.append((label, values))
        measured = [v for s in series for v in s.values if v is not None]
        largest = max((abs(v.base) for v in measured), default=0.0)
        # The largest unit the cells use that the largest value reaches (else the smallest used).
        used = sorted({UNITS[v.unit][1:] for v in measured})
        factor, unit = used[0]
        for candidate, name in used:
            if candidate <= largest:
                factor, unit = candidate, name
        return cls(kind, unit, factor, series, rows)

    @property
    def unit_caption(self) -> str:
        return self.unit or "plain numbers"

    @property
    def description(self) -> str:
        """Its series' names, and its unit unless a name says it."""
        names = _join([s.name for s in self.series])
        return names if _says(names, self.unit) else f"{names} ({self.unit_caption})"

    @property
    def heading(self) -> str:
        """The panel's name: its series' (one) or its kind's, with the unit unless the name has it."""
        name = self.series[0].name if len(self.series) == 1 else KIND_NAMES.get(self.kind, "")
        if not self.unit or _says(name, self.unit):
            return name or self.unit_caption
        return f"{name} ({self.unit})" if name else self.unit


def _says(text: str, unit: str) -> bool:
    """Whether `text` names `unit` as a word of its own ("state GB/s", not the s of "seconds")."""
    return bool(unit) and re.search(rf"(?<![\w/]){re.escape(unit)}(?![\w/])", text) is not None


def _ticks(low: float, high: float) -> list[float]:
    """About five round values covering [low, high] (low <= 0 <= high)."""
    span = high - low or abs(high) or 1.0
    raw = span / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(low / step + 1e-9)
    stop = max(math.ceil(high / step - 1e-9), start + 1)
    return [k * step for k in range(start, stop + 1)]


def _tick_text(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{round(value, 6):g}"


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(chars - 1, 1)].rstrip() + "…"


def _with_unit(unit: str) -> str:
    return unit if unit in ("x", "%") else f" {unit}".rstrip()


def _line(kind: str, x: float, top: float, bottom: float) -> str:
    return f'<line class="{kind}" x1="{_num(x)}" y1="{_num(top)}" x2="{_num(x)}" y2="{_num(bottom)}"/>'


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _svg(title: str, panels: list[_Panel]) -> str:
    longest = max(len(label) for p in panels for label, _ in p.rows)
    label_chars = min(longest, 44)
    plot_x = 12 + label_chars * CHAR + 10
    plot_w = WIDTH - plot_x - 70
    body: list[str] = []
    y = 8.0
    for panel in panels:
        y = _draw_panel(body, panel, y, plot_x, plot_w, label_chars)
    height = math.ceil(y + 4)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img">',
            f"<title>{escape(title)}</title>",
            "<style>text{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;"
            "font-size:12px;fill:#333}.small{font-size:11px}.head{font-weight:600}"
            ".grid{stroke:#e3e3e3}.axis{stroke:#888}</style>",
            f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
            *body,
            "</svg>",
            "",
        ]
    )


def _draw_panel(out: list[str], panel: _Panel, y: float, plot_x: float, plot_w: float,
                label_chars: int) -> float:
    """Draw one panel from `y` down; return the y below it."""
    shown = [[None if v is None else v.base / panel.factor for v in values] for _, values in panel.rows]
    numbers = [n for row in shown for n in row if n is not None]
    ticks = _ticks(min(0.0, *numbers), max(0.0, *numbers))
    low, high = ticks[0], ticks[-1]

    def x_of(value: float) -> float:
        return plot_x + (value - low) / (high - low) * plot_w

    y += 14
    out.append(f'<text class="head" x="12" y="{_num(y)}">{escape(panel.heading)}</text>')
    y += 8
    if len(panel.series) > 1:
        # The legend in columns as wide as its longest name, across the whole width.
        names = [_fit(series.name, 90) for series in panel.series]
        item = 30 + max(len(name) for name in names) * CHAR * 11 / 12
        per_line = max(1, int((WIDTH - 24) // item))
        for i, name in enumerate(names):
            x = 12 + (i % per_line) * item
            line_y = y + 12 + (i // per_line) * 16
            color = PALETTE[i % len(PALETTE)]
            out.append(f'<rect x="{_num(x)}" y="{_num(line_y - 9)}" width="10" height="10" fill="{color}"/>')
            out.append(
                f'<text class="small" x="{_num(x + 14)}" y="{_num(line_y)}">{escape(name)}</text>'
            )
        y += 12 + (len(panel.series) - 1) // per_line * 16 + 8
    top = y + 4
    bar = BAR if len(panel.series) > 1 else BAR + 4
    y = top
    bars: list[str] = []
    for (label, values), numbers_of_row in zip(panel.rows, shown, strict=True):
        group = len(values) * bar + (len(values) - 1) * GAP
        middle = y + group / 2
        bars.append(
            f'<text x="{_num(plot_x - 10)}" y="{_num(middle + 4)}" text-anchor="end">'
            f"<title>{escape(label)}</title>{escape(_fit(label, label_chars))}</text>"
        )
        for i, (value, number) in enumerate(zip(values, numbers_of_row, strict=True)):
            if value is None or number is None:
                continue
            top_of_bar = y + i * (bar + GAP)
            start, end = sorted((x_of(0.0), x_of(number)))
            color = PALETTE[i % len(PALETTE)]
            tip = f"{label}: {panel.series[i].name} = {value.text}"
            bars.append(
                f'<rect class="bar" x="{_num(start)}" y="{_num(top_of_bar)}" width="{_num(end - start)}" '
                f'height="{_num(bar)}" fill="{color}"><title>{escape(tip)}</title></rect>'
            )
            anchor, at = ("start", end + 4) if number >= 0 else ("end", start - 4)
            bars.append(
                f'<text class="small" x="{_num(at)}" y="{_num(top_of_bar + bar / 2 + 4)}" '
                f'text-anchor="{anchor}">{escape(value.text)}</text>'
            )
        y += group + GROUP_GAP
    bottom = y - GROUP_GAP + 4
    for tick in ticks:
        x = x_of(tick)
        text = _tick_text(tick) + (_with_unit(panel.unit) if tick == high else "")
        out.append(_line("grid", x, top - 4, bottom))
        out.append(
            f'<text class="small" x="{_num(x)}" y="{_num(bottom + 14)}" text-anchor="middle">'
            f"{escape(text)}</text>"
        )
    out.extend(bars)
    zero = x_of(0.0)
    out.append(_line("axis", zero, top - 4, bottom))
    return bottom + 26
