"""Tolerances and the verdict of each cell: PASS / WARN / FAIL / SKIP.

A tolerance is the largest max_abs drift from the float64 reference a cell may
show (and, for discrete actions, the reference margin above which a flipped
action counts). Drift above half the tolerance is a WARN. Defaults depend on
the precision; `--tolerance` or matrix.toml override them per target/variant.
"""

from __future__ import annotations

from .errors import InputError

DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "int8": 2.5e-1}
WARN_FRACTION = 0.5


class Tolerances:
    """Lookup order: target:variant, target:*, *:variant, the variant's default."""

    def __init__(self, overrides: dict[str, float] | None = None):
        self.overrides = overrides or {}

    @classmethod
    def parse(cls, specs: list[str], base: dict[str, float] | None = None) -> "Tolerances":
        overrides = {_normalise(key): value for key, value in (base or {}).items()}
        for spec in specs:
            key, sep, value = spec.partition("=")
            try:
                overrides[_normalise(key)] = float(value)
            except ValueError:
                raise InputError(f"--tolerance {spec!r}: expected TARGET:VARIANT=VALUE, e.g. ort-cpu:int8=0.3") from None
            if not sep:
                raise InputError(f"--tolerance {spec!r}: expected TARGET:VARIANT=VALUE, e.g. ort-cpu:int8=0.3")
        return cls(overrides)

    def get(self, target: str, variant: str) -> float:
        for key in (f"{target}:{variant}", f"{target}:*", f"*:{variant}"):
            if key in self.overrides:
                return self.overrides[key]
        return DEFAULT_TOLERANCE.get(variant, DEFAULT_TOLERANCE["fp32"])


def _normalise(key: str) -> str:
    key = key.strip()
    if ":" in key:
        return key
    return f"*:{key}" if key in DEFAULT_TOLERANCE else f"{key}:*"


def decide(cell, tolerance: float) -> tuple[str, list[str]]:
    """The verdict and its reasons, worst first."""
    if cell.error:
        return "FAIL", [f"{cell.error.stage}: {cell.error.message}"]
    if not cell.predicts:
        return "PASS", ["conversion only: no prediction on this host"]
    failures, warnings = [], []
    backend = cell.backend
    if backend and backend.requested != backend.actual:
        failures.append(f"requested {backend.requested} but ran on {backend.actual}. {backend.detail}".strip())
    failures += [f"contract: {c.name}: {c.detail}" for c in cell.contract if c.ok is False]
    for p in cell.parity:
        if p.kind == "discrete" and p.flips:
            failures.append(f"{p.output}: {p.flips} action flips with a reference margin above {tolerance:g}")
        elif p.kind == "continuous" and p.max_abs > tolerance:
            failures.append(f"{p.output}: drift {p.max_abs:.3g} above tolerance {tolerance:g}")
        elif p.kind == "continuous" and p.max_abs > tolerance * WARN_FRACTION:
            warnings.append(f"{p.output}: drift {p.max_abs:.3g} above half the tolerance {tolerance:g}")
    fallback = [row for row in cell.placement if row.fallback]
    if fallback:
        where = sorted({row.where for row in fallback})
        nodes = "1 node" if len(fallback) == 1 else f"{len(fallback)} nodes"
        warnings.append(f"{nodes} fell back to {', '.join(where)}")
    if failures:
        return "FAIL", failures + warnings
    return ("WARN", warnings) if warnings else ("PASS", [])
