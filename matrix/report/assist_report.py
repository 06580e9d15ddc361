"""What the report's diagnosis and fixes sections need beyond RunResults: the per-node drift charts."""

from __future__ import annotations

import math

from .report_behaviour import figure_svg, pyplot
from ..judge import rules
from ..results import Diagnosis, RunResults

BEFORE, DIVERGED, AFTER = "#9aa0a6", "#d64545", "#e8a0a0"


def context(results: RunResults) -> dict:
    charts = {cell.key: node_drift_chart(cell.diagnosis) for cell in results.cells if cell.diagnosis and cell.diagnosis.nodes}
    if not any(cell.fixes for cell in results.cells):
        return {"node_charts": charts}
    from ..assist.preparations import DEPLOYMENT_BATCH  # onnx and onnxruntime come with it: only for a Fixes section

    judged_on = rules.FIX_JUDGED_ON if rules.returns_judged(results.run_options) else ""
    return {"node_charts": charts, "deployment_batch": DEPLOYMENT_BATCH, "judged_on": judged_on}


def node_drift_chart(diagnosis: Diagnosis) -> str:
    """Drift per node in topological order (log), its threshold as a tick; the first divergent node in red."""
    nodes = diagnosis.nodes
    finite = [n.drift for n in nodes if math.isfinite(n.drift) and n.drift > 0]
    ceiling = max(finite + [n.threshold for n in nodes]) * 10
    first = diagnosis.first.node if diagnosis.first else None
    seen_first = False
    colours = []
    for node in nodes:
        seen_first = seen_first or node.node == first
        colours.append(DIVERGED if node.node == first else AFTER if seen_first else BEFORE)
    labels = [f"{n.node} ({n.op_type})" for n in nodes]
    values = [ceiling if not math.isfinite(n.drift) else max(n.drift, 1e-12) for n in nodes]
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(8, 0.9 + 0.28 * len(nodes)))
    axes.barh(labels, values, color=colours)
    axes.scatter([n.threshold for n in nodes], labels, marker="|", s=160, color="#222", label="threshold", zorder=3)
    for label, node in zip(labels, nodes):
        if not math.isfinite(node.drift):
            axes.annotate("inf/NaN", (ceiling, label), fontsize=7, ha="right", va="center", color="white")
    axes.set_xscale("log")
    axes.set_xlabel("max |y - float64 reference| per node output (log)")
    axes.invert_yaxis()
    axes.legend(loc="lower right", fontsize=8)
    return figure_svg(figure, plt)
