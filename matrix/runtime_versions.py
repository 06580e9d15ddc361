"""The runtime version as an axis of the results: `ort-cpu@1.20.1` beside `ort-cpu`.

A pinned target's cells carry the label NAME@VERSION as their target (targets/versions.py
runs them); the Versions view groups them by NAME and compares each release with the
project's default (the unsuffixed label; else the first release run): drift, return, nodes
that moved between devices, latency ratio with its noise band. `compare` pairs cells by
runtime and release (not label) and names a release change of one target between baseline
and current. Tolerance and budget keys take TARGET@RELEASE; a plain TARGET covers its releases. Pure functions of results: no runtime is imported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .errors import InputError
from .judge.noise import ratio_band
from .results import Cell, RunResults

_RELEASE = re.compile(r"\d+(?:\.\d+)+[^\s,;()]*")
_RELEASE_FORM = re.compile(r"^\d+\.\d+\.\d+([-+.]?[0-9A-Za-z]+)*$", re.ASCII)  # as targets/versions.py takes it
SEPARATOR = "@"


def base_name(label: str) -> str:
    """'ort-cpu@1.20.1' -> 'ort-cpu' (the target a pinned label runs)."""
    return label.partition(SEPARATOR)[0]


def release_number(runtime_version: str) -> str:
    """The runtime's release in its version string: 'onnxruntime-web 1.22.0, Chromium 156.0' -> '1.22.0'."""
    found = _RELEASE.search(runtime_version)
    return found.group(0) if found else runtime_version


def version_change(target: str, before: str, after: str) -> str:
    """'ort-web-wasm 1.22.0 -> 1.30.0' when the runtime's release changed; the whole strings when only
    something else in them did (e.g. the browser); '' when nothing changed or a side is unknown."""
    if not before or not after or before == after:
        return ""
    old, new = release_number(before), release_number(after)
    if old != new:
        return f"{base_name(target)} {old} -> {new}"
    return f"{base_name(target)} {before} -> {after}"


def release_key(key: str, where: str) -> str:
    """A TARGET@RELEASE:VARIANT key (tolerance, budget) with its release checked and removed, for the target checks."""
    target, colon, variant = key.partition(":")
    name, separator, release = target.partition(SEPARATOR)
    if separator and not _RELEASE_FORM.match(release):
        raise InputError(f"{where}: {release!r} is not a release number (expected TARGET@X.Y.Z, e.g. ort-cpu@1.20.1)")
    return f"{name}{colon}{variant}"


def paired_cells(baseline: list[Cell], current: list[Cell]) -> list[tuple[Cell, Cell]]:
    """(baseline cell, current cell) pairs for compare: the same runtime at the same release first, whatever the
    label (a baseline's `ort-web-wasm@1.22.0` is a current plain `ort-web-wasm` that ran 1.22.0), then the same
    label whose release changed (a nightly after an upgrade). Each cell is paired once."""
    passes = (lambda old, new: old.target == new.target and _release(old) == _release(new),
              lambda old, new: bool(_release(new)) and _release(old) == _release(new),
              lambda old, new: old.target == new.target)
    slots: dict[tuple, list[Cell]] = {}
    for cell in baseline:
        slots.setdefault(_slot(cell), []).append(cell)
    pairs: dict[int, tuple[Cell, Cell]] = {}  # index in current -> its pair
    for same in passes:
        for index, new in enumerate(current):
            if index in pairs:
                continue
            waiting = slots.get(_slot(new), [])
            old = next((old for old in waiting if same(old, new)), None)
            if old is not None:
                pairs[index] = (old, new)
                waiting.remove(old)
    return [pairs[index] for index in sorted(pairs)]


def _release(cell: Cell) -> str:
    return release_number(cell.runtime_version) if cell.runtime_version else ""


def _slot(cell: Cell) -> tuple:
    """Everything but the release: host, runtime, precision, candidate, settings."""
    return cell.host, *replace(cell.configuration, release="").key


@dataclass
class VersionComparison:
    """One release of a target against its reference release, for the same host, precision and configuration."""

    host: str
    target: str  # the base name
    variant: str
    configuration: str
    reference: Cell
    other: Cell
    moved: list[tuple[str, str, str]] = field(default_factory=list)  # (node, where in reference, where in other)
    only_in_one: int = 0  # nodes listed by one release only (fusions differ between releases)

    @property
    def placement_compared(self) -> bool:
        """Both releases reported placement (a SKIP or a failed open reports none: nothing to compare)."""
        return bool(self.reference.placement and self.other.placement)

    @property
    def latency_ratios(self) -> dict[int, float]:
        """Batch -> other's p50 / reference's p50 (above 1: the other release is slower)."""
        before = {s.batch: s.p50_us for s in self.reference.latency}
        return {s.batch: s.p50_us / before[s.batch] for s in self.other.latency if before.get(s.batch)}

    @property
    def latency_bands(self) -> dict[int, tuple[float, float]]:
        """Batch -> the noise band of that ratio (matrix/judge/noise.py), where both p50s carry theirs."""
        before = {s.batch: s.p50_band for s in self.reference.latency if s.p50_band}
        return {s.batch: ratio_band(before[s.batch], s.p50_band) for s in self.other.latency if s.p50_band and s.batch in before}

    @property
    def behaviour_compared(self) -> bool:
        return any(cell.rollout and cell.rollout.return_delta is not None for cell in (self.reference, self.other))


def comparisons(results: RunResults) -> list[VersionComparison]:
    """Every pinned release against its target's reference release (empty when no target ran at two releases)."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in results.cells:
        key = (cell.host, base_name(cell.target), cell.variant, cell.configuration.axes)
        groups.setdefault(key, []).append(cell)
    found = []
    for (host, target, variant, configuration), cells in groups.items():
        if len({c.target for c in cells}) < 2:
            continue
        reference = next((c for c in cells if c.target == target), cells[0])
        for other in cells:
            if other is not reference:
                moved, only = placement_diff(reference, other)
                found.append(VersionComparison(host, target, variant, configuration, reference, other, moved, only))
    return found


def quality(cell: Cell) -> str:
    """The cell's distance from the reference as the report states it: max drift, or the agreement of discrete actions."""
    if cell.max_drift is not None:
        return f"{cell.max_drift:.2e}"
    agreement = [p.agreement for p in cell.parity if p.agreement is not None]
    return f"{min(agreement):.1%} agree" if agreement else "–"


def return_delta(cell: Cell) -> str:
    """The cell's mean return minus the float64 reference's (same seeds), as the report states it."""
    if cell.rollout is None or cell.rollout.return_delta is None:
        return "–"
    return f"{cell.rollout.return_delta:+.4g}"


def placement_diff(reference: Cell, other: Cell) -> tuple[list[tuple[str, str, str]], int]:
    """Nodes both releases list but ran in different places, and how many nodes only one of them lists."""
    before = {row.node: row.where for row in reference.placement}
    after = {row.node: row.where for row in other.placement}
    moved = [(node, before[node], after[node]) for node in before if node in after and before[node] != after[node]]
    return moved, len(before.keys() ^ after.keys())
