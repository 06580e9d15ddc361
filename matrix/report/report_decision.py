"""The report's Decision section: per target what to ship, a latency-vs-quality scatter
with its Pareto front, and every measured configuration in one sortable table.

The scatter is hand-written SVG like matrix/report/charts.py (a <title> per point, the
page's colours, no matplotlib import); every string is escaped with markupsafe.
"""

from __future__ import annotations

import math

from markupsafe import Markup, escape

from . import charts
from ..decide import decide
from ..judge import rules
from ..results import Cell, RunResults

WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 520, 300, 64, 40, 14, 16
FRONT, OTHER, CHOSEN = "#3b6fb6", "#9aa0a6", "#2e9e5b"


def context(results: RunResults) -> dict:
    name = str(results.model.get("name", "the model"))
    behaviour = rules.returns_judged(results.run_options)
    return {
        "decisions": results.decision,
        "scatters": {(d.host, d.target): scatter(_cells_of(results, d.host, d.target), d, behaviour, name)
                     for d in results.decision},
        "configuration": lambda choice: decide.configuration(choice, name),
        "shipped_as": lambda choice: decide.shipped_as(choice, name),
        "headline": lambda decision: decide.headline(decision, name),
        "runner_up_line": lambda decision: decide.runner_up_line(decision, name),
        "order_line": decide.order_line,
        "evidence": decide.evidence,
        "size_text": decide.size_text,
        "return_delta_parts": decide.return_delta_parts,
        "cell_name": lambda cell: cell.candidate or name,
        "quality_axis": "|return delta|" if behaviour else "max drift",
        "budgets_given": list(decide.Request.recorded(results.run_options).budget_specs),
    }


def _cells_of(results: RunResults, host: str, target: str) -> list[Cell]:
    return [c for c in results.cells if c.host == host and c.target == target and c.verdict != "SKIP"]


def quality_gap(cell: Cell, behaviour: bool) -> float | None:
    """What the y axis shows: distance from the first model's reference behaviour (or output)."""
    if behaviour:
        return abs(cell.rollout.return_delta) if cell.rollout and cell.rollout.return_delta is not None else None
    if cell.max_drift is not None:
        return cell.max_drift
    agreement = [p.agreement for p in cell.parity if p.agreement is not None]
    return 1 - min(agreement) if agreement else None


def pareto_front(points: list[tuple[float, float]]) -> set[int]:
    """Indices of the points no other point beats on both latency and quality (lower is better)."""
    front = set()
    for i, (x, y) in enumerate(points):
        if not any((ox <= x and oy <= y) and (ox < x or oy < y) for j, (ox, oy) in enumerate(points) if j != i):
            front.add(i)
    return front


def scatter(cells: list[Cell], decision, behaviour: bool, model_name: str) -> Markup:
    plotted = [(c, c.latency and min(c.latency, key=lambda s: s.batch).p50_us, quality_gap(c, behaviour)) for c in cells]
    plotted = [(c, x, y) for c, x, y in plotted if x and y is not None]
    if len(plotted) < 2:
        return Markup("")
    plotted.sort(key=lambda item: not _is_chosen(item[0], decision.chosen))  # the shipped point gets its label first
    front = pareto_front([(x, y) for _, x, y in plotted])
    chosen = decision.chosen
    xs, ys = _Axis([x for _, x, _ in plotted]), _Axis([y for _, _, y in plotted])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="scatter" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
             f'height="{HEIGHT}" role="img" aria-label="p50 latency against quality, {escape(decision.target)}" font-size="11">']
    parts += _frame(xs, ys, "p50 per call, smallest timed batch (log)",
                    ("|return delta| (log; 0 at the bottom)" if behaviour else "max drift vs first model's reference (log)"))
    ordered = sorted((plotted[i] for i in front), key=lambda item: item[1])
    if len(ordered) > 1:
        line = " ".join(f"{_px(xs, x):.1f},{_py(ys, y):.1f}" for _, x, y in ordered)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{FRONT}" stroke-width="1.5" stroke-dasharray="4 3"/>')
    labels, texts = _LabelSpace(), []
    for index, (cell, x, y) in enumerate(plotted):
        is_chosen = _is_chosen(cell, chosen)
        colour = CHOSEN if is_chosen else FRONT if index in front else OTHER
        emulated = bool(cell.backend and cell.backend.emulated)
        title = (f"{cell.candidate or model_name} {cell.variant} {cell.configuration.settings_label}: p50 {decide.duration(x)}, "
                 f"{'|return delta|' if behaviour else 'drift'} {y:.2e}, {cell.verdict}"
                 + (" · on the Pareto front" if index in front else "") + (" · shipped" if is_chosen else "")
                 + (" · emulated adapter: latency not real" if emulated else ""))
        fill = f'fill="#fff" stroke="{colour}" stroke-width="2"' if emulated else f'fill="{colour}" stroke="#fff"'
        radius = 7 if is_chosen else 5
        parts.append(f'<circle class="point" cx="{_px(xs, x):.1f}" cy="{_py(ys, y):.1f}" r="{radius}" {fill}>'
                     f"<title>{escape(title)}</title></circle>")
        label = _point_label(cell)
        if labels.claim(_px(xs, x) + radius + 3, _py(ys, y) + 4, charts.display_width(label)):  # overlapping labels are left to the hover
            texts.append(f'<text class="point-label" x="{_px(xs, x) + radius + 3:.1f}" y="{_py(ys, y) + 4:.1f}" '
                         f'fill="#1d2330">{escape(label)}</text>')
    parts += texts  # labels over every dot, not under the next one
    parts.append("</svg>")
    return Markup("".join(parts))


