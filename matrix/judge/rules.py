"""The verdict rules, all of them: PASS / WARN / FAIL / SKIP / CONVERTED.

Each rule is a small function `rule(cell, context) -> Findings` (failures,
warnings, notes), registered in RULES; `verdict` runs them in that order. The
README's "Verdicts" section states the same list. The decision's quality
filters (decide.py) ask the same rules.

- worker_error: a stage that failed after parity was measured FAILs the cell
  (reading placement, the tool's extra step, only WARNs).
- backend: ONE fallback rule for every runtime: the requested backend is not
  there (the session runs on another one) -> FAIL; nothing ran on it (every
  node fell back) -> WARN; some nodes fell back -> WARN; the runtime said nothing
  of where it ran (targets.base.UNREAD) -> WARN. The cell names what ran where.
- contract: a broken action contract FAILs.
- behaviour: with closed-loop episodes, the paired per-seed return difference
  decides: worse than the return tolerance with confidence -> FAIL; an interval
  that cannot rule that out -> WARN; a better return never warns, except in the source column
  (Context.returns_both_ways), where the cell is the training framework and the reference is the
  exported graph: a framework better than its export is the export behaving worse, judged alike.
- drift: continuous outputs, |y - y_ref| <= atol + rtol * |y_ref| per element
  (numpy's allclose); above it FAIL, above half of it WARN. Judged only where
  no behaviour was measured; otherwise shown as information.
- agreement: discrete outputs; near ties (reference margin <= tie margin) are
  left out of agreement entirely; any flip WARNs, flips that bring agreement
  below the minimum FAIL; every row a near tie WARNs (agreement not measured:
  no row could confirm the runtime). Judged only where no behaviour was measured.
- batch_sizes: an output whose observation 0 is right alone (batch 1) and wrong in the parity batch, or else one
  of the first 7 observations' decisions right in one batch and wrong in another (continuous: beyond tolerance; discrete: a
  flip above the tie margin) (not int8: dynamic quantization scales each call's batch): where behaviour was measured (the episodes run at batch 1) it WARNs, naming the batch sizes where it is
  wrong; elsewhere it names that cause of the drift or flips.
- unquantized_int8: an "int8" artifact with nothing quantized WARNs (and never ships).
- workarounds: a conversion workaround the tool applied is listed (no verdict).
A cell whose drift or agreement was judged on synthetic observations says so in its reasons.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field

from ..errors import InputError

PRECISION_ORDER = ("fp32", "fp16", "int8")  # each computes less exactly than the one before
DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "int8": 2.5e-1}  # atol: absolute max |y - y_ref|
# rtol: the share of |y_ref| added to atol. fp32 ~ a few dozen float32 roundings; fp16 ~ one fp16 step
# (2^-10); int8 one percent of the value on top of its absolute quantization error.
DEFAULT_RTOL = {"fp32": 1e-5, "fp16": 1e-3, "int8": 1e-2}
WARN_FRACTION = 0.5
DEFAULT_TIE_MARGIN = 1e-3
DEFAULT_MIN_AGREEMENT = 0.99
DEFAULT_RETURN_TOLERANCE = 0.05
RETURN_FLOOR = 1.0  # a relative return tolerance scales max(|reference mean return|, this)
# A mean paired return difference this small, relative to max(|reference mean return|, RETURN_FLOOR), is float noise
# (numpy.isclose's default rtol): returns summed from float32 rewards of near-identical states; equal, never worse
RETURN_NOISE = 1e-5
RETURN_NOISE_RULE = f"within float noise of it ({RETURN_NOISE:g} of max(|reference mean|, {RETURN_FLOOR:g}))"
# Stages after the parity run: their failure keeps the parity and contract measured before.
LATE_STAGE_WARNS = {"placement"}  # reading placement is the tool's extra step (e.g. a profiler), not inference
SYNTHETIC_INPUTS = "synthetic inputs: drift may come from states the policy never visits; pass --obs or --env"


# --- tolerances ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerance:
    """|y - y_ref| <= atol + rtol * |y_ref|, element by element (numpy's allclose, ONNX's own tests)."""

    atol: float
    rtol: float = 0.0

    def describe(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g}·|ref|" if self.rtol else f"atol {self.atol:g}"


class Tolerances:
    """Lookup order: target:variant, target:*, *:variant, the variant's default; atol and rtol each."""

    def __init__(self, overrides: dict[str, float] | None = None, rtol_overrides: dict[str, float] | None = None):
        self.overrides = overrides or {}  # atol per key
        self.rtol_overrides = rtol_overrides or {}

    @classmethod
    def parse(cls, specs: list[str], base: dict[str, float] | None = None) -> "Tolerances":
        """TARGET:VARIANT=ATOL[,rtol=RTOL] (or rtol=RTOL alone); `base`: the config file's atol table."""
        overrides = {_normalise(key): value for key, value in (base or {}).items()}
        rtols: dict[str, float] = {}
        for spec in specs:
            key, sep, values = spec.partition("=")
            if not sep:
                raise InputError(f"--tolerance {spec!r}: expected TARGET:VARIANT=VALUE, e.g. ort-cpu:int8=0.3")
            for part in values.split(","):
                name, is_rtol, value = part.strip().rpartition("rtol=")
                try:
                    number = float(value)
                except ValueError:
                    raise InputError(f"--tolerance {spec!r}: expected TARGET:VARIANT=VALUE, e.g. ort-cpu:int8=0.3 "
                                     "or ort-cpu:fp32=1e-4,rtol=1e-3") from None
                if name:
                    raise InputError(f"--tolerance {spec!r}: expected TARGET:VARIANT=ATOL[,rtol=RTOL]")
                (rtols if is_rtol else overrides)[_normalise(key)] = number
        return cls(overrides, rtols)

    def get(self, target: str, variant: str, defaults_of: str | None = None) -> Tolerance:
        """The cell's atol and rtol: overrides by `variant`, else the defaults of `defaults_of` (the variant's own)."""
        defaults_of = defaults_of or variant
        atol = _lookup(self.overrides, target, variant, DEFAULT_TOLERANCE, defaults_of)
        return Tolerance(atol, _lookup(self.rtol_overrides, target, variant, DEFAULT_RTOL, defaults_of))

    def given_keys(self, target: str, variant: str) -> tuple[str | None, str | None]:
        """The user's keys that set this cell's (atol, rtol), None for each taken from the defaults."""
        return _given_key(self.overrides, target, variant), _given_key(self.rtol_overrides, target, variant)


