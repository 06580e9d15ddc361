"""The framework table, written twice: `index.html` (self-contained, every string escaped by Jinja2's
autoescaping) and `frameworks.md` (a CI job summary; every string escaped for Markdown), beside
`frameworks.json` (the rows as data). In both, acting characters (a bidi override, an escape sequence) in a
runtime's or a framework's words are shown as escapes, as in a run's report."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from ..errors import printable
from ..report.report import _templates
from ..report.report_text import md
from .rows import Row

COLUMNS = ("framework", "policy", "export path (fallbacks)", "opset / IR", "non-standard ops", "dynamic batch",
           "export parity vs framework", "targets", "--assist fixes")


def write(rows: list[Row], out: Path, run_options: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (out / "frameworks.json").write_text(json.dumps(
        {"created": created, "settings": run_options, "rows": [row.as_dict() for row in rows]}, indent=1))
    (out / "frameworks.md").write_text(markdown(rows, run_options))
    html = _templates().get_template("frameworks.html.j2").render(rows=rows, run_options=run_options, created=created)
    (out / "index.html").write_text(printable(html))  # the page's own text holds none (as report.render_html)


def markdown(rows: list[Row], run_options: dict) -> str:
    lines = ["## RL frameworks: default policies through their documented export, on every target", "",
             md(f"targets: {run_options['targets']}; variants: {run_options['variants']}; "
                 f"{run_options['episodes']} episodes per task, seed {run_options['seed']}"), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(md(cell) if cell else "–" for cell in markdown_cells(row)) + " |")
    return "\n".join(lines) + "\n"


def markdown_cells(row: Row) -> list[str]:
    framework = f"{row.framework.split()[0]} ({row.version})" if row.version else row.framework
    if row.problem and not row.targets:
        return [framework, row.policy, row.export_path, "", "", "", "", f"not measured: {row.problem}", ""]
    export = row.export_path + (f" (fallback: {'; '.join(row.fallbacks)})" if row.fallbacks else "")
    custom = ", ".join(row.nonstandard_ops) or "none"
    if row.external_data:
        custom += "; weights in an external-data file"
    parity = f"{row.parity_verdict} {row.parity}".strip() + (f"; returns: {row.returns}" if row.returns else "")
    policy = f"{row.policy} ({row.task}" + ("; cached build)" if row.build else ")")
    return [framework, policy, export, row.opset, custom, row.dynamic_batch, parity,
            row.summary(), "; ".join(row.fixes())]
