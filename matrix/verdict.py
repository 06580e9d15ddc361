"""Tolerances and the verdict of each cell: PASS / WARN / FAIL / SKIP / CONVERTED.

A tolerance is the largest max_abs drift from the float64 reference a cell may
show. Drift above half the tolerance is a WARN. Defaults depend on the
precision; `--tolerance` or matrix.toml override them per target/variant.

Discrete actions are judged by agreement, not drift: a flipped action whose
reference margin (top-1 minus top-2 logit) is above the tie margin
(`--tie-margin`) is at least a WARN, and flips that bring agreement below
`--min-agreement` are a FAIL. Flips on near ties are reported, not counted.

CONVERTED: a conversion-only cell (nothing was predicted on this host).
An int8 artifact in which nothing is quantized is at least a WARN: it is the
float model under another name.
"""

from __future__ import annotations

from .errors import InputError

DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "int8": 2.5e-1}
WARN_FRACTION = 0.5
DEFAULT_TIE_MARGIN = 1e-3
DEFAULT_MIN_AGREEMENT = 0.99
# Stages after the parity run: their failure keeps the parity and contract measured before.
LATE_STAGE_WARNS = {"placement"}  # reading placement is the tool's extra step (e.g. a profiler), not inference


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


# A note that starts so names a change the tool made so the runtime could run the model (a converter workaround,
# a fixed-batch copy): it is among the cell's reasons, and the decision ships that change, not the exported file.
WORKAROUND = "workaround: "
_SAVED = "; saved as "


def workaround_note(change: str, exported_error: str, saved: list[str]) -> str:
    """e.g. "workaround: a fixed batch of 1 (the exported file fails: <the runtime's words>); saved as cells/…/x.onnx"."""
    return f"{WORKAROUND}{change} (the exported file fails: {exported_error}){_SAVED}{', '.join(saved)}"


def workaround(notes: list[str]) -> tuple[str, str]:
    """(the changes the tool made, the first file it saved) from a cell's notes; ("", "") when it made none."""
    found = [note[len(WORKAROUND):] for note in notes if note.startswith(WORKAROUND)]
    changes = "; ".join(text.split(" (")[0] for text in found)
    saved = next((text.split(_SAVED, 1)[1].split(", ")[0] for text in found if _SAVED in text), "")
    return changes, saved


def decide(cell, tolerance: float, min_agreement: float = DEFAULT_MIN_AGREEMENT) -> tuple[str, list[str]]:
    """The verdict and its reasons, worst first."""
    failures, warnings = [], []
    if cell.error:
        reason = f"{cell.error.stage}: {cell.error.message}"
        if not cell.parity:  # nothing measured to judge by
            return "FAIL", [reason]
        (warnings if cell.error.stage in LATE_STAGE_WARNS else failures).append(f"{reason} (parity and contract measured before)")
    workarounds = [note for note in (cell.artifact.notes if cell.artifact else []) if note.startswith(WORKAROUND)]
    if not cell.predicts:
        return "CONVERTED", ["conversion only: converted, nothing predicted on this host", *workarounds]
    warnings += _unquantized(cell)
    backend = cell.backend
    if backend and not backend.matches:
        failures.append(f"requested {backend.requested} but ran on {backend.actual}. {backend.detail}".strip())
    failures += [f"contract: {c.name}: {c.detail}" for c in cell.contract if c.ok is False]
    for p in cell.parity:
        if p.kind == "discrete" and p.flips:
            flips = f"{p.output}: {p.flips} action flips above the tie margin (agreement {100 * p.agreement:.1f}%)"
            if p.agreement < min_agreement:
                failures.append(f"{flips}, below the minimum agreement {100 * min_agreement:g}%")
            else:
                warnings.append(flips)
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
        return "FAIL", failures + warnings + workarounds
    return ("WARN", warnings + workarounds) if warnings else ("PASS", workarounds)


def _unquantized(cell) -> list[str]:
    counted = cell.artifact.quantization if cell.artifact else None
    if cell.variant != "int8" or counted is None or counted.get("quantized_ops") or counted.get("quantized_weights"):
        return []
    return [f"int8 artifact has nothing quantized ({counted.get('float_ops', 0)} weight ops stayed float)"]
