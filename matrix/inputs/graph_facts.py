"""What the graph itself says about a policy, read by the lints and the contract.

- recurrent state: an input and an output of the same dtype and shape (h -> h_next,
  h_in -> h_out, state -> stateN), or names that say so (state, hidden, memory, carry,
  h/c), and the axis their batch sits on (any axis: an LSTM's is 1);
- action bounds without metadata: a final Tanh ([-1, 1]), Sigmoid ([0, 1]), a Clip
  with constant bounds, or a Min/Max pair with constants (SB3's clip);
- initializers that hold NaN or Inf;
- pixel inputs: a float input the graph scales from 8-bit values first (`Div(x, 255)`, `Mul(x, 1/255)`, or by
  127.5 to [-1, 1]; whatever affine follows: torchvision's `(x - mean) / std`);
- the precision the graph computes in as given (`computes_in`): int8 where it quantizes (a user's ORT
  dynamic or QDQ quantization), fp16 where its weights or casts are float16, else fp32.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

if TYPE_CHECKING:  # model.py infers batch axes from the state pairs found here
    from .model import ModelInfo

STATE_NAME = re.compile(r"(state|hidden|memory|carry|^h$|^c$|^h_|^c_|_h$|_c$|^hx|^cx)", re.IGNORECASE)
PASS_THROUGH = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast"}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
INTEGER_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                 onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}


@dataclass(frozen=True)
class StatePair:
    """An input and the output that carries its next value, and the batch axis both share
    (None: a state without one, fed whole)."""

    input: str
    output: str
    axis: int | None


def state_pairs(model: ModelInfo, given: dict[str, int] | None = None) -> list[StatePair]:
    """(input, output, batch axis) triples that carry a recurrent state from one step to the next.

    Found by shape and naming, whatever the axis of the batch: `h`/`h_next`, `h_in`/`h_out`,
    `state`/`stateN`, or names that say state. `given` is the user's --batch-axis."""
    if len(model.inputs) < 2:
        return []
    pairs = []
    outputs = list(model.outputs)
    for spec in model.inputs[1:]:
        # Each side's batch (or any open dim) may carry another symbol (exporters name them apart).
        same = [o for o in outputs if o.dtype == spec.dtype and _same_shape(spec.shape, o.shape) and o.name != "action"]
        partners = [o for o in same if _partner_names(spec.name, o.name)]
        named = partners or [o for o in same if STATE_NAME.search(o.name)]
        if same and (STATE_NAME.search(spec.name) or named):
            match = (named or same)[0]
            pairs.append(StatePair(spec.name, match.name, _state_axis(model, spec, given or {})))
            outputs.remove(match)
    return pairs


def _same_shape(declared: list, other: list) -> bool:
    return len(declared) == len(other) and all(
        not isinstance(a, int) or not isinstance(b, int) or a == b for a, b in zip(declared, other)
    )


def _partner_names(state: str, following: str) -> bool:
    """h -> h_next / h_out, state -> stateN, h_in -> h_out."""
    stem = state.removesuffix("_in")
    return following != state and (following.startswith(state) or (stem != state and following == f"{stem}_out"))


def _state_axis(model: ModelInfo, spec, given: dict[str, int]) -> int | None:
    """Given; else where the observation's batch symbol sits; else the ONNX RNN layout of the node it
    starts; else its one open dim; else, at a fixed batch, the first dim of that size."""
    if spec.name in given:
        return given[spec.name] if given[spec.name] >= 0 else None
    lead = model.inputs[0].shape[0] if model.inputs[0].shape else None
    if isinstance(lead, str) and lead in spec.shape:
        return spec.shape.index(lead)
    recurrent = _recurrent_node_axis(model.proto.graph, spec.name)
    if recurrent is not None:
        return recurrent
    open_dims = [axis for axis, dim in enumerate(spec.shape) if not isinstance(dim, int)]
    if open_dims:
        return open_dims[0]
    return spec.shape.index(lead) if isinstance(lead, int) and lead in spec.shape else None