def _lookup(overrides: dict[str, float], target: str, variant: str, defaults: dict[str, float], defaults_of: str) -> float:
    key = _given_key(overrides, target, variant)
    return overrides[key] if key else defaults.get(defaults_of, defaults["fp32"])


def _given_key(overrides: dict[str, float], target: str, variant: str) -> str | None:
    """A pinned release's own keys (`ort-cpu@1.20.1:fp32`, `ort-cpu@1.20.1`) first, then its target's, then any target's."""
    base = target.partition("@")[0]
    names = [target, base] if base != target else [target]
    keys = (*(f"{name}:{variant}" for name in names), *(f"{name}:*" for name in names), f"*:{variant}")
    return next((key for key in keys if key in overrides), None)


def _normalise(key: str) -> str:
    key = key.strip()
    if ":" in key:
        return key
    return f"*:{key}" if key in DEFAULT_TOLERANCE else f"{key}:*"


# Under --env, a fix attempt (--assist) runs the prepared graph on the run's observations (the states the reference
# visited) and drives no episodes: an ArgMax head cut leaves the argmax to the host, which the worker's episode loop
# does not do, and every attempt would cost a whole cell's episodes. Its words, wherever a fix is shown:
FIX_JUDGED_ON = "judged on drift, not on return: --assist drives no episodes"


