"""Everything a run leaves for people and machines, made from RunResults alone.

index.html (self-contained: inline CSS, SVG charts and one script that its
Content-Security-Policy admits by hash; no network), results.json
(the versioned schema), results.csv (one row per cell), latency.csv (one row
per cell x batch size), summary.md (a CI job
summary) and junit.xml (one test case per cell). Every string that came from
the model is escaped by the template engine's autoescaping.

The CSV files are written with the standard library's csv module: pandas would add ~0.3 s
of import to every run for two flat tables (a one-target check takes about a second);
readers load them with pandas as before.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import math
import re
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree as ET

from jinja2 import Environment, FileSystemBytecodeCache, PackageLoader, select_autoescape

from . import charts
from ..errors import printable
from ..outdir import write_atomic
from targets.paths import cache_dir
from ..results import VERDICTS, BaselineCoverage, Cell, LatencyStats, RunResults
from ..judge.rules import DEFAULT_RTOL, DEFAULT_TOLERANCE, RETURN_NOISE_RULE

from . import assist_report, report_behaviour, report_decision
from ..decide import decide
from ..judge import noise
from .. import runtime_versions
from .report_text import COLOURS, cell_label, md



def write_all(results: RunResults, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if not results.decision:  # results made without a decision (an older shard): decide with the budgets it records
        results.decision = decide.Request.recorded(results.run_options).decide(results)
    write_atomic(out / "results.json", results.model_dump_json(indent=2))
    write_atomic(out / "results.csv", csv_text(table(results)))
    write_atomic(out / "latency.csv", csv_text(latency_table(results), LATENCY_COLUMNS))
    write_atomic(out / "summary.md", summary_markdown(results))
    write_junit(results, out / "junit.xml")
    index = out / "index.html"
    write_atomic(index, render_html(results))
    return index


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(rows: list[dict], columns: list[str] | None = None) -> str:
    """One table as CSV: `columns`, or every key in order of first appearance (a row without one leaves it
    empty, as None does); numbers as Python writes them (repr: no digits lost)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns or list(dict.fromkeys(key for row in rows for key in row)),
                            lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows({key: _spreadsheet_safe(value) for key, value in row.items()} for row in rows)
    return buffer.getvalue()


def _spreadsheet_safe(value):
    """Text a spreadsheet would run as a formula (a host label `=HYPERLINK(...)`, a shard's field) gets a
    leading apostrophe, as spreadsheet-safe CSV writers do; numbers stay numbers."""
    if not isinstance(value, str):
        return value
    return f"'{printable(value)}" if value.startswith(FORMULA_STARTS) else printable(value)


# Characters XML 1.0 cannot hold at all (control characters other than tab and newlines, lone surrogates, U+FFFE and
# U+FFFF), listed as they are: the complement of what XML allows (`[^\t\n\r\x20-\ud7ff...]`) is the same set, but
# compiling it built a table of every other code point (4 ms of each run, against 0.4).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", printable(text))


def table(results: RunResults) -> list[dict]:
    """results.csv: one row per cell."""
    rows = []
    for cell in results.cells:
        latency = {f"p50_us_b{s.batch}": s.p50_us for s in cell.latency} | {f"p99_us_b{s.batch}": s.p99_us for s in cell.latency}
        discrete = [p for p in cell.parity if p.kind == "discrete"]
        rows.append({
            "host": cell.host, "target": cell.target, "variant": cell.variant,
            "candidate": cell.candidate, "settings": cell.configuration.settings_label, "verdict": cell.verdict,
            "runtime": cell.runtime_version, "max_abs_drift": cell.max_drift, "tolerance": cell.tolerance,
            "vs_ort_cpu_fp32": max((p.vs_dev_runtime_max_abs for p in cell.parity if p.vs_dev_runtime_max_abs is not None), default=None),
            "action_agreement": min((p.agreement for p in discrete if p.agreement is not None), default=None),
            "action_flips": sum(p.flips or 0 for p in discrete) if discrete else None,
            **latency,
            "cold_start_ms": cell.cold_start_ms,
            "artifact_bytes": cell.artifact.size_bytes if cell.artifact else None,
            "conversion_s": cell.artifact.conversion_s if cell.artifact else None,
            "fallback_nodes": sum(row.fallback for row in cell.placement),
            "quantized_ops": _quantized(cell, "quantized_ops"), "float_weight_ops": _quantized(cell, "float_ops"),
            "emulated": bool(cell.backend and cell.backend.emulated),
            "reasons": " | ".join(cell.reasons),
            **report_behaviour.csv_columns(cell),
        })
    return rows