RNN_STATE_INPUTS = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}  # initial_h (and initial_c) positions


def _recurrent_node_axis(graph: onnx.GraphProto, name: str) -> int | None:
    """The batch axis of `name` when it is (through pass-through ops) an LSTM/GRU/RNN's initial state:
    [num_directions, batch, hidden] by default, [batch, num_directions, hidden] with layout=1."""
    producers = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        for position in RNN_STATE_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and _traces_to(node.input[position], name, producers):
                layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
                return 0 if layout else 1
    return None


def _traces_to(tensor: str, source: str, producers: dict) -> bool:
    while tensor != source:
        node = producers.get(tensor)
        if node is None or node.op_type not in PASS_THROUGH | {"Slice", "Gather"}:
            return False
        tensor = node.input[0]
    return True


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
        if tensor.data_type in FLOAT_TYPES:
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


# What a policy trained on 8-bit images scales them by first: 255 to [0, 1] (SB3's preprocess_obs: obs.float() / 255,
# torchvision's ToTensor, before a Normalize's (x - mean) / std), 127.5 to [-1, 1] (x / 127.5 - 1). Whatever affine
# follows, the input is pixels.
PIXEL_SCALES = (255.0, 127.5)
LAYOUT_OPS = PASS_THROUGH | {"Transpose"}  # what may sit between the input and its scaling (SB3: a Cast to float)


def pixel_inputs(proto: onnx.ModelProto) -> dict[str, str]:
    """Float inputs the graph scales from pixels before anything else, by name -> the scaling op in words.
    A policy exported with a float dummy input (SB3's export guide) takes pixels as float32 and divides by 255
    inside: values outside [0, 255] are images it never sees."""
    return _what_follows_inputs(proto, FLOAT_TYPES, _scaling_op)


def _what_follows_inputs(proto: onnx.ModelProto, types: set[int], follow) -> dict:
    """For each graph input of `types` (not a constant), what `follow(input, consumers, constants)` finds after it,
    by name; inputs where it finds nothing are left out."""
    graph = proto.graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = _constants(graph)
    found = {value.name: follow(value.name, consumers, constants) for value in graph.input
             if value.name not in constants and value.type.tensor_type.elem_type in types}
    return {name: said for name, said in found.items() if said}


def _scaling_op(tensor: str, consumers: dict, constants: dict) -> str:
    """"Div by 255" or "Mul by 1/127.5" where `tensor` (through layout-only ops) is so scaled (PIXEL_SCALES), else ""."""
    for node in consumers.get(tensor, []):
        if node.op_type in LAYOUT_OPS:
            said = _scaling_op(node.output[0], consumers, constants)
        elif node.op_type == "Div" and node.input[0] == tensor:
            said = next((f"Div by {scale:g}" for scale in PIXEL_SCALES if _is_constant(constants, node.input[1], scale)), "")
        elif node.op_type == "Mul":
            other = next((name for name in node.input if name != tensor), "")
            said = next((f"Mul by 1/{scale:g}" for scale in PIXEL_SCALES if _is_constant(constants, other, 1 / scale)), "")
        else:
            said = ""
        if said:
            return said
    return ""


def index_inputs(proto: onnx.ModelProto) -> dict[str, tuple[int, str]]:
    """Integer inputs the graph looks up in a constant table before anything else, by name -> (how many entries
    the table has, the lookup in words): an Embedding of a discrete observation (torch writes Gather on its weight)
    or a OneHot. A number past the table is no observation: ONNX Runtime and the float64 reference refuse it."""
    return _what_follows_inputs(proto, INTEGER_TYPES, _table_size)


