"""What the graph itself says about a policy, read by the lints and the contract.

- recurrent state: an input and an output of the same dtype and shape (h -> h_next),
  or names that say so (state, hidden, memory, carry, h/c);
- action bounds without metadata: a final Tanh ([-1, 1]), Sigmoid ([0, 1]), a Clip
  with constant bounds, or a Min/Max pair with constants (SB3's clip);
- initializers that hold NaN or Inf.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import numpy_helper

from .model import ModelInfo

STATE_NAME = re.compile(r"(state|hidden|memory|carry|^h$|^c$|^h_|^c_|_h$|_c$|^hx|^cx)", re.IGNORECASE)
PASS_THROUGH = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast"}


def state_pairs(model: ModelInfo) -> list[tuple[str, str]]:
    """(input, output) pairs that carry a recurrent state from one step to the next."""
    if len(model.inputs) < 2:
        return []
    pairs = []
    outputs = list(model.outputs)
    for spec in model.inputs[1:]:
        # The batch dimension may carry another symbol on each side (exporters name them apart).
        same = [o for o in outputs if o.dtype == spec.dtype and o.shape[1:] == spec.shape[1:] and o.name != "action"]
        named = [o for o in same if STATE_NAME.search(o.name) or o.name.startswith(spec.name)]
        if same and (STATE_NAME.search(spec.name) or named):
            match = (named or same)[0]
            pairs.append((spec.name, match.name))
            outputs.remove(match)
    return pairs


def action_bounds(model: ModelInfo, action: str) -> tuple[float, float, str] | None:
    """(low, high, where they came from) as the graph states them, or None."""
    graph = model.proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = _constants(graph)
    node = producers.get(action)
    while node is not None and node.op_type in PASS_THROUGH:
        node = producers.get(node.input[0])
    if node is None:
        return None
    if node.op_type == "Tanh":
        return -1.0, 1.0, "graph: final Tanh"
    if node.op_type == "Sigmoid":
        return 0.0, 1.0, "graph: final Sigmoid"
    if node.op_type == "Clip":
        return _clip_bounds(node, constants)
    if node.op_type in ("Min", "Max"):
        return _min_max_bounds(node, producers, constants)
    return None


def non_finite_initializers(model: ModelInfo) -> list[tuple[str, int]]:
    found = []
    for tensor in _tensors(model.proto.graph):
        if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            bad = int((~np.isfinite(numpy_helper.to_array(tensor).astype(np.float64))).sum())
            if bad:
                found.append((tensor.name, bad))
    return found


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _scalar(values: dict, name: str) -> float | None:
    array = values.get(name)
    if array is None or array.size == 0:
        return None
    return float(array.min()) if array.size == 1 or np.all(array == array.flat[0]) else None


def _clip_bounds(node: onnx.NodeProto, constants: dict) -> tuple[float, float, str] | None:
    attrs = {a.name: a.f for a in node.attribute}
    low = _scalar(constants, node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("min")
    high = _scalar(constants, node.input[2]) if len(node.input) > 2 and node.input[2] else attrs.get("max")
    if low is None or high is None:
        return None
    return low, high, "graph: final Clip"


def _min_max_bounds(node: onnx.NodeProto, producers: dict, constants: dict) -> tuple[float, float, str] | None:
    """Max(Min(x, hi), lo) or Min(Max(x, lo), hi), each with one constant operand."""
    found = {}
    for _ in range(2):
        if node is None or node.op_type not in ("Min", "Max") or node.op_type in found or len(node.input) != 2:
            return None
        constant = [name for name in node.input if name in constants]
        if len(constant) != 1:
            return None
        found[node.op_type] = _scalar(constants, constant[0])
        other = next(name for name in node.input if name != constant[0])
        node = producers.get(other)
    low, high = found.get("Max"), found.get("Min")
    if low is None or high is None:
        return None
    return low, high, "graph: final Min/Max clip"