def _is_chosen(cell: Cell, chosen) -> bool:
    return chosen is not None and not chosen.fix and cell.configuration == chosen.configuration(cell.target)


class _LabelSpace:
    """Where labels already sit (11 px text, ~6 px a narrow character, a wide one two): a label that would overlap
    one is not drawn."""

    def __init__(self):
        self.boxes: list[tuple[float, float, float, float]] = []

    def claim(self, x: float, y: float, width: int) -> bool:
        """`width`: the label's display width in narrow characters (charts.display_width)."""
        box = (x, y - 11, x + 6 * width, y + 2)
        if any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in self.boxes):
            return False
        self.boxes.append(box)
        return True


def _point_label(cell: Cell) -> str:
    """A short name beside each dot: the candidate's file stem, the variant, the non-default settings."""
    stem = cell.candidate.rsplit(".", 1)[0] if cell.candidate else ""
    return " ".join(part for part in (stem, cell.variant, cell.configuration.settings_label) if part)


class _Axis:
    """Log axis over whole decades; zeros (a return delta of exactly 0) sit on the low edge."""

    def __init__(self, values: list[float]):
        positive = [v for v in values if v > 0] or [1.0]
        self.low = math.floor(math.log10(min(positive)))
        self.high = max(math.ceil(math.log10(max(positive))), self.low + 1)

    def share(self, value: float) -> float:
        return (math.log10(value) - self.low) / (self.high - self.low) if value > 0 else 0.0


def _px(axis: _Axis, value: float) -> float:
    return LEFT + axis.share(value) * (WIDTH - LEFT - RIGHT)


def _py(axis: _Axis, value: float) -> float:
    return HEIGHT - BOTTOM - axis.share(value) * (HEIGHT - BOTTOM - TOP)


def _frame(xs: _Axis, ys: _Axis, x_title: str, y_title: str) -> list[str]:
    parts = []
    for k in range(xs.low, xs.high + 1):
        x = _px(xs, 10.0**k)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#e3e7ee"/>')
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle" fill="#5f6b7a">'
                     f"{escape(decide.duration(10.0**k))}</text>")
    for k in range(ys.low, ys.high + 1):
        y = _py(ys, 10.0**k)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e7ee"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#5f6b7a">1e{k}</text>')
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle" fill="#5f6b7a">{escape(x_title)}</text>')
    parts.append(f'<text x="12" y="{TOP + (HEIGHT - BOTTOM - TOP) / 2:.0f}" text-anchor="middle" fill="#5f6b7a" '
                 f'transform="rotate(-90 12 {TOP + (HEIGHT - BOTTOM - TOP) / 2:.0f})">{escape(y_title)}</text>')
    return parts