@dataclass(frozen=True)
class ReturnTolerance:
    """How much worse a cell's mean return may be than the reference's: relative (default) or absolute."""

    value: float = DEFAULT_RETURN_TOLERANCE
    relative: bool = True

    @classmethod
    def parse(cls, text: str) -> "ReturnTolerance":
        """`5%` or `0.05` (a fraction of |reference mean return|, at most 1), `abs:10` (return units)."""
        body = text.strip()
        relative = not body.startswith("abs:")
        body = body.removeprefix("abs:")
        percent = relative and body.endswith("%")
        try:
            value = float(body.removesuffix("%")) / (100.0 if percent else 1.0)
        except ValueError:
            raise InputError(f"--return-tolerance {text!r}: expected e.g. 5%, 0.05 or abs:10") from None
        if not math.isfinite(value) or value < 0:
            raise InputError(f"--return-tolerance {text!r}: must be a non-negative number")
        if relative and not percent and value > 1:
            raise InputError(f"--return-tolerance {text!r}: a bare number is a fraction (at most 1); "
                             f"write {body}% for a percentage or abs:{body} in return units")
        return cls(value, relative)

    def in_return_units(self, reference_mean: float) -> float:
        return self.value * max(abs(reference_mean), RETURN_FLOOR) if self.relative else self.value

    def describe(self) -> str:
        if self.relative:
            return f"{self.value:.3g} of |reference mean return| (floor {RETURN_FLOOR:g})"
        return f"{self.value:g} return units"


# --- what a rule sees and says -------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    """What the run's Judge says about one cell: its tolerances, and where its inputs came from."""

    tolerance: Tolerance = Tolerance(DEFAULT_TOLERANCE["fp32"], DEFAULT_RTOL["fp32"])
    min_agreement: float = DEFAULT_MIN_AGREEMENT
    tie_margin: float = DEFAULT_TIE_MARGIN
    return_tolerance: ReturnTolerance = ReturnTolerance()
    synthetic_inputs: bool = False  # parity measured on seeded rows, not the policy's own states
    batch_drifts: tuple[BatchDrift, ...] = ()  # outputs whose answer depends on the batch they run in
    # The source column: the cell is the framework, the reference its export, and the question is whether the export
    # behaves as the policy it came from; a framework doing better than its export is the export's loss, not luck.
    returns_both_ways: bool = False


@dataclass(frozen=True)
class BatchDrift:
    """An output whose answer for one observation depends on the batch it runs in: observation `row` is right in the
    batch of `right_in` (observation 0 alone, the contract's batch-1 run, where it can tell) and wrong in the batch of
    `batch`. A continuous output's sizes are max |error|, a discrete one's (`discrete`) are flips above the tie margin."""

    output: str
    alone: float  # the observation's size where it is right
    in_batch: float  # its size where it is wrong
    batch: int  # the parity batch's size
    small_batches: dict[int, float]  # the size over the rows of each contract batch above 1 the set has
    small_beyond: tuple[int, ...]  # those of them wrong
    discrete: bool = False
    row: int = 0
    right_in: int = 1  # the batch the observation is right in
    wrong_in: int = 0  # the batch it is wrong in: 0 for the parity batch
    batch_wrong: bool = True  # whether the parity batch is wrong anywhere

    def wrong_batch(self) -> int:
        return self.wrong_in or self.batch

    def size(self, value: float) -> str:
        if not self.discrete:
            return f"{value:.2g}"
        return "1 flip" if value == 1 else f"{value:.0f} flips"

    def where_right(self) -> str:
        return "alone (batch 1)" if self.right_in == 1 else f"in the batch of {self.right_in}"


@dataclass
class Findings:
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # information in the reasons; never changes the verdict


def worker_error(cell, context: Context) -> Findings:
    if not cell.error:
        return Findings()
    reason = f"{cell.error.stage}: {cell.error.message} (parity and contract measured before)"
    return Findings(warnings=[reason]) if cell.error.stage in LATE_STAGE_WARNS else Findings(failures=[reason])


def backend(cell, context: Context) -> Findings:
    """Requested backend absent -> FAIL; where it ran unread -> WARN (the tool could not see it, the runtime did not
    show it missing)."""
    from targets.base import UNREAD  # the targets' word; imported here, not on the command line's way to --help

    info = cell.backend
    if info and info.actual == UNREAD:
        return Findings(warnings=[f"requested {info.requested}; where it ran could not be read: {info.detail}".strip()])
    if info and info.actual != info.requested:
        return Findings(failures=[f"requested {info.requested} but ran on {info.actual}: the requested backend is not "
                                  f"there. {info.detail}".strip()])
    return Findings()