def _quantized(cell: Cell, count: str) -> int | None:
    counted = cell.artifact.quantization if cell.artifact else None
    return counted.get(count) if counted else None


LATENCY_COLUMNS = ["host", "target", "variant", "candidate", "settings", "verdict", "batch", "n", "p50_us", "p50_low_us", "p50_high_us",
                   "p90_us", "p99_us", "mean_us", "std_us", "min_us", "emulated"]


def latency_table(results: RunResults) -> list[dict]:
    """Long format (LATENCY_COLUMNS), one row per cell x batch size: pivot it without knowing which batch sizes ran."""
    return [{"host": cell.host, "target": cell.target, "variant": cell.variant, "candidate": cell.candidate,
             "settings": cell.configuration.settings_label, "verdict": cell.verdict,
             **stats.model_dump(), "emulated": bool(cell.backend and cell.backend.emulated)}
            for cell in results.cells for stats in cell.latency]


def _emulated(cell: Cell) -> bool:
    """Software adapters: their latency says nothing, so it never decides."""
    return bool(cell.backend and cell.backend.emulated)


def _verdict_grid(results: RunResults) -> dict[str, dict]:
    grid: dict[str, dict] = {}
    for cell in results.cells:
        host = grid.setdefault(cell.host, {"targets": [], "variants": [], "cells": {}})
        row = " · ".join(part for part in (cell.target, cell.configuration.axes) if part)  # one row per candidate and settings
        if row not in host["targets"]:
            host["targets"].append(row)
        if cell.variant not in host["variants"]:
            host["variants"].append(cell.variant)
        host["cells"][(row, cell.variant)] = cell
    return grid


def _placement_matrix(results: RunResults) -> dict:
    """ONNX nodes (rows) x predicting cells (columns) -> where the node ran; and every fallback as a line."""
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
    fallbacks = []  # (cell, where it went, [(node, op_type)]): one line per cell and device, however many nodes
    for cell in columns:
        by_device: dict[str, list] = defaultdict(list)
        for row in cell.placement:
            if row.fallback:
                by_device[row.where].append((row.node, row.op_type))
        fallbacks += [(cell, where, nodes) for where, nodes in by_device.items()]
    return {"columns": columns, "rows": [(n, op_types[n], where[n]) for n in ordered], "fallbacks": fallbacks}


def cell_anchors(results: RunResults) -> dict[tuple[str, str, str], str]:
    """Each cell's id in "All reasons": its position, never a string from the model or a host."""
    return {cell.key: f"cell-{index}" for index, cell in enumerate(results.cells)}


# A p99 above this many p50s means interruptions (a busy machine, a collector, the
# timer's step) dominate the tail: compare such a cell by its p50 only.
NOISY_P99_OVER_P50 = 3.0


def noisy(stats: LatencyStats) -> bool:
    return stats.p99_us > NOISY_P99_OVER_P50 * stats.p50_us


def _failed_note(cell: Cell) -> str:
    stage = f" at {cell.error.stage}" if cell.error else ""
    return f"✗ {cell.verdict}{stage}: no numbers"


