"""The RL action contract, checked on what a runtime actually returned.

Static parts (names, symbolic batch, forbidden inputs, random ops) are lints
(lint.py); these checks need outputs: batch 1/2/7 runs, finite values, action
bounds and dtype, determinism.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .batch_axes import batched, is_symbolic
from .graph_facts import action_bounds
from .model import ModelInfo
from .observations import Feeds
from ..results import ContractCheck

if TYPE_CHECKING:
    from ..judge.rules import Tolerance

CONTRACT_BATCHES = (1, 2, 7)


def action_outputs(model: ModelInfo) -> list[str]:
    """The outputs that may be the action: every one but a recurrent state's next value."""
    states = {pair.output for pair in model.state_pairs}
    return [spec.name for spec in model.outputs if spec.name not in states]


def action_output(model: ModelInfo) -> str:
    """The output read as the action (its bounds; with --env, what the episodes step with): the one named 'action',
    else the first that is no recurrent state."""
    names = action_outputs(model) or [spec.name for spec in model.outputs]
    return "action" if "action" in names else names[0]


def stated_bounds(model: ModelInfo) -> tuple[float, float, str] | None:
    """(low, high, where they came from) of a continuous action: action_low/action_high in the metadata, else as the
    graph states them; None where the model states none."""
    meta = model.metadata
    if "action_low" in meta and "action_high" in meta:
        return float(meta["action_low"]), float(meta["action_high"]), "metadata"
    return action_bounds(model, action_output(model))


class Leaving(NamedTuple):
    """Where the float64 reference's action leaves the bounds the model states: the export's doing, every runtime's
    alike."""
    observations: int  # on how many observations it leaves them
    of: int  # of how many
    lowest: float  # its lowest and highest value
    highest: float
    indices: tuple[int, ...]  # a discrete action's indices outside [0, action_n); () for a continuous action


def reference_leaves(model: ModelInfo, reference: Feeds) -> Leaving | None:
    """Where the float64 reference's action leaves the bounds the model states (the graph does not enforce bounds the
    metadata states: SB3's PPO export returns the unsquashed Gaussian mean; an ArgMax over 4 logits returns index 3
    whatever action_n says), or None where it keeps them or no bounds are stated."""
    expected = reference.get(action_output(model))
    if expected is None:
        return None
    if expected.dtype.kind in "iu" and "action_n" in model.metadata:
        leaving = (expected < 0) | (expected >= int(model.metadata["action_n"]))
    elif expected.dtype.kind == "f" and (bounds := stated_bounds(model)) is not None:
        low, high = _as_the_graph_holds(*bounds[:2], _declared_dtype(model, action_output(model)))
        with np.errstate(invalid="ignore"):
            leaving = (expected < low) | (expected > high)
    else:
        return None
    if not leaving.any():
        return None
    axis = model.batch_axes.get(action_output(model), 0) if expected.ndim else None
    rows = leaving.reshape(1, -1) if axis is None or axis >= expected.ndim else np.moveaxis(leaving, axis, 0).reshape(
        expected.shape[axis], -1)
    finite = expected[np.isfinite(expected)]
    indices = tuple(int(i) for i in np.unique(expected[leaving])) if expected.dtype.kind in "iu" else ()
    return Leaving(int(rows.any(axis=1).sum()), len(rows), float(finite.min()), float(finite.max()), indices)


def _as_the_graph_holds(low: float, high: float, dtype: str) -> tuple[float, float]:
    """The bounds widened to their nearest float32 where that lies outside: the float64 reference computes with the
    graph's float32 constants, and a clamp at the metadata's -0.3 returns float32's -0.30000001 (a runtime's float32
    action compares so with numpy's weak Python float; the float64 reference does not). A model given in fp16 (its
    action float16) holds its constants as float16: a clamp at 0.7 returns float16's 0.70020, the model's own."""
    kinds = (np.float32, np.float16) if dtype == "float16" else (np.float32,)
    return min(low, *(float(kind(low)) for kind in kinds)), max(high, *(float(kind(high)) for kind in kinds))


def _declared_dtype(model: ModelInfo, name: str) -> str:
    return next((spec.dtype for spec in model.outputs if spec.name == name), "")