def fallback(cell, context: Context) -> Findings:
    """Every node elsewhere -> WARN; some nodes elsewhere -> WARN. Its own rule, after the ones about the actions:
    where nodes ran costs speed, a drift or a batch that changes the actions costs behaviour, and the grid shows a
    cell's first reason."""
    moved = [row for row in cell.placement if row.fallback]
    if not moved:
        return Findings()
    where = ", ".join(sorted({row.where for row in moved}))
    requested = cell.backend.requested if cell.backend else "the requested backend"
    if len(moved) == len(cell.placement):
        return Findings(warnings=[f"nothing ran on {requested}: every node ({len(moved)}) fell back to {where}"])
    nodes = "1 node" if len(moved) == 1 else f"{len(moved)} nodes"
    return Findings(warnings=[f"{nodes} of {len(cell.placement)} fell back to {where}"])


def contract(cell, context: Context) -> Findings:
    return Findings(failures=[f"contract: {c.name}: {c.detail}" for c in cell.contract if c.ok is False])


def behaviour(cell, context: Context) -> Findings:
    """Paired per-seed return differences: FAIL when worse than the tolerance with confidence, WARN when
    the interval cannot rule that out; a return at or above the reference's, or within float noise of it
    (RETURN_NOISE), never warns: one episode has no interval, and -1.8e-08 is no worse return. In the source
    column (returns_both_ways) a framework better than its export is judged the same way, as the export's loss."""
    if not behaviour_measured(cell):
        return Findings()
    rollout = cell.rollout
    interval = return_interval(rollout)
    allowed = context.return_tolerance.in_return_units(rollout.reference_mean_return)
    what = (f"behaviour: mean return {rollout.mean_return:.4g} vs reference {rollout.reference_mean_return:.4g}, "
            f"paired difference {interval.describe()}; tolerance {allowed:.4g} ({context.return_tolerance.describe()})")
    noise = ReturnTolerance(RETURN_NOISE).in_return_units(rollout.reference_mean_return)
    found = _beyond(interval, allowed, noise, what, "worse")
    if context.returns_both_ways and not (found.failures or found.warnings):
        found = _beyond(interval.negated(), allowed, noise, what, "better", EXPORT_BEHAVES_WORSE)
    return found


EXPORT_BEHAVES_WORSE = ": the exported graph behaves worse than the policy it was exported from"


def _beyond(interval, allowed: float, noise: float, what: str, direction: str, consequence: str = "") -> Findings:
    """FAIL when the whole interval lies beyond the tolerance in `direction`, WARN when its mean lies that way (past
    float noise) and the interval cannot rule the tolerance out."""
    if interval.high < -allowed:
        return Findings(failures=[f"{what}: {direction} beyond the tolerance{consequence}"])
    if interval.mean < -noise and interval.low < -allowed:
        return Findings(warnings=[f"{what}: cannot rule out {direction} beyond the tolerance{consequence}"])
    return Findings()


def drift(cell, context: Context) -> Findings:
    found = Findings()
    for p in (p for p in cell.parity if p.kind == "continuous"):
        used = p.tolerance_used if p.tolerance_used is not None else share(p.max_abs, context.tolerance.atol)
        line = f"{p.output}: drift {p.max_abs:.3g} (max rel {p.max_rel:.2g})"
        if used > 1:
            found.failures.append(f"{line} above tolerance {context.tolerance.describe()}")
        elif used > WARN_FRACTION:
            found.warnings.append(f"{line} above half the tolerance {context.tolerance.describe()}")
    return _on_states(cell, context, found)


def agreement(cell, context: Context) -> Findings:
    found = Findings()
    for p in (p for p in cell.parity if p.kind == "discrete" and p.judged_rows == 0):  # nothing confirms the runtime
        found.warnings.append(f"{p.output}: agreement not measured: every row is a near tie (the reference's top-1 "
                              f"minus top-2 logit at most the tie margin {context.tie_margin:g})")
    for p in (p for p in cell.parity if p.kind == "discrete" and p.flips):
        counted = f"the {p.judged_rows} rows above the tie margin" if p.judged_rows is not None else "all rows"
        # near_ties counts disagreements on near ties, not the near-tie rows: 3 agreeing ones were said as "0 left out"
        flips = (f"{p.output}: {p.flips} action flips above the tie margin (agreement {100 * p.agreement:.1f}% over "
                 f"{counted}; {p.near_ties or 0} disagreements on near ties not counted)")
        if p.agreement < context.min_agreement:
            found.failures.append(f"{flips}, below the minimum agreement {100 * context.min_agreement:g}%")
        else:
            found.warnings.append(flips)
    return _on_states(cell, context, found)


