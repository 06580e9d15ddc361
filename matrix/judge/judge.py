"""One Judge per run: the run's judging options, built once and passed to every place that judges.

Cells, fix attempts (assist.py), candidates and pinned releases are judged by the
same Judge, so an option such as `--tie-margin` cannot be honoured in one place
and forgotten in another. What the cell is compared with (the float64
reference, the development runtime's outputs, the reference's rollout) is the
run's `Evidence`. The rules themselves are matrix/judge/rules.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ..inputs import contract
from ..inputs.contract import CONTRACT_BATCHES
from . import metrics, rules
from ..run import rollouts
from ..inputs.model import ModelInfo
from ..inputs.observations import Feeds
from ..run.protocol import DONE, START, STAGES_AFTER_PARITY, Measurement
from ..reference.reference import Reference
from ..results import Cell, CellError
from ..inputs.observation_sources import ObservationSource, SYNTHETIC


@dataclass(frozen=True)
class Evidence:
    """What every cell of the run is compared with."""

    model: ModelInfo
    reference: Reference
    dev_runtime: Feeds | None = None  # ORT CPU fp32 outputs, the development runtime's
    reference_rollout: rollouts.ReferenceRollout | None = None
    rollout_plan: rollouts.RolloutPlan | None = None


@dataclass(frozen=True)
class Judge:
    tolerances: rules.Tolerances = field(default_factory=rules.Tolerances)
    tie_margin: float = rules.DEFAULT_TIE_MARGIN
    min_agreement: float = rules.DEFAULT_MIN_AGREEMENT
    return_tolerance: rules.ReturnTolerance = field(default_factory=rules.ReturnTolerance)
    observations: ObservationSource = ObservationSource(SYNTHETIC, "synthetic rows")
    # What each model of the run computes in as given (graph_facts.computes_in), by the cells' `candidate`
    # ("": the first model); a model not named computes in fp32.
    model_precisions: Mapping[str, str] = field(default_factory=dict)
    # The models whose graph as given quantizes activations per call (ORT's dynamic int8), by the cells' `candidate`.
    per_call_models: frozenset[str] = frozenset()

    def context(self, target: str, variant: str, candidate: str = "") -> rules.Context:
        """The rules' view of one cell of the model `candidate` names. A pinned release (ort-cpu@1.20.1) takes its own
        tolerance keys first, then ort-cpu's; the defaults are those of the variant, or of the model's own precision
        where that is lower (a user's fp16 model rounds every activation to fp16 in its as-given cell, whoever runs
        it, and so does a user's fp16 candidate)."""
        defaults_of = self.own_precision(variant, candidate) or variant
        return rules.Context(tolerance=self.tolerances.get(target, variant, defaults_of), min_agreement=self.min_agreement,
                             tie_margin=self.tie_margin, return_tolerance=self.return_tolerance,
                             synthetic_inputs=self.observations.synthetic)

    def own_precision(self, variant: str, candidate: str = "") -> str | None:
        """The precision the model `candidate` names computes in as given, where it is lower than the variant's."""
        order, precision = rules.PRECISION_ORDER, self.model_precisions.get(candidate, "fp32")
        return precision if variant in order and order.index(precision) > order.index(variant) else None

    def precision_note(self, target: str, variant: str, candidate: str = "") -> str | None:
        """What a cell of a model computing below its variant's precision was judged at: that precision's tolerance,
        or the user's --tolerance where one was given (it wins over any default)."""
        own = self.own_precision(variant, candidate)
        if not own:
            return None
        why = f"{candidate or 'the model'} computes in {own} as given"
        atol_key, rtol_key = self.tolerances.given_keys(target, variant)
        if not atol_key and not rtol_key:
            return f"judged at {own}'s tolerance: {why}"
        used = self.context(target, variant, candidate).tolerance
        atol = f"atol {used.atol:g} (given for {atol_key})" if atol_key else f"{own}'s atol {used.atol:g}"
        rtol = f"rtol {used.rtol:g} (given for {rtol_key})" if rtol_key else f"{own}'s rtol {used.rtol:g}"
        return f"judged at {atol} and {rtol}: {why}"

    def run_options(self) -> dict:
        """The run's options that say how cells were judged."""
        return {"tolerances": self.tolerances.overrides, "rtol": self.tolerances.rtol_overrides,
                "tie_margin": self.tie_margin, "min_agreement": self.min_agreement}

    def quantizes_per_call(self, cell: Cell, candidate: str = "") -> bool:
        """Whether the cell quantizes activations with one scale over each call's batch, so that its answer depends on
        the batch by design: its artifact says so (`per_call_ops`: onnxruntime's dynamic int8), or the model `candidate`
        names does as given. Fixed scales (a static QDQ model, LiteRT's full-integer int8), per-row scales (LiteRT's
        dynamic range) and weight-only int8 (Core ML) do not, and are judged as fp32's batch handling is."""
        counted = (cell.artifact.quantization if cell.artifact else None) or {}
        return counted.get("per_call_ops", 0) > 0 or candidate in self.per_call_models

    def cell(self, outcome, evidence: Evidence, *, host: str, target: str, variant: str, predicts: bool,
             candidate: str = "") -> Cell:
        """What the worker measured (a cells.CellOutcome) on the model `candidate` names, judged."""
        context = self.context(target, variant, candidate)
        m = _unfinished(outcome.measurement, outcome.duration_s)
        cell = Cell(
            host=host, target=target, variant=variant, verdict="SKIP", predicts=predicts,
            runtime_version=m.runtime_version, artifact=m.artifact, latency=m.latency, cold_start_ms=m.cold_start_ms,
            placement=m.placement, backend=m.backend, error=m.error, tolerance=context.tolerance.atol,
            rtol=context.tolerance.rtol, duration_s=outcome.duration_s, notes=m.notes,
        )
        if m.skip is not None:
            cell.reasons = [m.skip]
            return cell
        if note := self.precision_note(target, variant, candidate):
            cell.notes.append(note)
        if predicts and _measured_parity(cell.error, outcome.arrays):
            cell.parity = parity(outcome.arrays, evidence, context)
            computes_in = self.own_precision(variant, candidate) or variant
            steps = cell.artifact.output_steps if cell.artifact else {}
            cell.contract = contract.check(evidence.model, outcome.arrays, evidence.reference.outputs, computes_in, steps,
                                           context.tolerance)
            cell.rollout = rollouts.summarise(m.rollout, outcome.arrays, evidence.reference_rollout, evidence.rollout_plan)
            if not self.quantizes_per_call(cell, candidate):
                context = replace(context, batch_drifts=batch_dependence(outcome.arrays, evidence, context))
        cell.verdict, cell.reasons = rules.verdict(cell, context)
        return cell


def batch_dependence(arrays: dict, evidence: Evidence, context: rules.Context) -> tuple[rules.BatchDrift, ...]:
    """Outputs whose observation 0 is right alone (the contract's batch-1 run) and wrong in the parity batch: the
    runtime's answer depends on the batch it runs in (rules.batch_sizes says what that means). Right is within
    tolerance for a continuous output; for a discrete one (metrics.parity's kinds) it is no flip above the tie margin."""
    found = []
    for name, expected in evidence.reference.outputs.items():
        alone, batched = arrays.get(f"batch1/{name}"), arrays.get(f"outputs/{name}")
        if alone is None or batched is None or batched.shape != expected.shape:
            continue
        axis = evidence.model.batch_axes.get(name, 0)
        if expected.ndim <= axis or expected.shape[axis] < 2 or alone.shape != _rows(expected, 1, axis).shape:
            continue
        margins = _same_shape(evidence.reference.margins.get(name), expected)
        decisive = None  # a continuous output's
        if expected.dtype.kind in "iub" or margins is not None:  # a discrete one's decisions that are not near ties
            decisive = margins > context.tie_margin if margins is not None else np.ones(expected.shape, bool)

        def miss(rows: int, got: np.ndarray) -> tuple[float, bool]:
            judged = None if decisive is None else np.take(decisive, range(rows), axis=axis)
            return _miss(got, _rows(expected, rows, axis), judged, context.tolerance)

        def row_miss(row: int, got: np.ndarray) -> tuple[float, bool]:
            judged = None if decisive is None else np.take(decisive, [row], axis=axis)
            return _miss(np.take(got, [row], axis=axis), np.take(expected, [row], axis=axis).astype(np.float64), judged,
                         context.tolerance)

        runs = {1: alone} | {rows: got for rows in CONTRACT_BATCHES[1:] if rows <= expected.shape[axis]  # fewer: tiled
                             if (got := arrays.get(f"batch{rows}/{name}")) is not None
                             and got.shape == _rows(expected, rows, axis).shape}
        seen = _observation_in_two_batches(runs, batched, batched.shape[axis], row_miss, decisive is not None)
        if seen is None:
            continue
        small = {rows: miss(rows, got) for rows, got in runs.items() if rows > 1}
        found.append(rules.BatchDrift(
            name, seen["right"][1], seen["wrong"][1], batched.shape[axis], {rows: size for rows, (size, _) in small.items()},
            tuple(rows for rows, (_, beyond) in small.items() if beyond), decisive is not None, seen["row"],
            seen["right"][0], seen["wrong"][0], miss(batched.shape[axis], batched)[1]))
    return tuple(found)


def _observation_in_two_batches(runs: dict[int, np.ndarray], batched: np.ndarray, parity_rows: int, row_miss,
                                discrete: bool) -> dict | None:
    """An observation right in one batch and wrong in another: observation 0 right alone (batch 1) and wrong in the
    parity batch, else the first of the contract's rows (batch 2: 0-1, batch 7: 0-6) whose answer changes between the
    batches it ran in (onnx2tf's conversion of a two-input DQN head: observation 0 right everywhere, 1 flipped in the
    batch of 2 and right in the batch of 7); a decision only, whose flip is beyond its margin, where a continuous row
    near its tolerance could cross it from one batch's rounding to another's. None where observation 0 is wrong
    alone: that is batch 1's own drift. {"row", "right": (batch, size), "wrong": (batch, size)}."""
    alone, in_batch = row_miss(0, runs[1]), row_miss(0, batched)
    if alone[1]:  # wrong alone: the drift batch 1 has, which the episodes measured
        return None
    if in_batch[1]:
        return {"row": 0, "right": (1, alone[0]), "wrong": (parity_rows, in_batch[0])}
    for row in range(max(runs) if discrete else 0):
        measured = [(rows, row_miss(row, got)) for rows, got in runs.items() if row < rows] + [(parity_rows, row_miss(row, batched))]
        right = [(rows, size) for rows, (size, wrong) in measured if not wrong]
        wrong = [(rows, size) for rows, (size, wrong) in measured if wrong]
        if right and wrong:
            return {"row": row, "right": right[0], "wrong": wrong[0]}
    return None


def _rows(values: np.ndarray, rows: int, axis: int) -> np.ndarray:
    return np.take(values, range(rows), axis=axis).astype(np.float64)


def _miss(actual: np.ndarray, expected: np.ndarray, decisive: np.ndarray | None, tolerance: rules.Tolerance) -> tuple[float, bool]:
    """(how far `actual` is from `expected`, whether that is wrong). Continuous (`decisive` None): max |error| (NaN
    counts as infinite), wrong beyond atol + rtol |expected| anywhere. Discrete: the flips on decisions that are not
    near ties (`decisive`), wrong when there is one."""
    if decisive is not None:
        flips = int(np.sum((actual != expected) & decisive))
        return float(flips), flips > 0
    error = np.abs(actual.astype(np.float64) - expected)
    if not error.size:
        return 0.0, False
    beyond = ~(error <= tolerance.atol + tolerance.rtol * np.abs(expected))
    return float(np.max(np.where(np.isnan(error), np.inf, error))), bool(beyond.any())


def _unfinished(measurement: Measurement, duration_s: float) -> Measurement:
    """A worker that left its measurements but never finished (killed, timed out, crashed hard)
    failed in the stage it had entered; what it measured before that is kept."""
    if measurement.stopped_itself or measurement.stage in (START, DONE):
        return measurement
    stage = measurement.stage
    message = f"the worker stopped during {stage} after {duration_s:.1f} s (killed on timeout or out of memory, or crashed)"
    return measurement.model_copy(update={"error": CellError(stage=stage, message=message)})


def _measured_parity(error: CellError | None, arrays: dict) -> bool:
    """Parity and the contract stand when the cell got past its parity run, whatever failed later."""
    return error is None or (error.stage in STAGES_AFTER_PARITY and any(k.startswith("outputs/") for k in arrays))


def parity(arrays, evidence: Evidence, context: rules.Context):
    """Every output's parity against the float64 reference (and the development runtime), by the context's tolerance."""
    reference, dev_runtime = evidence.reference, evidence.dev_runtime
    return [
        metrics.parity(
            name, arrays[f"outputs/{name}"], expected,
            _same_shape(dev_runtime.get(name) if dev_runtime else None, expected),
            reference.margins.get(name), context.tie_margin, context.tolerance,
        )
        for name, expected in reference.outputs.items()
        if f"outputs/{name}" in arrays and arrays[f"outputs/{name}"].shape == expected.shape
    ]


def _same_shape(array: np.ndarray | None, expected: np.ndarray) -> np.ndarray | None:
    return array if array is not None and array.shape == expected.shape else None
