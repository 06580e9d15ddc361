"""Ground truth: the same graph evaluated in float64 by onnx's reference evaluator.

Every float tensor of the graph (initializers, constants, casts, inputs, the
tensors an op makes of a given dtype or of its float default, the model's local
functions too) is widened to float64, so the reference is exact up to float64
rounding rather than another float32 implementation. An explicit `Cast to=FLOAT16/BFLOAT16` is
the model's own choice of precision, so it keeps its rounding (cast there,
then widened). For discrete actions the evaluator also exposes the logits
feeding ArgMax/ArgMin (or the value a final Round rounds), to know each
decision's margin; an action that concatenates several decisions (SB3's
MultiDiscrete: one ArgMax per dimension, Unsqueezed and Concatenated) gets each
element its own decision's margin.
Slow by design: an oracle, not a runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..errors import error_line
from ..inputs.model import ModelInfo
from ..inputs import observations
from ..inputs.observations import Feeds, run_in_batches

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
NARROW_TYPES = {TensorProto.FLOAT16, TensorProto.BFLOAT16}  # an explicit Cast to these keeps its rounding
DEFAULT_DOMAINS = ("", "ai.onnx")
FLOAT_BY_DEFAULT = {"RandomNormal", "RandomUniform"}  # their dtype's default is FLOAT (the *Like ops': the input's type)
DECISION_OPS = {"ArgMax", "ArgMin", "Round"}  # Round: a float decision per element (SB3's MultiBinary: Round(probs))
# Between a decision and the output: ops that move its values but not which one won (torch.distributions' Expand
# to the batch shape, as SB3's Bernoulli writes it, included: a margin used only where its size is the output's).
PASS_THROUGH_OPS = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"}
LOGITS_PREFIX = "policy_matrix_logits:"
PART_PREFIX = "policy_matrix_part:"  # a concatenated decision as the Concat takes it: the shape its margins take
MARGINS_FILE = "reference_margins.npz"  # beside reference.npz: the decision margins by output name
MISSING_OPERATOR = re.compile(r"No registered implementation for operator '([^']*)' and domain '([^']*)'")


@dataclass(frozen=True)
class Decision:
    """One ArgMax/ArgMin/Round behind a discrete output: the extra outputs the evaluator is asked for, and its axis."""

    logits: str
    axis: int
    op: str
    part: str | None = None  # set for one of several decisions a Concat joins into the output


@dataclass
class Reference:
    outputs: Feeds  # float64 (or the declared integer dtype) per model output
    margins: dict[str, np.ndarray]  # per discrete output: top-1 minus top-2 logit per sample


def compute(model: ModelInfo, feeds: Feeds, batch: int) -> Reference:
    wide = to_float64(_tensor_outputs_only(model.proto, model.excluded_outputs))
    decisions = _expose_logits(wide)
    evaluator = evaluator_for(wide)
    extra = [name for parts, _ in decisions.values() for d in parts for name in (d.logits, d.part) if name]
    names = [spec.name for spec in model.outputs] + extra
    wide_feeds = {name: _widen(array) for name, array in feeds.items()}
    results = run_in_batches(lambda f: dict(zip(names, evaluator.run(names, f))), wide_feeds, batch, model.batch_axes)
    margins = {output: _margins(results, parts, concat_axis) for output, (parts, concat_axis) in decisions.items()}
    return Reference(outputs=results, margins=margins)


def _margins(results: Feeds, parts: list[Decision], concat_axis: int | None) -> np.ndarray:
    """Each decision's margins, taken out of `results`; joined as the Concat joins the decisions."""
    if concat_axis is None:
        (decision,) = parts
        return _margin(results.pop(decision.logits), decision.axis, decision.op)
    pieces = [_margin(results.pop(d.logits), d.axis, d.op).reshape(results.pop(d.part).shape) for d in parts]
    return np.concatenate(pieces, axis=concat_axis)