def _on_states(cell, context: Context, found: Findings) -> Findings:
    """Single-step findings judge only where no behaviour was measured; a cell judged on synthetic rows says so."""
    if behaviour_measured(cell):
        return Findings(notes=[f"{line} (shown, not judged: the return decides)" for line in found.failures + found.warnings])
    if context.synthetic_inputs and cell.parity:
        found.notes.append(SYNTHETIC_INPUTS)
    return found


def batch_sizes(cell, context: Context) -> Findings:
    """Observation 0 right alone and wrong in a batch. Without behaviour, the drift rule has judged the batch and
    this names the cause; with behaviour, the return was measured at batch 1, where the episodes run, and says
    nothing of the batches a user steps several environments or robots in: it WARNs, naming them."""
    if not behaviour_measured(cell):
        return Findings(notes=[_batch_handling(found) for found in context.batch_drifts])
    return Findings(warnings=[_batches_unmeasured(found, context) for found in context.batch_drifts])


def _batch_handling(found: BatchDrift) -> str:
    small = ", ".join(f"batch {rows}: {found.size(size)}" for rows, size in found.small_batches.items())
    if found.discrete:
        seen = (f"observation {found.row} agrees {found.where_right()} and flips in the batch of {found.wrong_batch()} (flips "
                f"above the tie margin: {small or 'no smaller batch'})")
    else:
        seen = (f"observation {found.row} drifts {found.alone:.2g} {found.where_right()} and {found.in_batch:.2g} in the "
                f"batch of {found.wrong_batch()} ({small})")
    return (f"batch handling: {found.output}: {seen}: this runtime's answer for one observation depends on the batch it "
            f"runs in, so the {'flips come' if found.discrete else 'drift comes'} from batches above 1 (the conversion's "
            "batch handling); a graph exported at a fixed batch 1 runs each observation alone (--assist's simplify makes one)")


def _batches_unmeasured(found: BatchDrift, context: Context) -> str:
    sizes = sorted({*found.small_beyond, *([found.batch] if found.batch_wrong else [])})
    named = f"{', '.join(map(str, sizes[:-1]))} and {sizes[-1]}" if len(sizes) > 1 else str(sizes[0])
    small = ", of ".join(f"{rows}: {found.size(size)}" for rows, size in found.small_batches.items())
    rows = f"; the rows of batch {small}" if small else ""
    if found.discrete:
        wrong = (f"flips above the tie margin {context.tie_margin:g} at batch {named} (observation {found.row} agrees "
                 f"{found.where_right().removesuffix(' (batch 1)')} and flips in the batch of {found.wrong_batch()}{rows}), none at batch 1")
    else:
        wrong = (f"beyond tolerance {context.tolerance.describe()} at batch {named} (observation {found.row} drifts "
                 f"{found.alone:.2g} {found.where_right().removesuffix(' (batch 1)')}, {found.in_batch:.2g} in the batch of "
                 f"{found.wrong_batch()}{rows}), within it at batch 1")
    return (f"batch sizes: {found.output}: {wrong}, where the episodes ran and the return decided: a user who steps "
            "several environments or robots in one call gets actions the episodes never measured (a graph exported at "
            "a fixed batch 1 runs each observation alone: --assist's simplify makes one)")


def unquantized_int8(cell, context: Context) -> Findings:
    counted = cell.artifact.quantization if cell.artifact else None
    if cell.variant != "int8" or counted is None or counted.get("quantized_ops") or counted.get("quantized_weights"):
        return Findings()
    return Findings(warnings=[f"int8 artifact has nothing quantized ({counted.get('float_ops', 0)} weight ops stayed float)"])


# A note that starts so names a change the tool made so the runtime could run the model (a converter workaround,
# a fixed-batch copy): it is among the cell's reasons, and the decision ships that change, not the exported file.
WORKAROUND = "workaround: "
_SAVED = "; saved as "
PREPARED_GRAPH = "prepared graph: "  # a fix's reason names its file so (matrix.assist), relative to the report's folder


