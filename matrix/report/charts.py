"""Dot plots on log axes, written as inline SVG.

Why not matplotlib: a dot plot is a few dozen elements; writing them directly
keeps what matplotlib's SVG loses (an SVG <title> per dot: exact numbers on
hover with no script; live, selectable text; the page's own colours) and spares
every report matplotlib's ~0.9 s import. Why dots, not bars: on a log axis a
bar's length depends on where the axis happens to start, so it means nothing;
a dot's position does.

Every string is escaped with markupsafe (Jinja2's own escaper): cell labels
hold host labels and runtime messages, which are untrusted.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field

from markupsafe import Markup, escape

SHAPES = ("circle", "square", "diamond", "triangle")  # one per batch size, so batches differ without colour
LABEL_W, NOTE_W, PLOT_W, ROW_H, AXIS_H, LEGEND_H = 250, 230, 520, 22, 34, 26
LABEL_CHARS = 34  # of 12 px text fit in LABEL_W for most letters; the page refits what runs wider (W, M)
FAILED_COLOUR = "#d64545"


@dataclass
class Mark:
    """One value on a row: a dot, with an optional range (e.g. p50 dot, p99 whisker end)."""

    value: float
    title: str
    colour: str
    shape: str = "circle"
    hollow: bool = False  # e.g. an emulated adapter's latency: drawn, but not to be trusted
    range_to: float | None = None


@dataclass
class Row:
    label: str
    marks: list[Mark] = field(default_factory=list)
    tick: float | None = None  # a per-row reference value, e.g. the cell's tolerance
    tick_title: str = ""
    note: str = ""  # right of the plot: why a row has no dot, or a warning
    note_colour: str = "#5f6b7a"
    href: str = ""  # where a click on the label leads (the cell's details)


@dataclass
class LegendItem:
    text: str
    colour: str = "#1d2330"
    shape: str = "circle"
    hollow: bool = False


def dot_plot(rows: list[Row], axis_title: str, tick_label, legend: list[LegendItem] = ()) -> Markup:
    """Rows of dots on one shared log x axis; `tick_label(10**k)` names each decade."""
    # The axis spans the finite values; an infinite one (NaN outputs, --tolerance X=inf) sits on its right edge.
    values = [v for row in rows for m in row.marks for v in (m.value, m.range_to) if v is not None and 0 < v < math.inf]
    values += [row.tick for row in rows if row.tick and row.tick < math.inf]
    if not rows:
        return Markup("")
    low, high = _decades(values)
    axis = _LogAxis(low, high)
    height = LEGEND_H + len(rows) * ROW_H + AXIS_H
    width = LABEL_W + PLOT_W + NOTE_W
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="dotplot" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" aria-label="{escape(axis_title)}" font-size="12">']
    parts += _legend(legend)
    top = LEGEND_H
    for k in range(low, high + 1):  # one gridline per decade
        x = axis.x(10.0**k)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + len(rows) * ROW_H}" stroke="#e3e7ee"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + len(rows) * ROW_H + 14}" text-anchor="middle" fill="#5f6b7a">'
                     f"{escape(tick_label(10.0**k))}</text>")
    parts.append(f'<text x="{LABEL_W + PLOT_W / 2:.0f}" y="{height - 4}" text-anchor="middle" fill="#5f6b7a">'
                 f"{escape(axis_title)}</text>")
    for index, row in enumerate(rows):
        parts += _row(row, top + index * ROW_H, axis, index)
    parts.append("</svg>")
    return Markup("".join(parts))


class _LogAxis:
    def __init__(self, low: int, high: int):
        self.low, self.high = low, high

    def x(self, value: float) -> float:
        """Values at or below the axis' lowest decade (and exact zeros) sit on its left edge."""
        position = (math.log10(value) - self.low) / (self.high - self.low) if value > 0 else 0.0
        return LABEL_W + 8 + min(max(position, 0.0), 1.0) * (PLOT_W - 16)


def _decades(values: list[float]) -> tuple[int, int]:
    if not values:
        return 0, 1
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    return low, max(high, low + 1)