def evaluator_for(proto: onnx.ModelProto):
    """onnx's reference evaluator with the operators it gets wrong replaced (reference_ops.py). Imported here, as
    ORT in dev_runtime: the runner uses only Reference and save, and the evaluator runs in the reference job,
    forked from a server that imports both, and the evaluator's operator modules, while the runner starts (matrix/run/forkserver.py)."""
    from onnx.reference import ReferenceEvaluator

    from .reference_ops import CORRECTED_OPS

    return ReferenceEvaluator(proto, new_ops=CORRECTED_OPS)


def save(ref: Reference, path: Path) -> None:
    """The reference beside the observations, so anyone can audit a verdict: outputs by name in `path`, each discrete
    output's decision margins by the output's name in MARGINS_FILE beside it. Two files, not margins as members
    `margin:<output>` among the outputs: an output may be named anything, `margin:action` too."""
    observations.save(ref.outputs, path)
    observations.save(ref.margins, path.with_name(MARGINS_FILE))


def dev_runtime(model: ModelInfo, feeds: Feeds, batch: int) -> Feeds:
    """The development runtime's answer (ORT CPU, fp32): the report's second column."""
    import onnxruntime as ort  # in the reference job; the runner, which imports this module too, never loads ORT

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [spec.name for spec in model.outputs]
    return run_in_batches(lambda f: dict(zip(names, session.run(names, f))), feeds, batch, model.batch_axes)


def _tensor_outputs_only(proto: onnx.ModelProto, excluded: dict[str, str]) -> onnx.ModelProto:
    """The graph without its non-tensor outputs and the nodes only they need (onnx.reference has no ZipMap)."""
    if not excluded:
        return proto
    pruned = onnx.ModelProto()
    pruned.CopyFrom(proto)
    graph = pruned.graph
    kept = [value for value in graph.output if value.name not in excluded]
    del graph.output[:]
    graph.output.extend(kept)
    needed = {value.name for value in kept}
    live = []
    for node in reversed(graph.node):
        if needed.intersection(node.output):
            live.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(live))
    return pruned


def error_words(error: Exception) -> str:
    """The evaluator's failure as one line: an operator it has no implementation of is named, without its list of
    every operator it has and its advice to skip a test of onnx's own."""
    missing = MISSING_OPERATOR.search(str(error))
    if missing is None:
        return error_line(error)
    op, domain = missing.groups()
    return f"onnx's reference evaluator has no implementation of operator {op!r}" + (f" of domain {domain!r}" if domain else "")


def to_float64(proto: onnx.ModelProto) -> onnx.ModelProto:
    wide = onnx.ModelProto()
    wide.CopyFrom(proto)
    _widen_graph(wide.graph)
    for function in wide.functions:  # a call's float64 inputs meet the body's constants and casts
        del function.value_info[:]
        _widen_nodes(function.node)
    return wide


def _widen_graph(graph: onnx.GraphProto) -> None:
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type in FLOAT_TYPES:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    del graph.value_info[:]
    for tensor in graph.initializer:
        _widen_tensor(tensor)
    _widen_nodes(graph.node)


def _widen_nodes(container) -> None:
    """A graph's or a function's nodes, widened in place."""
    nodes = []
    for node in container:
        if _is_narrow_cast(node):
            nodes += _narrow_then_widen(node)
        else:
            _widen_node(node)
            nodes.append(node)
    del container[:]
    container.extend(nodes)