def workaround_note(change: str, exported_error: str, saved: list[str]) -> str:
    """e.g. "workaround: a fixed batch of 1 (the exported file fails: <the runtime's words>); saved as cells/…/x.onnx"."""
    return f"{WORKAROUND}{change} (the exported file fails: {exported_error}){_SAVED}{', '.join(saved)}"


def rebased_saved(note: str, rebase) -> str:
    """A workaround note with each file it saved named by `rebase(path)` (a merged report's folder is not the cell's)."""
    if not note.startswith(WORKAROUND) or _SAVED not in note:
        return note
    said, saved = note.split(_SAVED, 1)
    return f"{said}{_SAVED}{', '.join(rebase(path) for path in saved.split(', '))}"


def workaround(notes: list[str]) -> tuple[str, str]:
    """(the changes the tool made, what it saved) from a cell's notes; ("", "") when it made none. What it saved
    is its file, or the cell's folder where it saved one file per batch size (a fixed batch of 1, 2, 7 and 128):
    the first of them alone would name the batch-1 copy as the change that ships."""
    found = [note[len(WORKAROUND):] for note in notes if note.startswith(WORKAROUND)]
    changes = "; ".join(text.split(" (")[0] for text in found)
    saved = next((text.split(_SAVED, 1)[1].split(", ") for text in found if _SAVED in text), [""])
    return changes, saved[0] if len(saved) == 1 else f"{posixpath.dirname(saved[0])}/"


def workarounds(cell, context: Context) -> Findings:
    return Findings(notes=[note for note in (cell.artifact.notes if cell.artifact else []) if note.startswith(WORKAROUND)])


RULES = (worker_error, backend, contract, behaviour, drift, agreement, batch_sizes, fallback, unquantized_int8, workarounds)


def verdict(cell, context: Context) -> tuple[str, list[str]]:
    """The verdict and its reasons: failures, then warnings, then notes, each in RULES order."""
    if cell.error and not cell.parity:  # nothing measured to judge by
        return "FAIL", [f"{cell.error.stage}: {cell.error.message}"]
    if not cell.predicts:
        return "CONVERTED", ["conversion only: converted, nothing predicted on this host", *workarounds(cell, context).notes]
    found = [rule(cell, context) for rule in RULES]
    failures = [line for f in found for line in f.failures]
    warnings = [line for f in found for line in f.warnings]
    notes = list(dict.fromkeys(line for f in found for line in f.notes))  # the synthetic-inputs line once
    if failures:
        return "FAIL", failures + warnings + notes
    return ("WARN" if warnings else "PASS"), warnings + notes


# --- helpers the rules share with the record and the decision ---------------------------------------

def share(error, allowed):
    """error / allowed, elementwise or not: 0 where both are 0, inf where only the allowance is 0."""
    import numpy as np  # here, not at the top: the CLI reads this module's defaults before any command runs

    error, allowed = np.asarray(error, dtype=np.float64), np.asarray(allowed, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / allowed)
    return float(ratio) if ratio.ndim == 0 else ratio


def returns_judged(run_options: dict) -> bool:
    """Whether the run judged its cells on returns: --env's episodes. A --trajectory replay (open loop) has none:
    its cells are judged on drift over the trajectory's states, as a run without either is."""
    return (run_options.get("rollout") or {}).get("mode") == "closed-loop"


def behaviour_measured(cell) -> bool:
    rollout = cell.rollout
    return bool(rollout and rollout.mode == "closed-loop" and rollout.episodes)


def return_interval(rollout):
    """The paired per-seed return differences' interval (matrix/judge/stats.py, numpy: imported when judging)."""
    from . import stats

    return stats.paired_interval([e.episode_return for e in rollout.episodes], [e.reference_return for e in rollout.episodes])


def quality_misses(cell) -> list[str]:
    """Why a judged cell cannot be shipped: its verdict, and the rules that hold whatever the verdict."""
    if cell.verdict not in ("PASS", "WARN"):
        return [f"quality: {cell.verdict}" + (f" ({cell.reasons[0]})" if cell.reasons else "")]
    if contract(cell, Context()).failures:
        return ["quality: the action contract is broken"]
    if unquantized_int8(cell, Context()).warnings:
        return ["int8 in name only: nothing quantized"]
    return []