def drift_chart(results: RunResults) -> str:
    """max |y - reference| per continuous output on a log axis, the tolerance a tick on each row.

    Cells that predicted nothing (failed before any output) keep their row, marked
    as failed, so a broken runtime cannot vanish from the chart."""
    multi = len(results.hosts) > 1
    measured = [c for c in results.cells if c.max_drift is not None]
    if not measured:  # a discrete-only policy: its agreement is in the table
        return ""
    rows, anchors = [], cell_anchors(results)
    for cell in results.cells:
        continuous = [p for p in cell.parity if p.kind == "continuous"]
        if not continuous and not (cell.verdict == "FAIL" and cell.predicts and not cell.parity):
            continue
        label = cell_label(cell, multi)
        tolerance = f"{cell.tolerance:g}" if cell.tolerance is not None else "none"
        marks = [charts.Mark(p.max_abs, f"{label} · {p.output}: max |Δ| {p.max_abs:.3e} (tolerance {tolerance}) → {cell.verdict}",
                             COLOURS[cell.verdict]) for p in continuous]
        rows.append(charts.Row(
            label, marks, tick=cell.tolerance, tick_title=f"{label}: tolerance {tolerance}",
            note="" if marks else _failed_note(cell), note_colour=charts.FAILED_COLOUR, href=f"#{anchors[cell.key]}"))
    legend = [charts.LegendItem(v, COLOURS[v]) for v in ("PASS", "WARN", "FAIL")]
    legend.append(charts.LegendItem("tolerance", shape="tick"))
    return charts.dot_plot(rows, "max |action − float64 reference| (log scale; at the left edge: 0)", _scientific, legend)


BATCH_COLOURS = ["#3b6fb6", "#f08a24", "#7a5195", "#2e9e5b"]


def latency_chart(results: RunResults) -> str:
    """p50 per call per batch size (a shape and colour each), a line on to p99; hollow = emulated adapter."""
    multi = len(results.hosts) > 1
    if not any(c.latency for c in results.cells):
        return ""
    batches = sorted({s.batch for c in results.cells for s in c.latency})
    style = {b: (charts.SHAPES[i % len(charts.SHAPES)], BATCH_COLOURS[i % len(BATCH_COLOURS)]) for i, b in enumerate(batches)}
    rows, anchors = [], cell_anchors(results)
    for cell in results.cells:
        if not cell.latency and not (cell.verdict == "FAIL" and cell.predicts):
            continue
        label = cell_label(cell, multi)
        emulated = _emulated(cell)
        step = cell.backend.timer_resolution_us if cell.backend else None
        marks = [charts.Mark(s.p50_us, _latency_title(label, s, emulated, step), style[s.batch][1], style[s.batch][0],
                             hollow=emulated, range_to=s.p99_us) for s in cell.latency]
        spiky = ", ".join(f"b{s.batch} p99 {_ratio(s.p99_us / s.p50_us)}" for s in cell.latency if noisy(s))
        notes = (["emulated"] if emulated else []) + ([f"noisy {spiky}"] if spiky else [])
        rows.append(charts.Row(label, marks, note=" · ".join(notes) if marks else _failed_note(cell),
                               note_colour="#9a6b00" if marks else charts.FAILED_COLOUR, href=f"#{anchors[cell.key]}"))
    legend = [charts.LegendItem(f"batch {b}", style[b][1], style[b][0]) for b in batches]
    legend.append(charts.LegendItem("emulated adapter", "#5f6b7a", hollow=True))
    return charts.dot_plot(rows, "per call: dot = p50, line on to p99 (log scale)", _duration, legend)


def _ratio(value: float) -> str:
    return f"{value:.1f}×" if value < 10 else f"{value:.0f}×"


def _latency_title(label: str, s: LatencyStats, emulated: bool, timer_step_us: float | None) -> str:
    text = (f"{label}, batch {s.batch}: p50 {s.p50_us:.2f} µs, p90 {s.p90_us:.2f} µs, p99 {s.p99_us:.2f} µs, "
            f"min {s.min_us:.2f} µs, {s.n} calls; {s.p50_us / s.batch:.3f} µs per sample")
    if timer_step_us:
        text += f"; timer step {timer_step_us:g} µs"
    return text + ("; emulated adapter: not a real latency" if emulated else "")


def _scientific(value: float) -> str:
    return f"1e{round(math.log10(value))}"


