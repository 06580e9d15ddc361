"""Regressions of a run (or merged runs) against a baseline, cell by cell.

Cells are matched by (host, runtime, release, variant, candidate, settings), not by label: a baseline's
`ort-web-wasm@1.22.0` is compared with a current plain `ort-web-wasm` that ran 1.22.0 (its line says
"as ort-web-wasm@1.22.0 in the baseline"); a label whose release changed is still compared with itself.
A regression is one of:
- verdict: the cell passed (PASS/WARN/CONVERTED) and now FAILs;
- drift: max drift grew by more than `drift_factor` (and above float32 noise),
  or crossed the tolerance;
- latency: p50 slower by more than `latency_threshold` AND slower than the
  baseline's own p90, so that ordinary run-to-run spread is not a regression
  (cells on emulated adapters are not compared, nor the cells of a host whose processor changed since the
  baseline: a hosted CI runner lands on another CPU model from night to night, and a slower processor is not a
  slower runtime; coverage() says which host and why);
- fallback: nodes that now fall back and did not before.
Cells only in one of the two files are not regressions (target subsets differ), nor are cells that SKIP now: coverage()
names them, with the baseline's hosts the current run has none of, for the report; two files with no host in
common are refused, since nothing would be compared.
Two results measured on different inputs (observation set, environment, episodes and
seeds) or judged with different options are refused, naming the difference; with
--allow-different-inputs the difference is printed in every regression line. So are two cells of one
configuration judged at different tolerances (a release's rule changed the tolerance): merge refuses such
shards by the same check (judged_differently), and here the cell's lines say both tolerances.
When the runtime's version differs between the two (a nightly after an upgrade), each of that
cell's regressions names it: "ort-web-wasm 1.22.0 -> 1.30.0: batch 1: p50 ...".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import InputError
from ..results import BaselineCoverage, Cell, Regression, RunResults
from ..runtime_versions import paired_cells, version_change
from ..userfiles import one_line

DRIFT_NOISE_FLOOR = 1e-6  # below this, growth is float32 rounding, not a change


@dataclass
class Thresholds:
    drift_factor: float = 10.0
    latency_threshold: float = 0.25


def compare(baseline: RunResults, current: RunResults, thresholds: Thresholds = Thresholds(),
            allow_different_inputs: bool = False) -> list[Regression]:
    _same_model(baseline, current)
    _shared_host(baseline, current)
    differences = checked_inputs(baseline, current, allow_different_inputs, "the baseline", "the current run")
    caveat = f" (inputs differ: {'; '.join(differences)})" if differences else ""
    pairs = paired_cells(baseline.cells, current.cells)
    judged_apart = _judged_apart(pairs, allow_different_inputs)
    other_processor = processor_changes(baseline, current)
    found = []
    for old, cell in pairs:
        change = version_change(cell.target, old.runtime_version, cell.runtime_version)
        label = f"as {old.target} in the baseline" if old.target != cell.target else ""
        prefix = ", ".join(part for part in (change, label) if part)
        said = caveat + judged_apart.get(id(cell), "")
        found += [Regression(host=cell.host, target=cell.target, variant=cell.variant, kind=kind,
                             detail=(f"{prefix}: {detail}" if prefix else detail) + said, configuration=cell.configuration.axes)
                  for kind, detail in _changes(old, cell, thresholds, cell.host not in other_processor)]
    return found


def processor_changes(baseline: RunResults, current: RunResults) -> dict[str, str]:
    """The hosts (by label) whose processor differs between the two files -> the change in words. Where either file
    does not name it, nothing can be told apart."""
    before = {host.label: host.cpu for host in baseline.hosts}
    return {host.label: f"{one_line(before[host.label], 60)} -> {one_line(host.cpu, 60)}" for host in current.hosts
            if before.get(host.label) and host.cpu and before[host.label] != host.cpu}


def _judged_apart(pairs: list[tuple[Cell, Cell]], allowed: bool) -> dict[int, str]:
    """The current cells judged at another tolerance than their baseline's (a release before 05637b2 judged a user's
    int8 model at fp32's), each with the words its regression lines carry: a verdict that changed between them is the
    rule's doing, not the runtime's. Refused (exit 2, naming the first) unless --allow-different-inputs."""
    apart = [(old, cell) for old, cell in pairs if old.parity and cell.parity and judged_differently(old, cell)]
    if apart and not allowed:
        old, cell = apart[0]
        more = f" (and {len(apart) - 1} more)" if len(apart) > 1 else ""
        raise InputError(f"the baseline and the current run judged alike cells at different tolerances: "
                         f"{cell.configuration.label} on {cell.host} at {tolerance_said(old)} in the baseline vs "
                         f"{tolerance_said(cell)} now{more}; rerun the baseline with this release, or pass "
                         "--allow-different-inputs")
    return {id(cell): f" (judged at {tolerance_said(old)} in the baseline, {tolerance_said(cell)} now)" for old, cell in apart}


def judged_differently(first: Cell, second: Cell) -> bool:
    """Whether two cells of one configuration were judged at different tolerances (compare's and merge's check); a
    part of the tolerance a cell did not record (an older file's rtol) cannot be told apart."""
    return any(a is not None and b is not None and a != b for a, b in ((first.tolerance, second.tolerance), (first.rtol, second.rtol)))


def tolerance_said(cell: Cell) -> str:
    """'atol 0.25 + rtol 0.01': the tolerance a cell was judged at, the parts it recorded."""
    return " + ".join(f"{name} {value:g}" for name, value in (("atol", cell.tolerance), ("rtol", cell.rtol)) if value is not None)


def coverage(baseline: RunResults, current: RunResults) -> BaselineCoverage:
    """What compare covered: the cells paired, the baseline's hosts the current run has no cell of (a nightly shard
    that produced nothing; a one-host run against a merged baseline), the cells only one side has, and the cells the
    baseline measured that SKIP now (no verdict, drift or latency to compare). 'No regressions' says nothing of those."""
    pairs = paired_cells(baseline.cells, current.cells)
    paired = {id(cell) for pair in pairs for cell in pair}
    present = {cell.host for cell in current.cells}
    absent: dict[str, int] = {}
    for cell in baseline.cells:
        if cell.host not in present:
            absent[cell.host] = absent.get(cell.host, 0) + 1
    return BaselineCoverage(
        compared=len(pairs), absent_hosts=absent,
        only_in_baseline=[_named(cell) for cell in baseline.cells if cell.host in present and id(cell) not in paired],
        only_in_current=[_named(cell) for cell in current.cells if id(cell) not in paired],
        skipped_now={_named(cell): cell.reasons[0] if cell.reasons else "no reason given" for old, cell in pairs
                     if cell.verdict == "SKIP" and old.verdict != "SKIP"},
        latency_not_compared=processor_changes(baseline, current))


def _named(cell: Cell) -> str:
    return f"{cell.host} {cell.configuration.label}"


def _same_model(baseline: RunResults, current: RunResults) -> None:
    """Cells of two different policies share names, not meaning: comparing them would say 'no regressions'."""
    old, new = baseline.model.get("sha256"), current.model.get("sha256")
    if old != new:
        raise InputError(
            f"the baseline measured {baseline.model.get('name')!r} ({str(old)[:12]}), the current run "
            f"{current.model.get('name')!r} ({str(new)[:12]}): compare runs of the same model"
        )


def _shared_host(baseline: RunResults, current: RunResults) -> None:
    """Cells are paired per host: with no host in common (a runner's --host-label changed) nothing would be
    compared, and 'no regressions' would be said whatever had regressed."""
    old, new = sorted({c.host for c in baseline.cells}), sorted({c.host for c in current.cells})
    if old and new and not set(old) & set(new):
        raise InputError(f"no host in common: the baseline's {', '.join(old)}, the current run's {', '.join(new)}: "
                         "no cell would be compared (give the runs the same --host-label)")


# What two results must share for their cells to be compared: the inputs and how cells were judged.
# A key absent from either file (written before it was recorded) cannot be told apart, so it is not a difference.
COMPARED_MODEL_KEYS = {"observations_sha256": "observations (sha256)", "observation_kind": "observation source"}
COMPARED_OPTIONS = ("tolerances", "rtol", "tie_margin", "min_agreement", "threads")
COMPARED_ROLLOUT = ("mode", "env", "env_kwargs", "episodes", "seeds", "trajectory", "clip_actions", "initial_state",
                    "return_tolerance")


def input_differences(first: RunResults, second: RunResults) -> list[str]:
    """What differs between the inputs and judging options of two results, in words ([] when nothing does). The
    --side-input values come first: they are why the observation sets' sha256 differ, which alone names no cause."""
    rollouts = first.run_options.get("rollout"), second.run_options.get("rollout")
    found = [_side_inputs_difference(*rollouts)] if all(rollouts) else []
    found += [_difference(name, first.model.get(key), second.model.get(key)) for key, name in COMPARED_MODEL_KEYS.items()]
    found += [_difference(key, first.run_options.get(key), second.run_options.get(key)) for key in COMPARED_OPTIONS]
    if bool(rollouts[0]) != bool(rollouts[1]):
        found.append(f"rollouts: {_shown(rollouts[0])} vs {_shown(rollouts[1])}")
    elif all(rollouts):
        found += [_difference(key, rollouts[0].get(key), rollouts[1].get(key)) for key in COMPARED_ROLLOUT]
    return [line for line in found if line]


def _side_inputs_difference(first: dict, second: dict) -> str:
    """'side inputs deterministic=true vs deterministic=false', as --side-input takes them (none: the key is absent)."""
    said = [", ".join(f"{name}={json.dumps(value)}" for name, value in sorted(rollout.get("side_inputs", {}).items()))
            for rollout in (first, second)]
    return _difference("side inputs", *said)


def checked_inputs(first: RunResults, second: RunResults, allowed: bool, first_name: str, second_name: str) -> list[str]:
    """The input differences, refused (exit 2 naming the first) unless --allow-different-inputs."""
    differences = input_differences(first, second)
    if differences and not allowed:
        raise InputError(f"{first_name} and {second_name} were measured on different inputs: {differences[0]}"
                         + (f" (and {len(differences) - 1} more)" if len(differences) > 1 else "")
                         + "; rerun one of them alike, or pass --allow-different-inputs")
    return differences


def _difference(name: str, first, second) -> str:
    if first is None or second is None or first == second:
        return ""
    return f"{name} {_shown(first)} vs {_shown(second)}"


def _shown(value) -> str:
    text = str(value) if value else "none"
    return f"{text[:12]}…" if isinstance(value, str) and len(value) == 64 else text[:120]  # a sha256: its head


def _changes(old: Cell, new: Cell, thresholds: Thresholds, same_processor: bool):
    if old.verdict in ("PASS", "WARN", "CONVERTED") and new.verdict == "FAIL":
        yield "verdict", f"{old.verdict} -> FAIL: {new.reasons[0] if new.reasons else ''}"
    yield from _drift(old, new, thresholds.drift_factor)
    if same_processor:
        yield from _latency(old, new, thresholds.latency_threshold)
    new_fallback = {r.node for r in new.placement if r.fallback} - {r.node for r in old.placement if r.fallback}
    if new_fallback:
        yield "fallback", f"{len(new_fallback)} nodes now fall back: {', '.join(sorted(new_fallback))}"


def _drift(old: Cell, new: Cell, factor: float):
    if old.max_drift is None or new.max_drift is None:
        return
    tolerance = new.tolerance or float("inf")
    if _beyond_tolerance(new) and not _beyond_tolerance(old):
        yield "drift", f"drift {old.max_drift:.2e} -> {new.max_drift:.2e} crossed tolerance {tolerance:g}"
    elif new.max_drift > max(old.max_drift * factor, DRIFT_NOISE_FLOOR):
        yield "drift", f"drift {old.max_drift:.2e} -> {new.max_drift:.2e} (x{new.max_drift / max(old.max_drift, 1e-30):.0f})"


def _beyond_tolerance(cell: Cell) -> bool:
    """atol + rtol·|ref| where the cell recorded its share of it; atol alone in results written before."""
    used = [p.tolerance_used for p in cell.parity if p.kind == "continuous" and p.tolerance_used is not None]
    return max(used) > 1 if used else cell.max_drift > (cell.tolerance or float("inf"))


def _latency(old: Cell, new: Cell, threshold: float):
    if any(c.backend and c.backend.emulated for c in (old, new)):
        return
    previous = {s.batch: s for s in old.latency}
    for stats in new.latency:
        before = previous.get(stats.batch)
        if before and stats.p50_us > before.p50_us * (1 + threshold) and stats.p50_us > before.p90_us:
            yield "latency", (
                f"batch {stats.batch}: p50 {before.p50_us:.1f} -> {stats.p50_us:.1f} us "
                f"({_growth(before.p50_us, stats.p50_us)}, beyond the baseline's p90 {before.p90_us:.1f})"
            )


def _growth(before: float, after: float) -> str:
    """+N% slower; from a p50 of 0 (a coarse timer's reading) there is no ratio to give."""
    return f"+{100 * (after / before - 1):.0f}%" if before > 0 else "from 0"