def _table_size(tensor: str, consumers: dict, constants: dict) -> tuple[int, str] | None:
    """The smallest table `tensor` (through layout-only ops) indexes, with the lookup in words; None if it indexes none."""
    sizes = []
    for node in consumers.get(tensor, []):
        if node.op_type in LAYOUT_OPS:
            sized = _table_size(node.output[0], consumers, constants)
        elif node.op_type == "Gather" and node.input[1] == tensor and node.input[0] in constants:
            axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
            rows = constants[node.input[0]].shape[axis] if constants[node.input[0]].ndim else 0
            sized = (rows, f"the rows of the table {node.input[0]!r} its graph gathers from") if rows else None
        elif node.op_type == "OneHot" and node.input[0] == tensor and node.input[1] in constants:
            depth = int(constants[node.input[1]].reshape(-1)[0]) if constants[node.input[1]].size else 0
            sized = (depth, f"the classes of its graph's OneHot (depth {depth})") if depth > 0 else None
        else:
            sized = None
        if sized:
            sizes.append(sized)
    return min(sizes) if sizes else None


def _is_constant(constants: dict, name: str, value: float) -> bool:
    """Whether `name` is a constant holding `value` only, within float16's rounding of 1/255 (1/256 is not)."""
    array = constants.get(name)
    return array is not None and array.size > 0 and bool(np.allclose(array.astype(np.float64), value, rtol=1e-3, atol=0))


# Ops that compute on quantized values (ONNX's and ONNX Runtime's contrib ops), and what quantizes or dequantizes.
QUANTIZED_OPS = {
    "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "DynamicQuantizeLSTM", "QGemm", "QAttention", "QLinearAdd", "QLinearMul",
}
QUANTIZING_OPS = QUANTIZED_OPS | {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# Ops that quantize activations with one scale computed over the whole tensor at each call (ORT's dynamic int8): a
# row's answer depends on the rest of the call's batch. QuantizeLinear's scale is an input fixed in the file.
PER_CALL_QUANTIZING_OPS = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}
HALF_TYPES = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def computes_in(proto: onnx.ModelProto) -> tuple[str, str]:
    """("int8" | "fp16" | "fp32", what says so): the lowest precision the graph computes in as it was handed over.
    A model already quantized or halved by its user is that precision in its as-given cell too."""
    nodes = [node for graph in subgraphs(proto.graph) for node in graph.node]
    quantizing = sorted({node.op_type for node in nodes if node.op_type in QUANTIZING_OPS})
    if quantizing:
        count = sum(node.op_type in QUANTIZING_OPS for node in nodes)
        return "int8", f"{_counted(count, 'quantization op')} ({', '.join(quantizing)})"
    types = weight_types(proto)
    half_weights = types["float16"] + types["bfloat16"]
    half_casts = sum(node.op_type == "Cast" and any(a.name == "to" and a.i in HALF_TYPES for a in node.attribute)
                     for node in nodes)
    half_inputs = sum(value.type.tensor_type.elem_type in HALF_TYPES for value in proto.graph.input)
    if half_weights or half_casts or half_inputs:
        counted = [_counted(half_weights, "float16 weight tensor"), _counted(half_casts, "float16 Cast node"),
                   _counted(half_inputs, "float16 input")]
        return "fp16", ", ".join(part for part in counted if part)
    return "fp32", ""


def _counted(count: int, thing: str) -> str:
    """'1 thing', '6 things', or '' for none (evidence names what is there)."""
    return f"{count} {thing}{'s' if count != 1 else ''}" if count else ""


def weight_types(proto: onnx.ModelProto) -> Counter[str]:
    """How many weight tensors (initializers and Constant values, in every subgraph) hold each dtype, by numpy's name."""
    return Counter(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).name
                   for graph in subgraphs(proto.graph) for tensor in _tensors(graph))


def subgraphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """The graph and every subgraph its nodes hold (If branches, Loop and Scan bodies), depth first."""
    found = [graph]
    for node in graph.node:
        for attribute in node.attribute:
            for inner in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                found += subgraphs(inner)
    return found