def check(model: ModelInfo, arrays: Feeds, reference: Feeds, precision: str = "fp32",
          output_steps: dict[str, float] | None = None, tolerance: Tolerance | None = None) -> list[ContractCheck]:
    """`precision` is what the cell's artifact computes in (its variant's, or lower where the model is given so);
    `output_steps` the integer grid each output it returns lies on, where it quantizes them (ArtifactInfo);
    `tolerance` the cell's, of the float64 reference (none: exactly the reference)."""
    outputs = _prefixed(arrays, "outputs/")
    action = outputs.get(action_output(model))
    step = (output_steps or {}).get(action_output(model))
    return [
        _shapes(outputs, reference),
        _batches(model, arrays),
        _finite(model, outputs, reference),
        _dtype(model, outputs),
        _bounds(model, action, reference, precision, step, tolerance),
        _determinism(outputs, _prefixed(arrays, "repeat/")),
        *_recurrent_state(model, arrays),
    ]


def _prefixed(arrays: Feeds, prefix: str) -> Feeds:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def _shapes(outputs: Feeds, reference: Feeds) -> ContractCheck:
    wrong = [
        f"{name}: {outputs[name].shape if name in outputs else 'missing'}, expected {expected.shape}"
        for name, expected in reference.items()
        if name not in outputs or outputs[name].shape != expected.shape
    ]
    return ContractCheck(name="output shapes", ok=not wrong, detail="; ".join(wrong) or "as the reference")


def _batches(model: ModelInfo, arrays: Feeds) -> ContractCheck:
    axes = model.batch_axes
    if not all(is_symbolic(spec, axes) for spec in batched(model)):
        return ContractCheck(name="batch 1/2/7", ok=None, detail="fixed batch dimension: not applicable")
    wrong = []
    for batch in CONTRACT_BATCHES:
        got = _prefixed(arrays, f"batch{batch}/")
        for spec in model.outputs:
            shape = got[spec.name].shape if spec.name in got else None
            axis = axes.get(spec.name, 0)
            if shape is None or len(shape) <= axis or shape[axis] != batch:
                wrong.append(f"batch {batch}: {spec.name} shape {shape}")
    return ContractCheck(name="batch 1/2/7", ok=not wrong, detail="; ".join(wrong) or "outputs follow the batch size")


def _finite(model: ModelInfo, outputs: Feeds, reference: Feeds) -> ContractCheck:
    """A policy's action must be finite, whatever the reference says; any other output may hold
    the non-finite values the reference holds too (an fp16 Cast overflowing to inf), no others."""
    action = action_output(model) if model.is_policy else None
    bad = []
    for name, value in outputs.items():
        if value.dtype.kind != "f":
            continue
        expected = reference.get(name)
        unexpected = ~np.isfinite(value)
        if name != action and expected is not None and expected.shape == value.shape:
            unexpected &= np.isfinite(expected)
        if unexpected.any():
            bad.append(name)
    return ContractCheck(name="finite outputs", ok=not bad, detail=f"NaN or Inf in {bad}" if bad else "finite where the reference is")


def _dtype(model: ModelInfo, outputs: Feeds) -> ContractCheck:
    wrong = [
        f"{spec.name}: {outputs[spec.name].dtype} (declared {spec.dtype})"
        for spec in model.outputs
        if spec.name in outputs and outputs[spec.name].dtype != np.dtype(spec.dtype)
    ]
    missing = [spec.name for spec in model.outputs if spec.name not in outputs]
    problems = wrong + [f"{name}: missing" for name in missing]
    return ContractCheck(name="output dtypes", ok=not problems, detail="; ".join(problems) or "as declared")