def _duration(us: float) -> str:
    """Three significant digits in the unit that suits: 9.54 µs, 156 µs, 8.66 ms."""
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    return f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} µs"


def _templates() -> Environment:
    """Compiling the report's templates takes ~0.7 s, more than rendering them: Jinja2's bytecode
    cache keeps them compiled (keyed by each template's source) beside the run's other caches."""
    bytecode = None
    try:
        folder = cache_dir() / "jinja2"
        folder.mkdir(parents=True, exist_ok=True)
        bytecode = FileSystemBytecodeCache(str(folder))
    except OSError:  # a read-only cache: compile every time
        pass
    return Environment(loader=PackageLoader("matrix", "templates"), autoescape=select_autoescape(["html", "j2"]),
                       bytecode_cache=bytecode)


def render_html(results: RunResults) -> str:
    template = _templates().get_template("report.html.j2")
    script = _report_script()
    # Autoescaping stops markup, not the characters that act on a reader (a bidi override shows a runtime's
    # words backwards); the page's own text and script hold none, so every one left came from a model or a shard.
    return printable(template.render(
        results=results, grid=_verdict_grid(results), colours=COLOURS, verdicts=VERDICTS,
        counts={v: sum(c.verdict == v for c in results.cells) for v in VERDICTS},
        drift_svg=drift_chart(results), latency_svg=latency_chart(results),
        placement=_placement_matrix(results), decision=report_decision.context(results),
        contract_names=list(dict.fromkeys(check.name for c in results.cells for check in c.contract)),
        multi_host=len(results.hosts) > 1, default_tolerance=DEFAULT_TOLERANCE, default_rtol=DEFAULT_RTOL, regressions=results.regressions,
        baseline=results.baseline,
        runtimes=sorted({(c.host, c.target, c.runtime_version) for c in results.cells if c.runtime_version}),
        anchors=cell_anchors(results),
        fallbacks={c.key: sum(row.fallback for row in c.placement) for c in results.cells},
        batches=sorted({s.batch for c in results.cells for s in c.latency}),
        noisy_ratio=NOISY_P99_OVER_P50, is_noisy=noisy, duration=_duration, script=script, script_hash=_csp_hash(script),
        behaviour=_behaviour_context(results),
        assist=assist_report.context(results),
        versions=runtime_versions.comparisons(results), quality=runtime_versions.quality,
        return_delta=runtime_versions.return_delta, band_differs=noise.differs,
    ))


def _behaviour_context(results: RunResults) -> dict:
    return {"cells": report_behaviour.behaviour_cells(results), "svg": report_behaviour.returns_chart(results),
            "divergence": report_behaviour.divergence_summary, "grid_note": report_behaviour.grid_note,
            "return_noise": RETURN_NOISE_RULE}


def _report_script() -> str:
    return (Path(__file__).parents[1] / "templates" / "report.js").read_text()


def _csp_hash(script: str) -> str:
    """The Content-Security-Policy source that admits exactly this inline script and nothing else."""
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()


