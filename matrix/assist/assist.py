"""After the cells: explain failures, find where drifting cells diverge, try preparations on failing ones.

One call from the run (`after_cells`), once every cell is judged:
- always (cheap): known runtime/converter messages of FAILed cells get their cause
  and the nodes involved as an extra reason (messages.py);
- `--diagnose`: cells that FAIL or WARN on drift, on targets that run the ONNX
  graph as is, get their first divergent node (diagnose.py);
- `--assist`: FAILed cells try the graph preparations (preparations.py).
Results land on each cell (`diagnosis`, `fixes`) in results.json; results.jsonl
keeps the cells as they were first judged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import targets as registry

from ..run import cells, guarded
from . import diagnose, preparations
from .. import messages
from ..errors import console_text as escape
from ..judge import rules
from ..judge.judge import Evidence, Judge
from ..inputs.model import ModelInfo
from ..run.protocol import CellInputs
from ..reference import SOURCE_TARGET
from ..results import Cell, RunResults

if TYPE_CHECKING:  # a -q run's console is no rich one, and loads no rich (matrix.cli.cli.QuietConsole)
    from rich.console import Console


@dataclass
class AssistContext:
    model: ModelInfo
    template: CellInputs  # what every cell of the run shares
    judge: Judge  # the run's: a fix attempt is judged like the cell it tries to fix
    evidence: Evidence  # the float64 reference and the development runtime's outputs (no rollout: fixes drive no episodes)
    out: Path
    limits: guarded.Limits
    env_for: object  # Services.env_for: the run's shared services (one browser)
    candidates: dict[str, ModelInfo] = field(default_factory=dict)  # --candidate, by file name

    def model_of(self, cell: Cell) -> ModelInfo:
        """The model the cell ran: the first one, or its candidate."""
        return self.candidates[cell.candidate] if cell.candidate else self.model


def after_cells(results: RunResults, context: AssistContext, diagnose_cells: bool, assist: bool, console: Console) -> None:
    for cell in results.cells:
        _explain(cell, context.model_of(cell))
        _explain_drift(cell, context.model_of(cell))
    # Diagnosis and preparations rerun the first model (the context's): a candidate's cells are not what
    # they would explain. Both run under the cell's own settings. The --source column is the training
    # framework, not a runtime: no graph preparation changes what it computes.
    runtime_cells = [c for c in results.cells if c.target != SOURCE_TARGET]
    if diagnose_cells:
        for cell in [c for c in runtime_cells if c.configuration.first_model_as_exported and diagnose.wants_diagnosis(c)]:
            _diagnose(cell, context, console)
    if assist:
        for cell in [c for c in runtime_cells if c.configuration.first_model_as_exported and preparations.wants_fixes(c)]:
            _fix(cell, context, console)
        results.run_options["assist"] = True  # the decision then says what it found, never "try --assist"
    for cell in (c for c in runtime_cells if c.candidate):  # said where it would have run, not left to silence
        _say_not_run_on_candidate(cell, diagnose_cells, assist)


def _say_not_run_on_candidate(cell: Cell, diagnose_cells: bool, assist: bool) -> None:
    rerun = f"run it with {cell.candidate} as the model"
    if diagnose_cells and diagnose.wants_diagnosis(cell):
        cell.reasons.append(f"diagnosis: not made for a candidate (--diagnose follows the first model's graph "
                            f"through its float64 intermediates); {rerun}")
    if assist and preparations.wants_fixes(cell):
        cell.reasons.append(f"fix: none tried on a candidate (--assist prepares the first model's graph); {rerun}")


def _explain(cell: Cell, model: ModelInfo) -> None:
    if cell.verdict != "FAIL" or cell.error is None:
        return
    line = messages.explain(cell.target, cell.error.message, model.proto)
    if line:
        cell.reasons.append(line)


def _explain_drift(cell: Cell, model: ModelInfo) -> None:
    """A known cause of drift read from the cell's model (the first or a candidate, as given) and this host."""
    ran_here_as_given = not (cell.configuration.preparation or cell.configuration.device)
    if not (ran_here_as_given and diagnose.wants_diagnosis(cell)):
        return
    from . import int8_weights  # here: a plain run, where nothing drifts, never imports it

    line = int8_weights.saturation_reason(cell, model.proto)
    if line:
        cell.reasons.append(line)


def _diagnose(cell: Cell, context: AssistContext, console: Console) -> None:
    target = registry.get(cell.target)
    if not target.runs_onnx_as_is:
        cell.reasons.append(f"diagnosis: {cell.target} converts the graph, so its intermediates are not exposed here")
        return
    console.print(f"[bold]diagnose[/]: {escape(cell.configuration.label)}: intermediates against float64", highlight=False)
    folder = context.out / "diagnosis" / _cell_slug(cell)
    try:
        cell.diagnosis = diagnose.diagnose_cell(cell, context.template, context.model, folder, context.env_for(target),
                                                context.limits, context.out / "cells" / cell.configuration.dir_name / "outputs.npz")
    except Exception as error:  # the tool's own failure: said once, the cell's verdict stands
        cell.reasons.append(f"diagnosis could not be made (policy-matrix): {type(error).__name__}: {error}")
        return
    line = diagnose.reason(cell.diagnosis)
    if line:
        cell.reasons.append(line)


def _fix(cell: Cell, context: AssistContext, console: Console) -> None:
    console.print(f"[bold]assist[/]: {escape(cell.configuration.label)}: trying graph preparations", highlight=False)
    target = registry.get(cell.target)
    folder = context.out / "fixes" / _cell_slug(cell)

    try:
        env = context.env_for(target)
        cell.fixes = preparations.try_fixes(cell, context.model, context.template, fix_judge(context, target.predicts),
                                            folder, context.out, env, context.limits)
    except Exception as error:  # the tool's own failure, never the runtime's verdict
        cell.reasons.append(f"graph preparations could not be tried (policy-matrix): {type(error).__name__}: {error}")
        return
    # A WARN is no fix to stop at (preparations.FIXED) but one the decision ships when nothing better came of it.
    fixed = next((f for f in cell.fixes if f.verdict in preparations.FIXED), None) or \
        next((f for f in cell.fixes if f.verdict == "WARN"), None)
    if fixed:
        judged_on = f"; {rules.FIX_JUDGED_ON}" if context.template.rollout else ""
        warned = "".join(f"; {reason}" for reason in fixed.reasons) if fixed.verdict == "WARN" else ""
        cell.reasons.append(f"fix: {fixed.preparation} makes it {fixed.verdict} ({rules.PREPARED_GRAPH}{fixed.prepared_onnx}"
                            f"{warned}{judged_on})")
    elif cell.fixes:
        cell.reasons.append(f"fix: none found by --assist (tried: {', '.join(f.preparation for f in cell.fixes)})")
    else:
        cell.reasons.append("fix: none found by --assist (no graph preparation applies to this graph)")


def fix_judge(context: AssistContext, predicts: bool):
    """How a fix attempt is judged: by the run's Judge, against the run's evidence, with the prepared model's
    interface (a preparation may change it: argmax-cut returns the logits)."""
    def judge(outcome: cells.CellOutcome, failing: Cell, info: ModelInfo) -> Cell:
        evidence = replace(context.evidence, model=info)
        return context.judge.cell(outcome, evidence, host=failing.host, target=failing.target, variant=failing.variant,
                                  predicts=predicts)
    return judge


def _cell_slug(cell: Cell) -> str:
    """A folder name per cell of the first model: its settings are part of it (each runs under its own)."""
    return _slug("-".join(part for part in (cell.host, cell.target, cell.variant, cell.configuration.settings_label) if part))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)