def _bounds(model: ModelInfo, action: np.ndarray | None, reference: Feeds, precision: str, step: float | None,
            tolerance: Tolerance | None) -> ContractCheck:
    name = "action bounds"
    if action is None:
        return ContractCheck(name=name, ok=False, detail="no action output returned")
    meta, expected = model.metadata, reference.get(action_output(model))
    if action.dtype.kind in "iu":
        if "action_n" not in meta:
            given = " (action_low/action_high bound a continuous action, not read for it)" if (
                "action_low" in meta or "action_high" in meta) else ""
            return ContractCheck(name=name, ok=None, detail=f"discrete action without action_n in metadata{given}")
        n = int(meta["action_n"])
        leaving = (action < 0) | (action >= n)
        own = leaving & ~_as_far_as_the_reference(action, expected, 0, n - 1, tolerance)
        detail = f"index outside [0, {n})" if leaving.any() else f"indices in [0, {n})"
    elif (stated := stated_bounds(model)) is None:
        return ContractCheck(name=name, ok=None, detail="no action_low/action_high in metadata, none stated by the graph")
    else:
        low, high, source = stated
        finite = action[np.isfinite(action)]  # NaN compares false with any bound: 'finite outputs' judges it, once
        held_low, held_high, held = _held(low, high, precision, step)
        with np.errstate(invalid="ignore"):
            leaving = (action < held_low) | (action > held_high)
        own = leaving & ~_as_far_as_the_reference(action, expected, low, high, tolerance)
        if bool(((finite >= low) & (finite <= high)).all()):
            held = ""  # within the bounds as stated: how the artifact holds them is no part of the answer
        found = f"[{_shown(finite.min(), low)}, {_shown(finite.max(), high)}]" if finite.size else "[]"
        verdict = "leaves" if leaving.any() else "within"
        left = action.size - finite.size
        left_text = f"; {left} non-finite value{'s' if left > 1 else ''} left to 'finite outputs'" if left else ""
        detail = f"{found} {verdict} [{low:g}, {high:g}]{held} ({source}{left_text})"
    if (model_leaves := reference_leaves(model, reference)) is not None:
        detail += _reference_words(model_leaves, int(own.sum()), leaving.any())
    return ContractCheck(name=name, ok=not own.any(), detail=detail)


def _as_far_as_the_reference(action: np.ndarray, expected: np.ndarray | None, low: float, high: float,
                             tolerance: Tolerance | None) -> np.ndarray:
    """Where the action leaves the bounds no farther than the float64 reference does for the same observation, within
    the cell's tolerance of it (an index: the reference's own index, the one the runtime agrees with): the export's
    doing (the graph does not enforce the bounds it states), not the runtime's. A runtime leaving them where the
    reference keeps them, on the other side, or with another index, is the runtime's."""
    if expected is None or expected.shape != action.shape:
        return np.zeros(action.shape, bool)
    if action.dtype.kind in "iu":
        if expected.dtype.kind not in "iu":
            return np.zeros(action.shape, bool)
        return (action == expected) & ((expected < low) | (expected > high))
    if expected.dtype.kind != "f":
        return np.zeros(action.shape, bool)
    expected = expected.astype(np.float64)
    allowed = (tolerance.atol + tolerance.rtol * np.abs(expected)) if tolerance else 0.0
    with np.errstate(invalid="ignore"):
        above = (action > high) & (expected > high) & (action <= expected + allowed)
        below = (action < low) & (expected < low) & (action >= expected - allowed)
    return above | below


def _reference_words(model_leaves: Leaving, own: int, leaves: bool) -> str:
    """What the cell's row says of a reference that leaves the stated bounds itself (the `action-bounds` lint says
    it once for the run)."""
    observations, of = model_leaves.observations, model_leaves.of
    if model_leaves.indices:
        said = (f"the float64 reference returns indices outside them{' too' if leaves else ''} on {observations} of "
                f"{of} observations ({listed_indices(model_leaves.indices)}): the graph has more actions than its "
                "action_n states (lint 'action-bounds')")
        same, other = "the reference's own index on each", "not the reference's index there"
    else:
        said = (f"the float64 reference leaves them{' too' if leaves else ''} on {observations} of {of} observations: "
                "the export does not enforce its stated bounds (lint 'action-bounds')")
        same = "no farther than the reference, within tolerance"
        other = "where the reference keeps them, or farther than it"
    if not leaves:
        return f"; {said}"
    if not own:
        return f": {same}; {said}"
    return f": {own} value{'s' if own > 1 else ''} {other}; {said}"


