"""Candidates: other models with the first model's interface (a distilled student, a pruned copy).

Every candidate runs through the same targets, variants and settings, and is
judged against the FIRST model's float64 reference: its drift is its distance
from the teacher. A student is expected to differ step by step, so with
rollouts (--env) the return tolerance is its bar and its drift is shown, not
judged; without rollouts the drift tolerance applies.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..inputs.model import ModelInfo, TensorSpec


def load_all(first: ModelInfo, paths: list[Path]) -> list[ModelInfo]:
    from ..inputs import model as model_loader

    loaded = []
    names = {first.path.name}
    for path in paths:
        candidate = model_loader.load(path)
        if candidate.path.name in names:
            raise InputError(f"--candidate {path}: another model is named {candidate.path.name!r}; "
                             "candidates are told apart by file name: rename one")
        names.add(candidate.path.name)
        if difference := interface_difference(first, candidate):
            raise InputError(f"--candidate {path}: its interface differs from {first.path.name}'s: {difference}")
        loaded.append(candidate)
    return loaded


def interface_difference(first: ModelInfo, candidate: ModelInfo) -> str:
    """The first difference in input/output names, dtypes or shapes, in words; "" when they match."""
    for kind, mine, theirs in (("input", first.inputs, candidate.inputs), ("output", first.outputs, candidate.outputs)):
        names, other_names = [s.name for s in mine], [s.name for s in theirs]
        if names != other_names:
            return f"{kind}s {other_names} instead of {names}"
        for expected, got in zip(mine, theirs):
            if expected.dtype != got.dtype:
                return f"{kind} {got.name!r} is {got.dtype}, not {expected.dtype}"
            if _shape(expected) != _shape(got):
                return f"{kind} {got.name!r} has shape {_shown(got)}, not {_shown(expected)}"
    return ""


def _shape(spec: TensorSpec) -> list:
    """Symbolic dimensions match whatever their names: 'batch' and 'N' are both a free size."""
    return [dim if isinstance(dim, int) else "?" for dim in spec.shape] if spec.shape is not None else None


def _shown(spec: TensorSpec) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in spec.shape) + "]" if spec.shape is not None else "unknown"