def summary_markdown(results: RunResults) -> str:
    model = results.model
    lines = [f"## policy-matrix: {_md_code(model['name'])}", "", f"sha256 `{model['sha256'][:16]}…` · {md(results.created)}", ""]
    if "observation_source" in model:
        lines += [f"observations: {md(str(model['observation_source']))}", ""]
    counts = " · ".join(f"{v} {sum(c.verdict == v for c in results.cells)}" for v in VERDICTS)
    lines += [f"**{counts}**", ""]
    for interruption in results.interruptions():
        lines += [f"> **{md(interruption.describe())}**", ""]
    for name in results.required_not_run:
        lines += [f"> ❌ **required target {md(name)} did not run** (every cell SKIPped)", ""]
    lines += _ship_table_markdown(results)
    errors = [lint for lint in results.lints if lint.level != "ok"]
    if errors:
        lines += ["### Lints", ""] + [f"- **{lint.level}** {md(lint.id)}: {md(lint.message)}" for lint in errors] + [""]
    for variant, error in results.variant_errors.items():
        lines += [f"> **The tool could not make the {variant} variant** (its cells are SKIP): {md(error)}", ""]
    for variant, why in results.variants_not_made.items():
        lines += [f"{md(variant)} variant {md(why)}", ""]
    if results.regressions:
        lines += [f"### ❗ {len(results.regressions)} regressions against the baseline", ""]
        lines += [f"- {md(str(r))}" for r in results.regressions] + [""]
    lines += _baseline_markdown(results.baseline)
    for host, grid in _verdict_grid(results).items():
        lines += [f"### {md(host)}", "", "| target | " + " | ".join(map(md, grid["variants"])) + " |",
                  "|---" * (len(grid["variants"]) + 1) + "|"]
        for target in grid["targets"]:
            marks = [_md_cell(grid["cells"].get((target, v))) for v in grid["variants"]]
            lines.append(f"| {md(target)} | " + " | ".join(marks) + " |")
        lines.append("")
    lines += report_behaviour.summary_lines(results)
    problems = [c for c in results.cells if c.verdict in ("FAIL", "WARN")]
    if problems:
        lines += ["### Why", ""] + [f"- **{c.verdict}** {md(c.host)} {md(cell_label(c, False))}: {md('; '.join(_why(c)))}"
                                    for c in problems if c.reasons]
    return "\n".join(lines) + "\n"


def _baseline_markdown(covered: BaselineCoverage | None) -> list[str]:
    """How much of the baseline was compared: a host with no cell tonight, or a refused baseline, is not a quiet night."""
    if covered is None:
        return []
    if covered.refused:
        return ["### ⚠️ not compared with the baseline", "", md(covered.refused), ""]
    said = f"compared with the baseline: {covered.compared} cell{'s' if covered.compared != 1 else ''}"
    head = [said, ""] if covered.whole else [f"### ⚠️ {said}, and not all of it", ""]
    return head + [f"- {md(line)}" for line in covered.lines()] + ([""] if covered.lines() else [])


def _why(cell: Cell) -> list[str]:
    """A cell's first reason, its named cause, the batch sizes its episodes never ran, and what --diagnose and --assist
    found about it."""
    found = [r for r in cell.reasons[1:] if r.startswith(("cause:", "batch handling:", "batch sizes:", "first divergent node",
                                                       "diagnosis", "fix:"))]
    return cell.reasons[:1] + found


def _ship_table_markdown(results: RunResults) -> list[str]:
    """The decision as the first table of a CI job summary: what ships per target and why, and the runner-up."""
    if not results.decision:
        return []
    name = str(results.model.get("name", "the model"))
    multi_host = len(results.hosts) > 1
    lines = ["### What to ship", "", "| target | ships | verdict | Δ return | p50 / p99 | size | why |", "|---|---|---|---|---|---|---|"]
    for decision in results.decision:
        where = md(f"{decision.host} {decision.target}" if multi_host else decision.target)
        chosen = decision.chosen
        if chosen is None:
            lines.append(f"| {where} | {md(decide.headline(decision, name))} | | | | | |")
            continue
        ready = f"not deployment-ready: {'; '.join(decision.not_ready)}. " if decision.not_ready else ""
        latency = f"{_duration(chosen.p50_us)} / {_duration(chosen.p99_us)}" if chosen.p50_us and chosen.p99_us else "–"
        delta = decide.return_delta_text(chosen)
        size = decide.size_text(chosen.size_bytes) if chosen.size_bytes is not None else "–"
        flags = f" ({'; '.join(chosen.flags)})" if chosen.flags else ""
        lines.append(f"| {where} | {md(ready + decide.shipped_as(chosen, name) + flags)} | {chosen.verdict} | {delta} | {latency} "
                     f"| {size} | {md(chosen.why)} |")
        if decision.runner_up:
            lines.append(f"| | ↳ {md(decide.runner_up_line(decision, name))} | | | | | |")
    return lines + ["", f"{md(decide.order_line(results.decision[0]))}.", ""]


