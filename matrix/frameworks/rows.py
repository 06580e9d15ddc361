"""One row of the framework table, read from what the policy's run measured (results.json), the
exported file itself (opset, IR, operator domains, external data) and the build's manifest."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import results as results_file
from . import Framework

SOURCE = "source"  # the --source column's target name (matrix/reference/source.py)
STANDARD_DOMAINS = ("", "ai.onnx")
REASON_CHARS = 140
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in an exporter's message


@dataclass
class TargetVerdict:
    target: str
    verdict: str
    why: str = ""  # the cell's cause (its first "cause:" reason, else its first reason) when not PASS
    fixed_by: str = ""  # --assist: the preparation that made it PASS ("" if none did)


@dataclass
class Row:
    framework: str  # name and pinned release, e.g. "sb3 2.9.2"
    title: str  # what the framework module says its export path is
    policy: str = ""
    task: str = ""
    problem: str = ""  # why this row has no measurements (install, build or run failure), in the tool's or pip's words
    version: str = ""  # what the build interpreter reported (framework, torch, jax, ...)
    training: str = ""
    build: str = ""  # where the export came from when this run did not train it (the build cache's note)
    export_path: str = ""
    fallbacks: list[str] = field(default_factory=list)
    opset: str = ""  # "17 / IR 8"
    ops: list[str] = field(default_factory=list)
    nonstandard_ops: list[str] = field(default_factory=list)  # "domain:Op"
    external_data: bool = False
    dynamic_batch: str = ""
    lints: list[str] = field(default_factory=list)  # lints that are not ok: "level id: message"
    parity: str = ""  # export parity against the framework (--source), or why it was not measured
    parity_verdict: str = ""
    returns: str = ""  # reference (ONNX float64) mean return, and the framework's own where it ran
    targets: list[TargetVerdict] = field(default_factory=list)
    report: str = ""  # the policy's report, relative to the table's folder

    def summary(self) -> str:
        """`6/8 PASS; ort-web-webgl FAIL: no ArgMax kernel ...` (targets only; the source is the parity column)."""
        if not self.targets:
            return ""
        counts = Counter(t.verdict for t in self.targets)
        head = f"{counts.get('PASS', 0)}/{len(self.targets)} PASS"
        rest = [f"{t.target} {t.verdict}" + (f": {t.why}" if t.why else "") for t in self.targets if t.verdict != "PASS"]
        return "; ".join([head, *rest])

    def fixes(self) -> list[str]:
        return [f"{t.target}: {t.fixed_by}" for t in self.targets if t.fixed_by]

    def as_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary(), "fixes": self.fixes()}


def framework_row(framework: Framework, problem: str, policy: str = "", manifest: dict | None = None) -> Row:
    manifest = manifest or {}
    return Row(framework=framework.label, title=framework.export, policy=policy, task=manifest.get("task", ""),
               problem=problem, version=manifest.get("version", ""), training=manifest.get("training", ""),
               build=manifest.get("cached_build", ""),
               export_path=manifest.get("export_path", ""),
               fallbacks=[_short(ANSI.sub("", text)) for text in manifest.get("fallbacks", [])])


def policy_row(framework: Framework, manifest: dict, folder: Path, table_folder: Path) -> Row:
    row = framework_row(framework, "", manifest["policy"], manifest)
    measured = results_file.load(folder / "report" / "results.json")
    model = measured.model
    row.opset = f"{model.get('opset')} / IR {model.get('ir_version')}"
    row.ops = list(model.get("op_types", []))
    row.nonstandard_ops, row.external_data = exported_file_facts(folder / "policy.onnx")
    lints = {lint.id: lint for lint in measured.lints}
    batch = lints.get("symbolic-batch")
    row.dynamic_batch = "yes" if batch is not None and batch.level == "ok" else f"no: {batch.message}" if batch else "?"
    row.lints = [f"{lint.level} {lint.id}: {lint.message}" for lint in measured.lints if lint.level != "ok"]
    cells = [cell for cell in measured.cells if not cell.candidate and not cell.settings]
    source = next((cell for cell in cells if cell.target == SOURCE), None)
    row.parity, row.parity_verdict = parity_text(source, manifest)
    row.returns = returns_text(cells, source)
    row.targets = [target_verdict(cell) for cell in cells if cell.target != SOURCE]
    row.report = os.path.relpath(folder / "report" / "index.html", table_folder)
    return row


def exported_file_facts(path: Path) -> tuple[list[str], bool]:
    """Operators no ONNX schema defines at the model's opset (a custom domain a runtime must have
    registered, or a converter's op left unconverted in the default domain) and whether the weights
    live in an external-data file beside the graph."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    nodes = list(model.graph.node) + [n for f in model.functions for n in f.node]
    local_functions = {(f.domain, f.name) for f in model.functions}
    custom = sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in nodes
                     if (n.domain, n.op_type) not in local_functions and not _defined(n, opsets)})
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    return custom, external


def _defined(node, opsets: dict[str, int]) -> bool:
    import onnx

    domain = "" if node.domain in STANDARD_DOMAINS else node.domain
    try:
        onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return False
    return True


def parity_text(source, manifest: dict) -> tuple[str, str]:
    if source is None:
        why = "the framework's source could not be loaded" if manifest.get("source") else \
            "not measured: --source does not feed a recurrent policy's state"
        return why, ""
    measured = []
    for output in source.parity:
        if output.agreement is not None:
            measured.append(f"{output.output}: agreement {output.agreement:.1%}")
        else:
            measured.append(f"{output.output}: max abs {output.max_abs:.2g}")
    reasons = [_short(r) for r in source.reasons[:2] if not r.startswith("synthetic inputs")]
    return "; ".join([*measured, *reasons]) or "no parity measured", source.verdict


def returns_text(cells: list, source) -> str:
    rollout = next((cell.rollout for cell in cells if cell.rollout and cell.rollout.reference_mean_return is not None), None)
    if rollout is None:
        return ""
    text = f"ONNX reference {rollout.reference_mean_return:.1f}"
    if source is not None and source.rollout and source.rollout.mean_return is not None:
        text += f", framework {source.rollout.mean_return:.1f}"
    return f"{text} (mean of {len(rollout.episodes)} episodes, {rollout.env})"


def target_verdict(cell) -> TargetVerdict:
    why = "" if cell.verdict in ("PASS", "CONVERTED") else _cause(cell.reasons)
    fixed = next((fix.preparation for fix in cell.fixes if fix.verdict == "PASS"), "")
    if fixed:
        host_step = next(fix.host_step for fix in cell.fixes if fix.preparation == fixed)
        fixed += f" (then: {host_step})" if host_step else ""
    name = cell.target if cell.variant == "fp32" else f"{cell.target} {cell.variant}"
    return TargetVerdict(name, cell.verdict, why, fixed)


def _cause(reasons: list[str]) -> str:
    chosen = next((r for r in reasons if r.startswith("cause:")), None) or next(
        (r for r in reasons if not r.startswith("synthetic inputs")), reasons[0] if reasons else "")
    return _short(chosen.removeprefix("cause: ").split(" (--assist's preparations")[0])  # the fixes column says what helped


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"
