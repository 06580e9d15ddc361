"""Everything a run leaves for people and machines, made from RunResults alone.

index.html (self-contained: inline CSS and SVG charts, no network), results.json
(the versioned schema), results.csv (one row per cell), summary.md (a CI job
summary) and junit.xml (one test case per cell). Every string that came from
the model is escaped by the template engine's autoescaping.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree as ET

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from jinja2 import Environment, PackageLoader, select_autoescape  # noqa: E402

from . import assist_report  # noqa: E402
from .results import VERDICTS, Cell, RunResults  # noqa: E402
from .verdict import DEFAULT_TOLERANCE  # noqa: E402

COLOURS = {"PASS": "#2e9e5b", "WARN": "#e0a100", "FAIL": "#d64545", "SKIP": "#9aa0a6"}
plt.rcParams["svg.fonttype"] = "path"  # text as outlines: the SVG carries no live text at all


def write_all(results: RunResults, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    results.save(out / "results.json")
    table(results).to_csv(out / "results.csv", index=False)
    (out / "summary.md").write_text(summary_markdown(results))
    write_junit(results, out / "junit.xml")
    index = out / "index.html"
    index.write_text(render_html(results))
    return index


def table(results: RunResults) -> pd.DataFrame:
    rows = []
    for cell in results.cells:
        latency = {f"p50_us_b{s.batch}": s.p50_us for s in cell.latency} | {f"p99_us_b{s.batch}": s.p99_us for s in cell.latency}
        discrete = [p for p in cell.parity if p.kind == "discrete"]
        rows.append({
            "host": cell.host, "target": cell.target, "variant": cell.variant, "verdict": cell.verdict,
            "runtime": cell.runtime_version, "max_abs_drift": cell.max_drift, "tolerance": cell.tolerance,
            "vs_ort_cpu_fp32": max((p.vs_baseline_max_abs for p in cell.parity if p.vs_baseline_max_abs is not None), default=None),
            "action_agreement": min((p.agreement for p in discrete), default=None),
            "action_flips": sum(p.flips or 0 for p in discrete) if discrete else None,
            **latency,
            "cold_start_ms": cell.cold_start_ms,
            "artifact_bytes": cell.artifact.size_bytes if cell.artifact else None,
            "conversion_s": cell.artifact.conversion_s if cell.artifact else None,
            "fallback_nodes": sum(row.fallback for row in cell.placement),
            "emulated": bool(cell.backend and cell.backend.emulated),
            "reasons": " | ".join(cell.reasons),
        })
    return pd.DataFrame(rows)


SAME_SPEED = 0.10  # p50s within 10% of the fastest count as equally fast


def recommendations(results: RunResults) -> list[dict]:
    """Per host and target: among cells that meet tolerance and contract (PASS preferred
    to WARN) and are within SAME_SPEED of the fastest p50 (smallest timed batch), the
    smallest artifact."""
    qualifying: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in results.cells:
        if cell.verdict in ("PASS", "WARN") and cell.latency and not any(c.ok is False for c in cell.contract):
            qualifying[(cell.host, cell.target)].append(cell)
    rows = []
    for (host, target), cells in sorted(qualifying.items()):
        cells = [c for c in cells if c.verdict == "PASS"] or cells  # a clean PASS beats a WARN
        fastest = min(c.latency[0].p50_us for c in cells)
        fast_enough = [c for c in cells if c.latency[0].p50_us <= fastest * (1 + SAME_SPEED) or _emulated(c)]
        best = min(fast_enough, key=lambda c: (c.artifact.size_bytes if c.artifact else 0, c.latency[0].p50_us))
        rows.append({"host": host, "target": target, "variant": best.variant, "p50_us": best.latency[0].p50_us,
                     "batch": best.latency[0].batch, "drift": best.max_drift,
                     "size": best.artifact.size_bytes if best.artifact else None, "verdict": best.verdict,
                     "emulated": _emulated(best)})
    return rows


def _emulated(cell: Cell) -> bool:
    """Software adapters: their latency says nothing, so it never decides."""
    return bool(cell.backend and cell.backend.emulated)


def _verdict_grid(results: RunResults) -> dict[str, dict]:
    grid: dict[str, dict] = {}
    for cell in results.cells:
        host = grid.setdefault(cell.host, {"targets": [], "variants": [], "cells": {}})
        if cell.target not in host["targets"]:
            host["targets"].append(cell.target)
        if cell.variant not in host["variants"]:
            host["variants"].append(cell.variant)
        host["cells"][(cell.target, cell.variant)] = cell
    return grid


def _placement_matrix(results: RunResults) -> dict:
    """ONNX nodes (rows) x predicting cells (columns) -> where the node ran."""
    columns = [c for c in results.cells if c.placement]
    where: dict[str, dict] = defaultdict(dict)
    op_types: dict[str, str] = {}
    for column, cell in enumerate(columns):
        for row in cell.placement:
            where[row.node][column] = row
            op_types.setdefault(row.node, row.op_type)
    ordered = [n for n in results.model.get("node_names", []) if n in where] + sorted(
        n for n in where if n not in set(results.model.get("node_names", []))
    )
    return {"columns": columns, "rows": [(n, op_types[n], where[n]) for n in ordered]}


def _label(cell: Cell, multi_host: bool) -> str:
    return f"{cell.host} · {cell.target} {cell.variant}" if multi_host else f"{cell.target} {cell.variant}"


def drift_chart(results: RunResults) -> str:
    multi = len(results.hosts) > 1
    cells = [c for c in results.cells if c.max_drift is not None]
    if not cells:
        return ""
    height = 0.9 + 0.28 * len(cells)
    figure, axes = plt.subplots(figsize=(8, height))
    labels = [_label(c, multi) for c in cells]
    values = [max(c.max_drift, 1e-12) for c in cells]
    axes.barh(labels, values, color=[COLOURS[c.verdict] for c in cells])
    axes.scatter([c.tolerance for c in cells], labels, marker="|", s=160, color="#222", label="tolerance", zorder=3)
    axes.set_xscale("log")
    axes.set_xlabel("max |action - float64 reference| (log)")
    axes.invert_yaxis()
    axes.legend(loc="lower right", fontsize=8)
    return _svg(figure)


def latency_chart(results: RunResults) -> str:
    multi = len(results.hosts) > 1
    cells = [c for c in results.cells if c.latency]
    if not cells:
        return ""
    batches = sorted({s.batch for c in cells for s in c.latency})
    height = 0.9 + 0.28 * len(cells) * len(batches)
    figure, axes = plt.subplots(figsize=(8, height))
    bar = 0.8 / len(batches)
    palette = ["#3b6fb6", "#f08a24", "#7a5195", "#2e9e5b"]
    for i, batch in enumerate(batches):
        for j, cell in enumerate(cells):
            stats = next((s for s in cell.latency if s.batch == batch), None)
            if stats is None:
                continue
            emulated = bool(cell.backend and cell.backend.emulated)
            axes.barh(j + i * bar, stats.p50_us, height=bar, color=palette[i % len(palette)],
                      hatch="//" if emulated else None, xerr=[[0], [max(stats.p90_us - stats.p50_us, 0)]],
                      label=f"batch {batch}" if j == 0 else None, edgecolor="white")
    axes.set_yticks([j + bar * (len(batches) - 1) / 2 for j in range(len(cells))], [_label(c, multi) for c in cells])
    axes.set_xscale("log")
    axes.set_xlabel("p50 per call, µs (log; whisker to p90; hatched = emulated adapter)")
    axes.invert_yaxis()
    axes.legend(loc="lower right", fontsize=8)
    return _svg(figure)


def _svg(figure) -> str:
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def render_html(results: RunResults) -> str:
    environment = Environment(loader=PackageLoader("matrix", "templates"), autoescape=select_autoescape(["html", "j2"]))
    template = environment.get_template("report.html.j2")
    return template.render(
        results=results, grid=_verdict_grid(results), colours=COLOURS, verdicts=VERDICTS,
        counts={v: sum(c.verdict == v for c in results.cells) for v in VERDICTS},
        drift_svg=drift_chart(results), latency_svg=latency_chart(results),
        placement=_placement_matrix(results), recommendations=recommendations(results),
        contract_names=list(dict.fromkeys(check.name for c in results.cells for check in c.contract)),
        multi_host=len(results.hosts) > 1, default_tolerance=DEFAULT_TOLERANCE, regressions=results.regressions,
        runtimes=sorted({(c.host, c.target, c.runtime_version) for c in results.cells if c.runtime_version}),
        assist=assist_report.context(results),
    )


def summary_markdown(results: RunResults) -> str:
    model = results.model
    lines = [f"## policy-matrix: `{_md(model['name'])}`", "", f"sha256 `{model['sha256'][:16]}…` · {results.created}", ""]
    counts = " · ".join(f"{v} {sum(c.verdict == v for c in results.cells)}" for v in VERDICTS)
    lines += [f"**{counts}**", ""]
    if results.regressions:
        lines += [f"### ❗ {len(results.regressions)} regressions against the baseline", ""]
        lines += [f"- {_md(str(r))}" for r in results.regressions] + [""]
    for host, grid in _verdict_grid(results).items():
        lines += [f"### {host}", "", "| target | " + " | ".join(grid["variants"]) + " |", "|---" * (len(grid["variants"]) + 1) + "|"]
        for target in grid["targets"]:
            marks = [_md_cell(grid["cells"].get((target, v))) for v in grid["variants"]]
            lines.append(f"| {target} | " + " | ".join(marks) + " |")
        lines.append("")
    problems = [c for c in results.cells if c.verdict in ("FAIL", "WARN")]
    if problems:
        lines += ["### Why", ""] + [f"- **{c.verdict}** {c.host} {c.target} {c.variant}: {_md(c.reasons[0])}" for c in problems if c.reasons]
    return "\n".join(lines) + "\n"


def _md_cell(cell: Cell | None) -> str:
    if cell is None:
        return ""
    icon = {"PASS": "✅", "WARN": "⚠️", "FAIL": "❌", "SKIP": "⏭️"}[cell.verdict]
    drift = f" {cell.max_drift:.1e}" if cell.max_drift is not None else ""
    return f"{icon} {cell.verdict}{drift}"


def _md(text: str) -> str:
    """Model strings in markdown: neutralise markup and HTML."""
    for char in "\\`*_[]<>|#":
        text = text.replace(char, f"\\{char}")
    return text


def write_junit(results: RunResults, path: Path) -> None:
    suites = ET.Element("testsuites", name="policy-matrix")
    for host, grid in _verdict_grid(results).items():
        cells = list(grid["cells"].values())
        suite = ET.SubElement(suites, "testsuite", name=f"policy-matrix {host}", tests=str(len(cells)),
                              failures=str(sum(c.verdict == "FAIL" for c in cells)), skipped=str(sum(c.verdict == "SKIP" for c in cells)))
        for cell in cells:
            case = ET.SubElement(suite, "testcase", classname=f"{host}.{cell.target}", name=cell.variant, time=f"{cell.duration_s:.3f}")
            message = "; ".join(cell.reasons)
            if cell.verdict == "FAIL":
                ET.SubElement(case, "failure", message=message[:500]).text = message
            elif cell.verdict == "SKIP":
                ET.SubElement(case, "skipped", message=message[:500])
            elif message:
                ET.SubElement(case, "system-out").text = message
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
