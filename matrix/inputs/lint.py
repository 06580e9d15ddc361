"""Deployment-readiness lints: what the RL contract expects of the graph itself.

A model that is not an RL policy still runs through the matrix; these lints
say how it differs from the contract (DESIGN.md, "RL contract").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .contract import action_output, action_outputs, listed_indices, reference_leaves, stated_bounds
from .graph_facts import action_bounds, computes_in, non_finite_initializers
from .model import ModelInfo
from .observations import given_words
from .batch_axes import fed_whole, is_symbolic

FORBIDDEN_INPUTS = {"key", "rng", "params", "train_state", "deterministic", "training", "mutable"}
RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


@dataclass
class Lint:
    id: str
    level: str  # "ok" | "warn" | "error"
    message: str


def lint(model: ModelInfo, given: dict[str, np.ndarray] | None = None) -> list[Lint]:
    """The model's lints; `given`: the side inputs' values from --side-input, the inputs the user feeds on purpose."""
    given = given or {}
    return [
        _observation_inputs(model),
        _action_output(model),
        _tensor_outputs(model),
        _symbolic_batch(model),
        _forbidden_inputs(model, given),
        _random_ops(model),
        _dropout(model),
        _action_space_declared(model),
        _side_inputs(model, given),
        _recurrent_state(model),
        _finite_initializers(model),
        _precision(model),
    ]


def _observation_inputs(model: ModelInfo) -> Lint:
    """The inputs an observation feeds: neither a recurrent state (its own lint) nor fed whole (a side input's).
    Several are a Dict observation's keys, as SB3's MultiInputPolicy exports them; one should be named 'obs'."""
    states = [pair.input for pair in model.state_pairs]
    excluded = set(states) | set(fed_whole(model))
    names = [spec.name for spec in model.inputs if spec.name not in excluded]
    besides = f" (besides recurrent state inputs {states})" if states else ""
    if names == ["obs"]:
        return Lint("input-obs", "ok", f"one observation input named 'obs'{besides}")
    if len(names) > 1:
        return Lint("input-obs", "ok", f"{len(names)} observation inputs {names}{besides}: a Dict observation's keys, "
                                       "each fed by the key of its name under --env")
    return Lint("input-obs", "warn", f"expected one input named 'obs', found {names or [spec.name for spec in model.inputs]}")


def _action_output(model: ModelInfo) -> Lint:
    names = [spec.name for spec in model.outputs]
    if "action" in names:
        return Lint("output-action", "ok", "an output named 'action'")
    if not action_outputs(model):  # the contract reads one anyway; --env refuses to step with a state
        return Lint("output-action", "warn", f"no output named 'action' (outputs: {names}), and each is taken for a "
                    f"recurrent state's next value: {action_output(model)!r} is read as the action (its bounds), and "
                    "--env has no action to step with; name the action in the export: output_names=['action', ...]")
    if len(action_outputs(model)) < 2:
        return Lint("output-action", "warn", f"no output named 'action' (outputs: {names})")
    return Lint("output-action", "warn", f"no output named 'action' (outputs: {names}): the first, "
                f"{action_output(model)!r}, is read as the action (its bounds, and what --env's episodes step with); "
                "where that is a value or a log-prob, name the action in the export: output_names=['action', ...]")


def _tensor_outputs(model: ModelInfo) -> Lint:
    if not model.excluded_outputs:
        return Lint("tensor-outputs", "ok", "every output is a tensor")
    zipmaps = {out for node in model.nodes if node.op_type == "ZipMap" for out in node.output}
    found = "; ".join(f"{name} is {kind}{' (ZipMap)' if name in zipmaps else ''}" for name, kind in model.excluded_outputs.items())
    fix = (": skl2onnx writes a ZipMap for classifiers by default; convert with options={id(model): {'zipmap': False}} "
           "for a [N, classes] probability tensor") if zipmaps else ""
    return Lint("tensor-outputs", "warn", f"{found}: left out of the matrix, the tensor outputs run{fix}")


def _symbolic_batch(model: ModelInfo) -> Lint:
    whole = set(fed_whole(model))
    fixed = [spec.name for spec in model.inputs + model.outputs
             if spec.name not in whole and not is_symbolic(spec, model.batch_axes)]
    if not fixed:
        return Lint("symbolic-batch", "ok", "batch dimension is symbolic on every input and output")
    return Lint("symbolic-batch", "warn", f"fixed batch dimension on {fixed}: the policy cannot run batched")


def _forbidden_inputs(model: ModelInfo, given: dict[str, np.ndarray]) -> Lint:
    """An export still taking rng/key/params/training is usually a mistake (an error: not deployment-ready); one whose
    value the user gives (--side-input) is fed on purpose, a deployment input to ship with that value (a warning)."""
    found = [spec.name for spec in model.inputs if spec.name.lower() in FORBIDDEN_INPUTS]
    if not found:
        return Lint("no-training-inputs", "ok", "no runtime inputs for keys, params or training flags")
    unvalued = [name for name in found if name not in given]
    valued = given_words({name: given[name] for name in found if name in given})
    if unvalued:
        return Lint("no-training-inputs", "error", f"runtime inputs that belong to training: {unvalued}"
                    + (f" (fed {valued} as given)" if valued else ""))
    return Lint("no-training-inputs", "warn", f"runtime inputs named like training's: {found}, fed {valued} as given: "
                "ship the model with that value")


def _random_ops(model: ModelInfo) -> Lint:
    found = sorted({f"{n.op_type} ({n.name})" for n in model.nodes if n.op_type in RANDOM_OPS})
    if not found:
        return Lint("no-random-ops", "ok", "no random operators")
    return Lint("no-random-ops", "error", f"random operators make actions non-deterministic: {found}")


def _dropout(model: ModelInfo) -> Lint:
    found = sorted(n.name or n.op_type for n in model.nodes if n.op_type == "Dropout")
    if not found:
        return Lint("no-dropout", "ok", "no Dropout nodes")
    return Lint("no-dropout", "warn", f"Dropout left in the exported graph: {found}")


def _action_space_declared(model: ModelInfo) -> Lint:
    space = model.metadata.get("action_space")
    if space in ("continuous", "discrete"):
        return Lint("action-space", "ok", f"declares a {space} action space")
    inferred = action_bounds(model, action_output(model))
    found = f"; bounds [{inferred[0]:g}, {inferred[1]:g}] inferred from the {inferred[2][7:]}" if inferred else ""
    declared = (f"action_space {space[:40]!r} in the model metadata is neither 'continuous' nor 'discrete'"
                if space is not None else "no action_space in the model metadata")
    return Lint(
        "action-space", "warn",
        f"{declared} (the contract reads action_low/action_high or action_n): discrete if the action is an integer{found}",
    )


def _side_inputs(model: ModelInfo, given: dict[str, np.ndarray]) -> Lint:
    whole = fed_whole(model)
    if not whole:
        return Lint("side-inputs", "ok", "every input carries the batch dimension")
    unvalued = [name for name in whole if name not in given]
    valued = f"; {given_words({name: given[name] for name in whole if name in given})} as given" if given else ""
    seeded = (f" ({unvalued}: seeded rows give them random values; --side-input NAME=VALUE gives the one you ship, "
              "and --env needs it)") if unvalued else ""
    return Lint("side-inputs", "warn", f"inputs without the batch dimension, fed whole to every call: {whole}{valued}{seeded}")



def _recurrent_state(model: ModelInfo) -> Lint:
    pairs = model.state_pairs
    if not pairs:
        return Lint("recurrent-state", "ok", "no recurrent state: each step depends on its observation only")
    carried = ", ".join(f"{p.input} -> {p.output} ({_axis_words(p.axis)})" for p in pairs)
    return Lint("recurrent-state", "warn", f"recurrent state {carried}: the caller carries it between steps (checked in the contract)")


def _axis_words(axis: int | None) -> str:
    return "no batch axis" if axis is None else f"batch on axis {axis}"


def _finite_initializers(model: ModelInfo) -> Lint:
    found = non_finite_initializers(model)
    if not found:
        return Lint("finite-weights", "ok", "every initializer is finite")
    listed = "; ".join(f"initializer {name} has {n} non-finite value{'s' if n > 1 else ''}" for name, n in found)
    return Lint("finite-weights", "error", listed)


def _precision(model: ModelInfo, whose: str = "") -> Lint:
    """What the model computes in as given; `whose`: "candidate NAME: " for a --candidate, judged at its own."""
    precision, evidence = computes_in(model.proto)
    if precision == "fp32":
        return Lint("precision", "ok", f"{whose}computes in float32 as given")
    # Nothing about the variants: the lint is read before they are made, and the run says what each one became.
    return Lint("precision", "warn", f"{whose}computes in {precision} as given ({evidence}): its fp32 cell runs it as it "
                f"is and is judged at {precision}'s default tolerance")


def reference_bounds(model: ModelInfo, reference: dict[str, np.ndarray]) -> Lint | None:
    """`action-bounds`, once the float64 reference is known: whether the model keeps the action bounds it states (a
    continuous action's low/high, a discrete one's [0, action_n)) on the run's observations. Where it leaves them,
    every cell would too: the cells' bounds check holds each runtime only to going no farther than the reference (to
    its index), and this says the model's own violation, once. None where the model states no bounds."""
    action = reference.get(action_output(model))
    if action is None:
        return None
    if action.dtype.kind in "iu" and "action_n" in model.metadata:
        return _reference_indices(model, reference, int(model.metadata["action_n"]))
    stated = stated_bounds(model)
    if stated is None or action.dtype.kind != "f":
        return None
    low, high, source = stated
    leaves = reference_leaves(model, reference)
    if leaves is None:
        return Lint("action-bounds", "ok", f"the float64 reference keeps the action in [{low:g}, {high:g}] ({source})")
    return Lint("action-bounds", "warn", f"the float64 reference's action leaves [{low:g}, {high:g}] ({source}) on "
                f"{leaves.observations} of {leaves.of} observations, reaching "
                f"[{leaves.lowest:.4g}, {leaves.highest:.4g}]: the export does not enforce the bounds it states (SB3's PPO export returns the Gaussian mean "
                "unsquashed), and every runtime returns what it computes; clip in the graph, or clip before stepping "
                "the env. Each cell's bounds check holds the runtime to going no farther than the reference")


def _reference_indices(model: ModelInfo, reference: dict[str, np.ndarray], n: int) -> Lint:
    """A discrete action's indices against the metadata's action_n: an ArgMax over 4 logits with action_n = 3 returns
    index 3 on every runtime, the model's doing."""
    leaves = reference_leaves(model, reference)
    if leaves is None:
        return Lint("action-bounds", "ok", f"the float64 reference's action indices lie in [0, {n}) (metadata action_n)")
    return Lint("action-bounds", "warn", f"the float64 reference returns action {listed_indices(leaves.indices)}, "
                f"outside [0, {n}) (metadata action_n = {n}), on {leaves.observations} of {leaves.of} observations: "
                "the graph has more actions than its metadata states, and every runtime returns what it computes; "
                "correct action_n in the metadata, or the graph's action head. Each cell's bounds check holds the "
                "runtime to the reference's index")


def candidate_precisions(candidates: list[ModelInfo]) -> list[Lint]:
    """A --candidate computing in fp16 or int8 is judged at that precision's tolerance, as the first model is:
    said beside the first model's precision lint."""
    found = [_precision(candidate, f"candidate {candidate.path.name}: ") for candidate in candidates]
    return [item for item in found if item.level != "ok"]