def _md_cell(cell: Cell | None) -> str:
    """Verdict, drift and p50 (smallest timed batch) of one cell, for a Markdown table."""
    if cell is None:
        return ""
    icon = {"PASS": "✅", "WARN": "⚠️", "FAIL": "❌", "SKIP": "⏭️", "CONVERTED": "🔄"}[cell.verdict]
    drift = f" drift {cell.max_drift:.1e}" if cell.max_drift is not None else ""
    agreement = [p.agreement for p in cell.parity if p.agreement is not None]
    if agreement:
        drift += f" agree {min(agreement):.1%}"
    latency = f" · p50 {_duration(cell.latency[0].p50_us)}" if cell.latency else ""
    if latency and cell.latency[0].batch != 1:
        latency += f" (batch {cell.latency[0].batch})"
    if latency and _emulated(cell):
        latency += " (emulated)"
    return f"{icon} {cell.verdict}{drift}{latency}"




def _md_code(text: str) -> str:
    """Untrusted text as a Markdown code span. Backslash escapes do not work inside code spans
    (they show literally), so the fence is one backtick longer than the longest run of
    backticks in the text, padded with a space when the text starts or ends with one (CommonMark 6.1).
    A code span still ends a table cell at `|`, so this is for prose and headings only."""
    text = printable(" ".join(str(text).split()))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _required_not_run_on(results: RunResults, host: str) -> list[str]:
    """The `--require`d targets that did not run, that HOST's run required: a run's are its one host's; a merge
    names the hosts of each shard that required one."""
    return [name for name in results.required_not_run if host in results.required_on.get(name, [host])]


def write_junit(results: RunResults, path: Path) -> None:
    suites = ET.Element("testsuites", name="policy-matrix")
    for host, grid in _verdict_grid(results).items():
        cells = list(grid["cells"].values())
        suite = ET.SubElement(suites, "testsuite", name=f"policy-matrix {host}", tests=str(len(cells)),
                              failures=str(sum(c.verdict == "FAIL" for c in cells)), skipped=str(sum(c.verdict in ("SKIP", "CONVERTED") for c in cells)))
        regressions = [r for r in results.regressions if r.host == host]
        suite.set("tests", str(len(cells) + len(regressions)))
        suite.set("failures", str(sum(c.verdict == "FAIL" for c in cells) + len(regressions)))
        for cell in cells:
            case = ET.SubElement(suite, "testcase", classname=f"{host}.{cell.target}", name=cell_label(cell, False),
                                 time=f"{cell.duration_s:.3f}")
            message = "; ".join(cell.reasons)
            if cell.verdict == "FAIL":
                ET.SubElement(case, "failure", message=message[:500]).text = message
            elif cell.verdict in ("SKIP", "CONVERTED"):  # converted, nothing predicted: not a pass
                ET.SubElement(case, "skipped", message=(message or "conversion only: nothing predicted on this host")[:500])
            elif message:
                ET.SubElement(case, "system-out").text = message
        required = _required_not_run_on(results, host)
        for name in required:  # `--require`: a target that did not run fails CI visibly
            case = ET.SubElement(suite, "testcase", classname=f"{host}.{name}", name=f"{name} required")
            ET.SubElement(case, "failure", message=f"required target {name} did not run (every cell SKIPped)")
        suite.set("tests", str(int(suite.get("tests")) + len(required)))
        suite.set("failures", str(int(suite.get("failures")) + len(required)))
        for regression in regressions:  # a regression fails CI like a FAILed cell, under its own name
            case = ET.SubElement(suite, "testcase", classname=f"{host}.{regression.target}",
                                 name=f"{regression.target} {regression.variant} regression: {regression.kind}")
            ET.SubElement(case, "failure", message=regression.detail[:500]).text = str(regression)
    for element in suites.iter():  # host labels, reasons and shard fields may carry control characters
        element.text = _xml_text(element.text) if element.text else element.text
        for key, value in element.attrib.items():
            element.set(key, _xml_text(value))
    buffer = io.BytesIO()
    ET.ElementTree(suites).write(buffer, encoding="utf-8", xml_declaration=True)
    write_atomic(path, buffer.getvalue().decode("utf-8"))
