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
  (cells on emulated adapters are not compared);
- fallback: nodes that now fall back and did not before.
Cells only in one of the two files are not regressions (target subsets differ).
When the runtime's version differs between the two (a nightly after an upgrade), each of that
cell's regressions names it: "ort-web-wasm 1.22.0 -> 1.30.0: batch 1: p50 ...".
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError
from .results import Cell, Regression, RunResults
from .runtime_versions import paired_cells, version_change

DRIFT_NOISE_FLOOR = 1e-6  # below this, growth is float32 rounding, not a change


@dataclass
class Thresholds:
    drift_factor: float = 10.0
    latency_threshold: float = 0.25


def compare(baseline: RunResults, current: RunResults, thresholds: Thresholds = Thresholds()) -> list[Regression]:
    _same_model(baseline, current)
    found = []
    for old, cell in paired_cells(baseline.cells, current.cells):
        change = version_change(cell.target, old.runtime_version, cell.runtime_version)
        label = f"as {old.target} in the baseline" if old.target != cell.target else ""
        prefix = ", ".join(part for part in (change, label) if part)
        found += [Regression(host=cell.host, target=cell.target, variant=cell.variant, kind=kind,
                             detail=f"{prefix}: {detail}" if prefix else detail, configuration=cell.configuration)
                  for kind, detail in _changes(old, cell, thresholds)]
    return found


def _same_model(baseline: RunResults, current: RunResults) -> None:
    """Cells of two different policies share names, not meaning: comparing them would say 'no regressions'."""
    old, new = baseline.model.get("sha256"), current.model.get("sha256")
    if old != new:
        raise InputError(
            f"the baseline measured {baseline.model.get('name')!r} ({str(old)[:12]}), the current run "
            f"{current.model.get('name')!r} ({str(new)[:12]}): compare runs of the same model"
        )


def _changes(old: Cell, new: Cell, thresholds: Thresholds):
    if old.verdict in ("PASS", "WARN", "CONVERTED") and new.verdict == "FAIL":
        yield "verdict", f"{old.verdict} -> FAIL: {new.reasons[0] if new.reasons else ''}"
    yield from _drift(old, new, thresholds.drift_factor)
    yield from _latency(old, new, thresholds.latency_threshold)
    new_fallback = {r.node for r in new.placement if r.fallback} - {r.node for r in old.placement if r.fallback}
    if new_fallback:
        yield "fallback", f"{len(new_fallback)} nodes now fall back: {', '.join(sorted(new_fallback))}"


def _drift(old: Cell, new: Cell, factor: float):
    if old.max_drift is None or new.max_drift is None:
        return
    tolerance = new.tolerance or float("inf")
    if new.max_drift > tolerance >= old.max_drift:
        yield "drift", f"drift {old.max_drift:.2e} -> {new.max_drift:.2e} crossed tolerance {tolerance:g}"
    elif new.max_drift > max(old.max_drift * factor, DRIFT_NOISE_FLOOR):
        yield "drift", f"drift {old.max_drift:.2e} -> {new.max_drift:.2e} (x{new.max_drift / max(old.max_drift, 1e-30):.0f})"


def _latency(old: Cell, new: Cell, threshold: float):
    if any(c.backend and c.backend.emulated for c in (old, new)):
        return
    previous = {s.batch: s for s in old.latency}
    for stats in new.latency:
        before = previous.get(stats.batch)
        if before and stats.p50_us > before.p50_us * (1 + threshold) and stats.p50_us > before.p90_us:
            yield "latency", (
                f"batch {stats.batch}: p50 {before.p50_us:.1f} -> {stats.p50_us:.1f} us "
                f"(+{100 * (stats.p50_us / before.p50_us - 1):.0f}%, beyond the baseline's p90 {before.p90_us:.1f})"
            )
