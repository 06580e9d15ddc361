"""The report's Behaviour section: returns per cell against the float64 reference.

Kept apart from report.py so the parity/latency report and this axis change
independently; report.py hands the chart and rows to the template's
`behaviour.html.j2` partial.
"""

from __future__ import annotations

import io

from .report_text import COLOURS, cell_label, md
from ..results import Cell, RunResults

DIVERGED_NEVER = "never"


def behaviour_cells(results: RunResults) -> list[Cell]:
    return [cell for cell in results.cells if cell.rollout is not None]


def divergence_summary(cell: Cell) -> str:
    """Per episode, the step where the trajectory left the reference's ('never' if it did not)."""
    steps = [DIVERGED_NEVER if e.divergence_step is None else str(e.divergence_step) for e in cell.rollout.episodes]
    return ", ".join(steps)


def grid_note(cell: Cell) -> str:
    """One line for the verdict grid: the return delta and how many episodes diverged."""
    rollout = cell.rollout
    if rollout is None:
        return ""
    if rollout.mode == "open-loop":
        return f"replay drift {rollout.max_step_drift:.1e}"
    diverged = sum(e.divergence_step is not None for e in rollout.episodes)
    return f"return {rollout.return_delta_rel:+.1%} · {diverged}/{len(rollout.episodes)} diverged"


def returns_chart(results: RunResults) -> str:
    """Per cell: episode returns as dots, the mean as a bar tick; the reference's mean as a dashed line."""
    cells = [c for c in behaviour_cells(results) if c.rollout.mode == "closed-loop"]
    if not cells:
        return ""
    multi = len(results.hosts) > 1
    labels = ["float64 reference"] + [cell_label(c, multi) for c in cells]
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(8, 0.9 + 0.32 * len(labels)))
    reference = cells[0].rollout
    axes.scatter([e.reference_return for e in reference.episodes], [labels[0]] * len(reference.episodes),
                 color="#222", alpha=0.6, s=18)
    for label, cell in zip(labels[1:], cells):
        returns = [e.episode_return for e in cell.rollout.episodes]
        axes.scatter(returns, [label] * len(returns), color=COLOURS[cell.verdict], alpha=0.6, s=18)
        axes.scatter([cell.rollout.mean_return], [label], marker="|", s=220, color="#222", zorder=3)
    axes.axvline(reference.reference_mean_return, color="#222", linestyle="--", linewidth=1,
                 label=f"reference mean {reference.reference_mean_return:.4g}")
    axes.set_xlabel(f"episode return ({reference.env}; dots: episodes, tick: mean)")
    axes.invert_yaxis()
    axes.legend(loc="lower right", fontsize=8)
    return figure_svg(figure, plt)


def pyplot():
    """matplotlib, imported only when a run has episodes or a diagnosis to draw (it costs ~0.9 s to import). The other
    charts are hand-made SVG on log axes; returns need a linear axis that crosses zero, which matplotlib
    draws without more code here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "path"  # text as outlines: the SVG carries no live text from the model or host
    return plt


def figure_svg(figure, plt) -> str:
    """A matplotlib figure as inline SVG (the behaviour and node drift charts), closed after."""
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def csv_columns(cell: Cell) -> dict:
    rollout = cell.rollout
    if rollout is None or rollout.mode != "closed-loop":
        return {}
    return {"mean_return": rollout.mean_return, "reference_mean_return": rollout.reference_mean_return,
            "return_delta_rel": rollout.return_delta_rel, "episodes_diverged": sum(e.divergence_step is not None for e in rollout.episodes)}


def summary_lines(results: RunResults) -> list[str]:
    """summary.md's Behaviour table (a CI job summary): one row per cell that drove episodes."""
    cells = [c for c in behaviour_cells(results) if c.rollout.mode == "closed-loop"]
    if not cells:
        return []
    env = md(cells[0].rollout.env)
    lines = [f"### Behaviour ({env}, reference mean return {cells[0].rollout.reference_mean_return:.4g})", "",
             "| host | target | variant | mean return | Δ rel | Δ 95% CI (paired) | diverged at step |", "|---|---|---|---|---|---|---|"]
    for cell in cells:
        r = cell.rollout
        interval = f"[{r.return_delta_low:+.4g}, {r.return_delta_high:+.4g}]" if r.return_delta_low is not None else "–"
        variant = " · ".join(part for part in (cell.variant, cell.configuration.axes) if part)  # as the report's row
        lines.append(f"| {md(cell.host)} | {md(cell.target)} | {md(variant)} | {r.mean_return:.4g} | {r.return_delta_rel:+.2%} "
                     f"| {interval} | {divergence_summary(cell)} |")
    return lines + [""]