def listed_indices(indices: tuple[int, ...], shown: int = 5) -> str:
    """'index 3', 'indices 3, 4', at most `shown` of them."""
    more = f", … ({len(indices)} in all)" if len(indices) > shown else ""
    return f"{'index' if len(indices) == 1 else 'indices'} {', '.join(map(str, indices[:shown]))}{more}"


# A graph computing in float16 holds its bounds as float16 constants: a Clip at 0.7 (a TD3 actor's high bound) clips
# at 0.70020, the float16 nearest 0.7, and a runtime returning 0.70020 runs that graph right; so does one returning
# 0.7002 from tanh(x) * 0.7. An output returned on an integer grid (LiteRT's full-integer file: its Clip runs on int8
# and DEQUANTIZE scales the result) takes the grid's nearest point to a bound, up to half a step beyond it: a clip at
# -0.3012 on the grid of step 1/255 returned -77/255 = -0.30196. The bounds a cell is judged by are those its artifact
# can hold, never wider.
HELD_AS = {"fp16": np.float16}
GRID_SLACK = 1.001  # half a step, and float32's rounding of the dequantized value


def _held(low: float, high: float, precision: str, step: float | None) -> tuple[float, float, str]:
    """The bounds as the artifact holds them: each widened to its nearest value in float16 where it computes in fp16
    and that lies outside, or by half the step of the integer grid its action is returned on; and the words saying
    so ("" where nothing was widened)."""
    dtype = HELD_AS.get(precision)
    if step:
        held_low, held_high = low - step / 2 * GRID_SLACK, high + step / 2 * GRID_SLACK
        how = f"its integer output grid (step {step:.3g})"
    elif dtype is not None:
        with np.errstate(over="ignore"):  # a bound beyond float16's range is held as infinity
            held_low, held_high = min(low, float(dtype(low))), max(high, float(dtype(high)))
        how = np.dtype(dtype).name
    else:
        return low, high, ""
    if (held_low, held_high) == (low, high):
        return low, high, ""
    return held_low, held_high, f" as {how} holds them, [{held_low:.5g}, {held_high:.5g}]"


def _shown(value: float, bound: float) -> str:
    """The value in 4 significant digits, more where 4 would show it equal to a bound it is not (0.30005 of 0.3)."""
    for digits in range(4, 10):
        text = f"{value:.{digits}g}"
        if value == bound or text != f"{bound:.{digits}g}":
            return text
    return text


def _recurrent_state(model: ModelInfo, arrays: Feeds) -> list[ContractCheck]:
    """The next state has the state's declared shape at every batch size run, and stays finite."""
    checks = []
    for pair in model.state_pairs:
        state, following, axis = pair.input, pair.output, pair.axis
        spec = next(s for s in model.inputs if s.name == state)
        wrong = []
        for prefix, batch in [("outputs/", None), *((f"batch{b}/", b) for b in CONTRACT_BATCHES)]:
            value = arrays.get(f"{prefix}{following}")
            if value is None:
                continue
            fits = value.ndim == len(spec.shape) and (batch is None or axis is None or value.shape[axis] == batch) and all(
                i == axis or not isinstance(d, int) or d == n for i, (d, n) in enumerate(zip(spec.shape, value.shape))
            )
            if not fits:
                wrong.append(f"{prefix.rstrip('/')}: shape {list(value.shape)}, declared {spec.shape}")
            elif value.dtype.kind == "f" and not np.isfinite(value).all():
                wrong.append(f"{prefix.rstrip('/')}: NaN or Inf")
        detail = "; ".join(wrong) or f"{following} keeps {state}'s shape at batch 1/2/7 and is finite"
        checks.append(ContractCheck(name=f"recurrent state {state} -> {following}", ok=not wrong, detail=detail))
    return checks


def _determinism(outputs: Feeds, repeat: Feeds) -> ContractCheck:
    differ = [name for name in outputs if name not in repeat or not np.array_equal(outputs[name], repeat[name], equal_nan=True)]
    return ContractCheck(name="deterministic", ok=not differ, detail=f"second run differs in {differ}" if differ else "same input, same output")