def display_width(text: str) -> int:
    """Width in narrow characters: an East Asian wide or fullwidth one (CJK, kana, most emoji) is a full em,
    about two narrow ones (a 12 px CJK glyph is 12 px; a narrow one at most ~7)."""
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def _fitted(label: str) -> str:
    """A row label that fits left of the plot: a longer one (a CI runner's host label) keeps its start and its
    end (the host's first characters, the target and variant) around an ellipsis, instead of running off the
    chart's left edge. Measured in display width: 34 CJK letters are twice as wide as 34 Latin ones."""
    if display_width(label) <= LABEL_CHARS:
        return label
    head = _widest_prefix(label, LABEL_CHARS // 3)
    tail = _widest_prefix(label[::-1], LABEL_CHARS - display_width(head) - 1)[::-1]
    return f"{head}…{tail}"


def _widest_prefix(text: str, width: int) -> str:
    """The longest start of `text` whose display width is at most `width`."""
    taken = 0
    for end, char in enumerate(text):
        taken += display_width(char)
        if taken > width:
            return text[:end]
    return text


def _row(row: Row, y: float, axis: _LogAxis, index: int) -> list[str]:
    middle = y + ROW_H / 2
    parts = []
    if index % 2:
        parts.append(f'<rect x="0" y="{y}" width="{LABEL_W + PLOT_W + NOTE_W}" height="{ROW_H}" fill="#f6f8fb"/>')
    shown = _fitted(row.label)
    # An estimate of widths: the page's script measures each label and shortens one that still runs off the edge.
    label = f'<text class="label" x="{LABEL_W - 8}" y="{middle + 4}" text-anchor="end" fill="#1d2330">{escape(shown)}</text>'
    if shown != row.label:  # the whole label on hover
        label = f"<title>{escape(row.label)}</title>{label}"
    parts.append(f'<a href="{escape(row.href)}">{label}</a>' if row.href else f"<g>{label}</g>")
    if row.tick:
        x = axis.x(row.tick)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 3}" y2="{y + ROW_H - 3}" stroke="#1d2330" stroke-width="2">'
                     f"<title>{escape(row.tick_title)}</title></line>")
    for offset, mark in zip(_offsets(len(row.marks)), row.marks):
        parts += _mark(mark, axis, middle + offset)
    if row.note:
        parts.append(f'<text x="{LABEL_W + PLOT_W + 6}" y="{middle + 4}" fill="{row.note_colour}">{escape(row.note)}</text>')
    return parts


def _offsets(count: int) -> list[float]:
    """Marks of one row (e.g. batch 1 and batch 64) sit on slightly different heights."""
    if count <= 1:
        return [0.0] * count
    step = min(6.0, (ROW_H - 8) / (count - 1))
    return [(i - (count - 1) / 2) * step for i in range(count)]


def _mark(mark: Mark, axis: _LogAxis, y: float) -> list[str]:
    x = axis.x(mark.value)
    parts = []
    if mark.range_to is not None:
        parts.append(f'<line x1="{x:.1f}" x2="{axis.x(mark.range_to):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{mark.colour}" stroke-width="1.5" opacity="0.7"/>')
    parts.append(_shape(mark.shape, x, y, mark.colour, mark.hollow, f"<title>{escape(mark.title)}</title>"))
    return parts


def _shape(shape: str, x: float, y: float, colour: str, hollow: bool, inner: str = "", css: str = "mark") -> str:
    r = 5.0
    fill = f'fill="#fff" stroke="{colour}" stroke-width="2"' if hollow else f'fill="{colour}" stroke="#fff" stroke-width="1"'
    paint = f'class="{css}" {fill}'
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}" {paint}>{inner}</rect>'
    if shape in ("diamond", "triangle"):
        points = ([(x, y - r - 1), (x + r + 1, y), (x, y + r + 1), (x - r - 1, y)] if shape == "diamond"
                  else [(x, y - r - 1), (x + r + 1, y + r), (x - r - 1, y + r)])
        coordinates = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        return f'<polygon points="{coordinates}" {paint}>{inner}</polygon>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" {paint}>{inner}</circle>'


def _legend(items: list[LegendItem]) -> list[str]:
    parts, x = [], LABEL_W + 8
    for item in items:
        if item.shape == "tick":
            parts.append(f'<line x1="{x}" x2="{x}" y1="6" y2="20" stroke="{item.colour}" stroke-width="2"/>')
        else:
            parts.append(_shape(item.shape, x, 13, item.colour, item.hollow, css="key"))
        parts.append(f'<text x="{x + 10}" y="17" fill="#1d2330">{escape(item.text)}</text>')
        x += 32 + 7 * len(item.text)
    return parts
