"""Which axis of each input and output is the batch: inferred once per model, used everywhere.

Real exporters put the batch where their runtime's convention says: an
observation `[batch, 105]`, an LSTM state `[num_layers, batch, hidden]` (the
ONNX LSTM/GRU/RNN layout, rsl_rl's actor), silero-vad's `state [2, batch, 128]`
beside a rank-0 `sr`. An input's batch axis comes from, in order:
1. the user (`--batch-axis NAME=AXIS`);
2. the observation: the first input's axis 0;
3. a recurrent pair (graph_facts.state_pairs, found once at load): the axis the pair's batch sits on;
4. the symbol of the observation's batch on any axis, else the rule for axis 0 (an
   unnamed dynamic dim beside an unnamed batch, or the same fixed size and kind).
An input with no batch axis (a rank-0 scalar, a shape or axes tensor, `rng [1]`)
is fed whole to every call. Outputs get the axis of their state pair, else the
observation's batch symbol's axis, else 0.

Batching, feeding, the reference, rollouts (state carried along its axis),
`--initial-state`, the lints and every target read this one mapping.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:  # model.load infers the axes: a runtime import would be circular
    from .model import ModelInfo, TensorSpec

BatchAxes = dict[str, int]  # input or output name -> its batch axis; an input absent here is fed whole

GIVEN = re.compile(r"^(?P<name>.+)=(?P<axis>-?[0-9]+)$")  # ASCII digits: a str pattern's \d takes any script's


def parse_given(specs: tuple[str, ...] | list[str]) -> BatchAxes:
    """`--batch-axis NAME=AXIS` (repeatable; AXIS -1: no batch axis, fed whole)."""
    given = {}
    for spec in specs:
        match = GIVEN.match(spec)
        if not match:
            raise InputError(f"--batch-axis {spec!r}: expected NAME=AXIS, e.g. h_in=1 (or NAME=-1 for an input fed whole)")
        given[match["name"]] = int(match["axis"])
    return given


def infer(model: ModelInfo, given: BatchAxes | None = None) -> BatchAxes:
    """Every input's and output's batch axis (inputs without one are left out); reads the model's
    state pairs, found first (graph_facts.state_pairs)."""
    given = given or {}
    paired = {pair.input: pair.axis for pair in model.state_pairs} | {pair.output: pair.axis for pair in model.state_pairs}
    lead = _lead(model)
    axes: BatchAxes = {}
    for position, spec in enumerate(model.inputs):
        if spec.name in given:
            axis = given[spec.name]
        elif position == 0:
            axis = 0 if spec.shape else None
        elif spec.name in paired:
            axis = paired[spec.name]
        else:
            axis = _shared_axis(spec, model.inputs[0], lead)
        if axis is not None and axis >= 0:
            axes[spec.name] = axis
    for spec in model.outputs:
        axis = paired.get(spec.name, _symbol_axis(spec, lead) or 0)
        if axis is not None:
            axes[spec.name] = axis
    return axes


def fed_whole(model: ModelInfo) -> list[str]:
    """Inputs without a batch axis: the same tensor goes to every call."""
    return [spec.name for spec in model.inputs if spec.name not in model.batch_axes]


def batched(model: ModelInfo) -> list[TensorSpec]:
    return [spec for spec in model.inputs if spec.name in model.batch_axes]


def batch_dim(spec: TensorSpec, axes: BatchAxes):
    """The declared size of `spec`'s batch dimension (an int, a symbol, or None), None without one."""
    axis = axes.get(spec.name)
    return spec.shape[axis] if axis is not None and axis < len(spec.shape) else None


def is_symbolic(spec: TensorSpec, axes: BatchAxes) -> bool:
    axis = axes.get(spec.name)
    return axis is not None and axis < len(spec.shape) and not isinstance(spec.shape[axis], int)


def without_batch(spec: TensorSpec, axes: BatchAxes) -> list:
    """The declared dims other than the batch axis."""
    axis = axes.get(spec.name)
    return [d for i, d in enumerate(spec.shape) if i != axis]


def _lead(model: ModelInfo):
    first = model.inputs[0]
    return first.shape[0] if first.shape else None


def _symbol_axis(spec: TensorSpec, lead) -> int | None:
    """The axis holding the observation's named batch symbol, if it has one."""
    if not isinstance(lead, str):
        return None
    return next((axis for axis, dim in enumerate(spec.shape) if dim == lead), None)


def _shared_axis(spec: TensorSpec, primary: TensorSpec, lead) -> int | None:
    if not spec.shape:
        return None
    named = _symbol_axis(spec, lead)
    if named is not None:
        return named
    first = spec.shape[0]
    if isinstance(lead, int):  # with a fixed batch, an integer input beside a float one is a shape or index tensor
        return 0 if first == lead and np.dtype(spec.dtype).kind == np.dtype(primary.dtype).kind else None
    return 0 if not isinstance(first, int) and (first == lead or None in (lead, first)) else None


def check_given(model: ModelInfo, given: BatchAxes) -> None:
    ranks = {spec.name: len(spec.shape) for spec in model.inputs}
    for name, axis in given.items():
        if name not in ranks:
            raise InputError(f"--batch-axis {name[:100]!r}: not an input of the model (inputs: {sorted(ranks)})")
        if axis >= ranks[name] or axis < -1:
            raise InputError(f"--batch-axis {name}={axis}: the input has rank {ranks[name]} (axes 0..{ranks[name] - 1}, or -1 for none)")