def _is_narrow_cast(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and any(a.name == "to" and a.i in NARROW_TYPES for a in node.attribute)


def _narrow_then_widen(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Cast to fp16 stays a Cast to fp16, followed by one to float64: the rounding is the model's."""
    narrow = f"{node.output[0]}__narrow"
    widen = onnx.helper.make_node("Cast", [narrow], [node.output[0]], to=TensorProto.DOUBLE)
    node.output[0] = narrow
    return [node, widen]


def _widen_node(node: onnx.NodeProto) -> None:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            _widen_tensor(attribute.t)
        elif attribute.type == onnx.AttributeProto.GRAPH:
            _widen_graph(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            for graph in attribute.graphs:
                _widen_graph(graph)
        elif attribute.name == _type_attribute(node) and attribute.i in FLOAT_TYPES:
            attribute.i = TensorProto.DOUBLE
    _widen_float_default(node)
    if node.op_type == "Constant" and node.attribute[0].name in ("value_float", "value_floats"):
        values = np.asarray(onnx.helper.get_attribute_value(node.attribute[0]), dtype=np.float64)
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(values)))


def _type_attribute(node: onnx.NodeProto) -> str | None:
    """The attribute naming the element type the op makes: Cast's `to`; `dtype` of EyeLike, the Random* ops, Bernoulli."""
    if node.domain not in DEFAULT_DOMAINS:
        return None
    return "to" if node.op_type == "Cast" else "dtype"


def _widen_float_default(node: onnx.NodeProto) -> None:
    """An op that makes float32 when its attribute is left out is told to make float64 instead."""
    if node.domain not in DEFAULT_DOMAINS:
        return
    given = {attribute.name for attribute in node.attribute}
    if node.op_type == "ConstantOfShape" and "value" not in given:
        node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(np.zeros(1))))
    elif node.op_type in FLOAT_BY_DEFAULT and "dtype" not in given:
        node.attribute.append(onnx.helper.make_attribute("dtype", TensorProto.DOUBLE))


def _widen_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type in FLOAT_TYPES:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))


def _widen(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def _expose_logits(graph_model: onnx.ModelProto) -> dict[str, tuple[list[Decision], int | None]]:
    """Map each discrete output to its decisions and the axis a Concat joins them on (None: one decision),
    and add the outputs those decisions need."""
    graph = graph_model.graph
    producers = {out: node for node in graph.node for out in node.output}
    found = {}
    for output in list(graph.output):
        node = _behind_pass_through(output.name, producers)
        if node is not None and node.op_type in DECISION_OPS:
            found[output.name] = ([_expose(graph, node, f"{LOGITS_PREFIX}{output.name}")], None)
        elif node is not None and node.op_type == "Concat":
            joined = [_behind_pass_through(name, producers) for name in node.input]
            if joined and all(part is not None and part.op_type in DECISION_OPS for part in joined):
                parts = [_expose(graph, part, f"{LOGITS_PREFIX}{output.name}:{k}", (name, f"{PART_PREFIX}{output.name}:{k}"))
                         for k, (part, name) in enumerate(zip(joined, node.input))]
                found[output.name] = (parts, next(a.i for a in node.attribute if a.name == "axis"))
    return found


def _behind_pass_through(tensor: str, producers: dict[str, onnx.NodeProto]) -> onnx.NodeProto | None:
    node = producers.get(tensor)
    while node is not None and node.op_type in PASS_THROUGH_OPS:
        node = producers.get(node.input[0])
    return node


def _expose(graph: onnx.GraphProto, decision: onnx.NodeProto, logits: str, part: tuple[str, str] | None = None) -> Decision:
    """Add the logits feeding `decision` as an output named `logits` (and `part`: a Concat input, as a named output)."""
    for source, name in [(decision.input[0], logits), *([part] if part else [])]:
        graph.node.append(onnx.helper.make_node("Identity", [source], [name]))
        graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    axis = next((a.i for a in decision.attribute if a.name == "axis"), 0)
    return Decision(logits, axis, decision.op_type, part[1] if part else None)


def _margin(logits: np.ndarray, axis: int, op: str) -> np.ndarray:
    if op == "Round":  # how far each value is from the boundary where rounding turns (x.5)
        return np.abs(logits - np.floor(logits) - 0.5)
    values = -logits if op == "ArgMin" else logits
    top2 = -np.sort(-values, axis=axis).take([0, 1], axis=axis) if values.shape[axis] > 1 else None
    if top2 is None:
        return np.full(np.delete(values.shape, axis), np.inf)
    return np.abs(np.take(top2, 0, axis=axis) - np.take(top2, 1, axis=axis))
