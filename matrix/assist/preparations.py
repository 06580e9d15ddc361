"""The graph-preparation axis: which change to the exported graph makes a failing target work.

Each step is a real, kept tool or a small rewrite whose effect is measurable,
and each says what it changed (node names included), or nothing when it does
not apply:
- `simplify`: onnxsim with the inputs fixed at the deployment batch (folds dead
  shape subgraphs such as SB3's Shape/ConstantOfShape/Expand/Reshape);
- `opset17`: onnx.version_converter to opset 17 at IR 8 (runtimes/converters that lag; a graph
  already at opset <= 17 gets IR 8 only);
- rewrites: `argmax-cut` (the graph returns the logits; the host takes the
  argmax), `minmax-clip` (Min/Max with a constant -> Clip, nested Clips fused),
  `reshape-allowzero` (allowzero=1 -> 0 when the shape has no zero),
  `gemm-bias-rank1` (a rank-0 Gemm bias -> rank 1), `gemm-zero-bias` (an explicit
  zero bias for a Gemm without one), `softsign` (x / (1 + |x|)), `u8-weights` (signed 8-bit
  weights as uint8 + 128 with zero points + 128: the same numbers, onnxruntime's U8U8 kernels; int8_weights.py);
  and, only where a known cause of the failure names it (matrix/messages.py), `gemm-matmul` (Gemm -> MatMul +
  Add, the same product: tract cannot open an fp16 Gemm).

Besides the graph, the variant itself: a failing fp16 or int8 cell whose
`--diagnose` named the first divergent node first tries its variant made with
that node kept in fp32 (onnxconverter-common's block list, ORT quantization's
excluded nodes): the general fix for an fp16 overflow.

A failing (target, variant) cell tries, cheapest first, that variant, then every
step that applies on its own, then all of them together (opset17 -> simplify ->
rewrites), each through the same real target and the same judge as any cell,
and stops at the first PASS. The prepared ONNX is saved beside the results.

A preparation that changes the model's interface (an input or output name, a
dtype, any dim other than a symbolic batch fixed to the batch it is fed) is a
different model to whoever calls it: it is listed as tried, with what changed,
and never run or offered as a fix (onnxsim at batch 1 fixes every other
symbolic dim to 1 as well: silero-vad's `state [2, ?, 128]` became `[1, 1, 128]`).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import messages
from ..run import cells, guarded
from ..errors import error_line
from ..run.protocol import CellInputs
from ..inputs import model as model_loader
from ..run import variants as core_variants
from ..inputs.model import ModelInfo
from ..results import Cell, FixAttempt

TARGET_OPSET = 17
TARGET_IR = 8  # opset 17's
DEPLOYMENT_BATCH = 1


@dataclass
class Prepared:
    proto: onnx.ModelProto
    steps: list[str] = field(default_factory=list)
    fixed_batch: int | None = None
    host_argmax: dict[str, tuple[str, int, bool, str]] = field(default_factory=dict)  # output -> (logits, axis, keepdims, dtype)
    error: str = ""  # the preparing tool's own failure (never a runtime verdict)
    keep_fp32: tuple[str, ...] = ()  # nodes the cell's variant keeps in float32 (the graph itself is unchanged)

    def apply(self, name: str) -> bool:
        """Apply step `name` in place; False when it does not apply."""
        return STEPS[name](self)


# --- steps ---------------------------------------------------------------------------------


def _simplify(prepared: Prepared) -> bool:
    import onnxsim

    before = Counter(node.op_type for node in prepared.proto.graph.node)
    shapes = {value.name: _fixed_shape(value, DEPLOYMENT_BATCH) for value in _graph_inputs(prepared.proto)}
    source = _copy(prepared.proto)
    del source.graph.value_info[:]  # inferred for the symbolic inputs: they would contradict the fixed ones
    simplified, ok = onnxsim.simplify(source, overwrite_input_shapes=shapes)
    if not ok:
        raise RuntimeError("onnxsim could not verify the simplified graph against the original")
    after = Counter(node.op_type for node in simplified.graph.node)
    prepared.proto, prepared.fixed_batch = simplified, DEPLOYMENT_BATCH
    removed = before - after
    folded = ", ".join(f"{op} x{n}" for op, n in sorted(removed.items())) or "nothing removed"
    prepared.steps.append(f"onnxsim at batch {DEPLOYMENT_BATCH}: {sum(before.values())} -> {sum(after.values())} nodes ({folded})")
    return True


def _fixed_shape(value: onnx.ValueInfoProto, batch: int) -> list[int]:
    dims = value.type.tensor_type.shape.dim
    return [batch] + [d.dim_value if d.HasField("dim_value") else 1 for d in dims[1:]]


def _opset17(prepared: Prepared) -> bool:
    """Opset 17 at its IR 8; a graph already at opset 17 or below only gets IR 8 (onnx >= 1.23 saves IR 14 at
    any opset, which runtimes from before it refuse)."""
    before, ir_before = _opset(prepared.proto), prepared.proto.ir_version
    if before <= TARGET_OPSET and ir_before <= TARGET_IR:
        return False
    if before > TARGET_OPSET:
        prepared.proto = onnx.version_converter.convert_version(prepared.proto, TARGET_OPSET)
    prepared.proto.ir_version = min(prepared.proto.ir_version, TARGET_IR)
    if before > TARGET_OPSET:
        prepared.steps.append(f"onnx.version_converter: opset {before} -> {TARGET_OPSET} (IR {prepared.proto.ir_version})")
    else:
        prepared.steps.append(f"IR {ir_before} -> {TARGET_IR} (opset {before} needs no later IR)")
    return True


def _argmax_cut(prepared: Prepared) -> bool:
    graph = prepared.proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    cut = []
    for output in graph.output:
        chain, node = [], producers.get(output.name)
        while node is not None and node.op_type == "Cast":
            chain.append(node)
            node = producers.get(node.input[0])
        if node is None or node.op_type != "ArgMax":
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        keepdims = bool(next((a.i for a in node.attribute if a.name == "keepdims"), 1))
        dtype = helper.tensor_dtype_to_np_dtype(output.type.tensor_type.elem_type).name
        prepared.host_argmax[output.name] = (node.input[0], axis, keepdims, dtype)
        cut.append((output, node, chain))
    for output, node, chain in cut:
        for removed in [node, *chain]:
            graph.node.remove(removed)
        graph.output.remove(output)
        graph.output.append(helper.make_empty_tensor_value_info(node.input[0]))
        names = ", ".join(n.name or n.op_type for n in [node, *chain])
        logits, axis, _, _ = prepared.host_argmax[output.name]
        prepared.steps.append(f"ArgMax head cut: removed {names}; the graph returns {logits} and the host "
                              f"takes its argmax over axis {axis} to make {output.name}")
    if cut:
        _retype_outputs(prepared.proto)
    return bool(cut)


def _minmax_clip(prepared: Prepared) -> bool:
    if _opset(prepared.proto) < 11:  # Clip takes min/max as inputs from opset 11
        return False
    graph = prepared.proto.graph
    known = constants(prepared.proto)
    changed = []
    for index, node in enumerate(list(graph.node)):
        if node.op_type not in ("Min", "Max") or len(node.input) != 2:
            continue
        const = [name for name in node.input if name in known and known[name].size == 1]
        other = [name for name in node.input if name not in const]
        if len(const) != 1 or len(other) != 1:
            continue
        value = known[const[0]]
        bound = _scalar(graph, f"{node.name or node.output[0]}/bound", value)
        unbounded = _scalar(graph, f"{node.name or node.output[0]}/unbounded",
                            np.array(np.finfo(value.dtype).min if node.op_type == "Min" else np.finfo(value.dtype).max, value.dtype))
        low, high = (unbounded, bound) if node.op_type == "Min" else (bound, unbounded)
        changed.append(f"{node.name or node.output[0]} ({node.op_type} with {float(value.ravel()[0]):g})")
        graph.node[index].CopyFrom(helper.make_node("Clip", [other[0], low, high], list(node.output), name=node.name))
    if not changed:
        return False
    fused = _fuse_clips(prepared.proto)
    _drop_unused_initializers(graph)
    prepared.steps.append(f"Min/Max with a constant -> Clip: {', '.join(changed)}" + (f"; fused {', '.join(fused)}" if fused else ""))
    return True


def _fuse_clips(proto: onnx.ModelProto) -> list[str]:
    """Clip(Clip(x, a, b), c, d) -> Clip(x, max(a, c), min(b, d)) when the inner one feeds nothing else."""
    graph = proto.graph
    fused = []
    while True:
        known = constants(proto)
        pair = _nested_clips(graph, known)
        if pair is None:
            return fused
        inner, outer = pair
        low = np.maximum(known[inner.input[1]], known[outer.input[1]])
        high = np.minimum(known[inner.input[2]], known[outer.input[2]])
        low_name = _scalar(graph, f"{outer.name or outer.output[0]}/min", low)
        high_name = _scalar(graph, f"{outer.name or outer.output[0]}/max", high)
        outer.input[:] = [inner.input[0], low_name, high_name]
        graph.node.remove(inner)
        fused.append(f"{inner.name} into {outer.name} [{float(low):g}, {float(high):g}]")


def _nested_clips(graph: onnx.GraphProto, known: dict[str, np.ndarray]):
    """(inner, outer) Clips with constant bounds where the inner one feeds only the outer one, or None."""
    consumers = Counter(name for node in graph.node for name in node.input)
    outputs = {value.name for value in graph.output}
    clips = {node.output[0]: node for node in graph.node if node.op_type == "Clip" and len(node.input) == 3}
    for outer in clips.values():
        inner = clips.get(outer.input[0])
        if inner is None or consumers[inner.output[0]] != 1 or inner.output[0] in outputs:
            continue
        if all(name in known for name in [*inner.input[1:], *outer.input[1:]]):
            return inner, outer
    return None


def _reshape_allowzero(prepared: Prepared) -> bool:
    known = constants(prepared.proto, kinds="iu")
    changed = []
    for node in prepared.proto.graph.node:
        flag = next((a for a in node.attribute if a.name == "allowzero"), None)
        if node.op_type != "Reshape" or flag is None or flag.i != 1:
            continue
        shape = known.get(node.input[1])
        if shape is None or (shape == 0).any():  # a zero would mean "copy" instead of "empty" after the change
            continue
        node.attribute.remove(flag)
        changed.append(node.name or node.output[0])
    if changed:
        prepared.steps.append(f"Reshape allowzero=1 -> 0 (its shape has no zero): {', '.join(changed)}")
    return bool(changed)


def _gemm_bias_rank1(prepared: Prepared) -> bool:
    def rank1(node: onnx.NodeProto, initializers: dict) -> str | None:
        if len(node.input) < 3 or node.input[2] not in initializers:
            return None
        bias = numpy_helper.to_array(initializers[node.input[2]])
        if bias.ndim != 0:
            return None
        weights = initializers.get(node.input[1])
        width = _gemm_width(node, numpy_helper.to_array(weights)) if weights is not None else 1
        return _add_initializer(prepared.proto.graph, np.full((width,), bias, bias.dtype), f"{node.input[2]}/rank1")

    return _rewrite_gemm_biases(prepared, rank1, "rank-0 Gemm bias -> rank 1")


def _gemm_zero_bias(prepared: Prepared) -> bool:
    """An explicit zero bias for a Gemm without input C (onnxruntime-web's WebGL Gemm needs one)."""
    def zero(node: onnx.NodeProto, initializers: dict) -> str | None:
        if (len(node.input) > 2 and node.input[2]) or node.input[1] not in initializers:
            return None
        weights = numpy_helper.to_array(initializers[node.input[1]])
        zeros = np.zeros((_gemm_width(node, weights),), weights.dtype)
        return _add_initializer(prepared.proto.graph, zeros, f"{node.name or node.output[0]}/zero_bias")

    return _rewrite_gemm_biases(prepared, zero, "explicit zero bias for Gemm without one")


def _rewrite_gemm_biases(prepared: Prepared, new_bias: Callable[[onnx.NodeProto, dict], str | None], step: str) -> bool:
    """Give each Gemm for which `new_bias` makes one (an initializer's name) that bias as input C."""
    graph = prepared.proto.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    changed = []
    for node in [n for n in graph.node if n.op_type == "Gemm"]:
        bias = new_bias(node, initializers)
        if bias is None:
            continue
        del node.input[2:]
        node.input.append(bias)
        changed.append(node.name or node.output[0])
    _drop_unused_initializers(graph)
    if changed:
        prepared.steps.append(f"{step}: {', '.join(changed)}")
    return bool(changed)


def _gemm_matmul(prepared: Prepared) -> bool:
    """Each Gemm as MatMul, then Mul by alpha and Add of beta * C where they are not 1 and absent: the same product.
    tract 0.23 expands an fp16 Gemm into ops it types F32 ("Output mismatch after rewiring expansion ... expected
    F16 got F32") and cannot open the file; it runs the fp16 MatMul + Add."""
    graph = prepared.proto.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    changed = []
    for index in reversed(range(len(graph.node))):
        node = graph.node[index]
        if node.op_type != "Gemm":
            continue
        replacement = _as_matmul(node, graph, initializers)
        del graph.node[index]
        for offset, new in enumerate(replacement):
            graph.node.insert(index + offset, new)
        changed.append(node.name or node.output[0])
    _drop_unused_initializers(graph)
    if changed:
        prepared.steps.append(f"Gemm -> MatMul + Add (the same product): {', '.join(reversed(changed))}")
    return bool(changed)


def _as_matmul(node: onnx.NodeProto, graph: onnx.GraphProto, initializers: dict) -> list[onnx.NodeProto]:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    base = node.name or node.output[0]
    weights = initializers.get(node.input[1])
    dtype = numpy_helper.to_array(weights).dtype if weights is not None else np.float32
    nodes: list[onnx.NodeProto] = []

    def then(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [f"{base}/{name}"], name=f"{base}/{name}", **attrs))
        return f"{base}/{name}"

    a, b = node.input[0], node.input[1]
    if attributes.get("transA", 0):
        a = then("Transpose", [a], "transpose_a", perm=[1, 0])
    if attributes.get("transB", 0):
        b = (_add_initializer(graph, numpy_helper.to_array(weights).T.copy(), f"{b}/transposed") if weights is not None
             else then("Transpose", [b], "transpose_b", perm=[1, 0]))
    product = then("MatMul", [a, b], "matmul")
    if attributes.get("alpha", 1.0) != 1.0:
        product = then("Mul", [product, _scalar(graph, f"{base}/alpha", np.array(attributes["alpha"], dtype))], "alpha_ab")
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias and attributes.get("beta", 1.0) != 1.0:
        bias = then("Mul", [bias, _scalar(graph, f"{base}/beta", np.array(attributes["beta"], dtype))], "beta_c")
    if bias:
        then("Add", [product, bias], "bias")
    nodes[-1].output[0] = node.output[0]  # the Gemm's output, by its name: what reads it is unchanged
    return nodes


def _gemm_width(node: onnx.NodeProto, weights: np.ndarray) -> int:
    """A Gemm's output width: B's columns, or its rows when transB."""
    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
    return weights.shape[0 if trans_b else 1]


def _add_initializer(graph: onnx.GraphProto, value: np.ndarray, name: str) -> str:
    graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _unsigned_weights(prepared: Prepared) -> bool:
    from . import int8_weights  # here: a plain run imports this module, and only --assist rewrites

    changed = int8_weights.to_unsigned(prepared.proto)
    _drop_unused_initializers(prepared.proto.graph)
    if changed:
        prepared.steps.append(f"signed int8 weights -> uint8 + 128, zero points + 128 (the same values): {', '.join(changed)}")
    return bool(changed)


def _softsign(prepared: Prepared) -> bool:
    graph = prepared.proto.graph
    changed = []
    for index in reversed(range(len(graph.node))):
        node = graph.node[index]
        if node.op_type != "Softsign":
            continue
        base = node.name or node.output[0]
        one = _scalar(graph, f"{base}/one", np.array(1.0, np.float32))
        replacement = [
            helper.make_node("Abs", [node.input[0]], [f"{base}/abs"], name=f"{base}/abs"),
            helper.make_node("Add", [f"{base}/abs", one], [f"{base}/denominator"], name=f"{base}/add"),
            helper.make_node("Div", [node.input[0], f"{base}/denominator"], list(node.output), name=base),
        ]
        del graph.node[index]
        for offset, new in enumerate(replacement):
            graph.node.insert(index + offset, new)
        changed.append(base)
    if changed:
        prepared.steps.append(f"Softsign -> x / (1 + |x|): {', '.join(reversed(changed))}")
    return bool(changed)


STEPS: dict[str, Callable[[Prepared], bool]] = {
    "argmax-cut": _argmax_cut, "minmax-clip": _minmax_clip, "reshape-allowzero": _reshape_allowzero,
    "gemm-bias-rank1": _gemm_bias_rank1, "gemm-zero-bias": _gemm_zero_bias, "softsign": _softsign, "u8-weights": _unsigned_weights,
    "gemm-matmul": _gemm_matmul, "opset17": _opset17, "simplify": _simplify,
}
REWRITES = ("argmax-cut", "minmax-clip", "reshape-allowzero", "gemm-bias-rank1", "gemm-zero-bias", "softsign", "u8-weights")
# Steps tried only where a known cause of the cell's failure names them (matrix/messages.py): gemm-matmul rewrites
# every Gemm, which only tract's fp16 needs; among the steps tried on every failing cell it would cost each one more
# attempt (a LiteRT conversion) and join every combined fix.
NAMED_ONLY = ("gemm-matmul",)
COMBINED = ("opset17", "simplify", *REWRITES)


def candidates(proto: onnx.ModelProto) -> list[tuple[str, Prepared]]:
    """Every single step that applies, then all of them in COMBINED order; identical graphs once."""
    found, seen = [], set()
    for recipe in [(name,) for name in (*REWRITES, "opset17", "simplify")] + [COMBINED]:
        prepared = Prepared(_copy(proto))
        try:
            applied = [name for name in recipe if prepared.apply(name)]
            prepared.proto = _checked(prepared.proto)
        except Exception as error:  # one tool failing costs its recipe only
            found.append((" + ".join(recipe), Prepared(proto, error=error_line(error, 400))))
            continue
        if not applied:
            continue
        digest = hashlib.sha256(prepared.proto.SerializeToString(deterministic=True)).hexdigest()
        if digest not in seen:
            seen.add(digest)
            found.append((" + ".join(applied), prepared))
    return found


def _checked(proto: onnx.ModelProto) -> onnx.ModelProto:
    proto = onnx.shape_inference.infer_shapes(proto)
    onnx.checker.check_model(proto, full_check=True)
    return proto


# --- trying them on a failing cell -------------------------------------------------------


def wants_fixes(cell: Cell) -> bool:
    return cell.verdict == "FAIL"


# What counts as fixed: it runs and passes, or (a conversion-only cell) it converts.
FIXED = ("PASS", "CONVERTED")


def try_fixes(
    cell: Cell, info: ModelInfo, template: CellInputs, judge: Callable[[cells.CellOutcome, Cell, ModelInfo], Cell],
    folder: Path, report_root: Path, env: dict, limits: guarded.Limits,
) -> list[FixAttempt]:
    """Try the candidates on one failing cell, cheapest first, until one PASSes."""
    folder.mkdir(parents=True, exist_ok=True)
    attempts = []
    named = [*_kept_in_fp32(cell, info), *_named_by_cause(cell, info)]
    tried = {name for name, _ in named}
    generic = [(name, prepared) for name, prepared in _guarded_candidates(info, folder / "candidates", limits) if name not in tried]
    for name, prepared in [*named, *generic]:
        if prepared.error:
            attempts.append(FixAttempt(preparation=name, verdict="SKIP", reasons=[f"the preparation itself failed: {prepared.error}"]))
            continue
        if changed := interface_change(info.proto, prepared):
            attempts.append(FixAttempt(preparation=name, steps=prepared.steps, verdict="SKIP",
                                       reasons=[f"refused as a fix: it changes the model's interface ({changed})"]))
            continue
        attempt = _attempt(cell, info, template, judge, folder, report_root, env, limits, name, prepared)
        attempts.append(attempt)
        if attempt.verdict in FIXED:
            break
    return attempts


def _named_by_cause(cell: Cell, info: ModelInfo) -> list[tuple[str, Prepared]]:
    """The step a known cause of the cell's failure names (e.g. tract's fp16 Gemm: gemm-matmul), tried before the
    steps tried on every failing cell."""
    name = messages.preparation_for(cell.target, cell.error.message, info.proto) if cell.error else None
    if name is None:
        return []
    prepared = Prepared(_copy(info.proto))
    try:
        if not prepared.apply(name):
            return []
        prepared.proto = _checked(prepared.proto)
    except Exception as error:  # the tool's rewrite failing: said as that attempt's, never the runtime's
        return [(name, Prepared(info.proto, error=error_line(error, 400)))]
    return [(name, prepared)]


def _kept_in_fp32(cell: Cell, info: ModelInfo) -> list[tuple[str, Prepared]]:
    """The cell's own variant with the node `--diagnose` named kept in fp32, when it named one."""
    first = cell.diagnosis.first if cell.diagnosis else None
    node = core_variants.node_name(info.proto, first.node) if first and cell.variant in ("fp16", "int8") else None
    if node is None:
        return []
    step = f"{node} ({first.op_type}) kept in fp32 in the {cell.variant} variant: --diagnose names it the first node that leaves the reference"
    return [(f"keep {node} in fp32", Prepared(info.proto, steps=[step], keep_fp32=(node,)))]


def interface_change(original: onnx.ModelProto, prepared: Prepared) -> str:
    """What the prepared graph changes in the model's interface, "" when nothing: names, dtypes and dims stay,
    except a symbolic batch (axis 0) fixed to the batch the prepared graph is fed. Outputs the host makes
    (an ArgMax head cut) are the original's."""
    host_made = {logits for logits, _, _, _ in prepared.host_argmax.values()}
    kept_outputs = [o for o in prepared.proto.graph.output if o.name not in host_made]
    after_outputs = {**_signatures(kept_outputs), **{k: v for k, v in _signatures(original.graph.output).items() if k in prepared.host_argmax}}
    changes = [*_changes("input", _signatures(_graph_inputs(original)), _signatures(_graph_inputs(prepared.proto)), prepared.fixed_batch),
               *_changes("output", _signatures(original.graph.output), after_outputs, prepared.fixed_batch)]
    return "; ".join(changes)


def _signatures(values) -> dict[str, tuple[str, list]]:
    return {v.name: (onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower(),
                     [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in v.type.tensor_type.shape.dim])
            for v in values}


def _changes(kind: str, before: dict, after: dict, fixed_batch: int | None) -> list[str]:
    changes = [f"{kind} {name} removed" for name in before if name not in after]
    changes += [f"new {kind} {name}" for name in after if name not in before]
    for name in [n for n in before if n in after]:
        (dtype, dims), (new_dtype, new_dims) = before[name], after[name]
        if dtype != new_dtype:
            changes.append(f"{kind} {name} {dtype} -> {new_dtype}")
        elif not _same_dims(dims, new_dims, fixed_batch):
            changes.append(f"{kind} {name} {_dims(dims)} -> {_dims(new_dims)}")
    return changes


def _same_dims(dims: list, new_dims: list, fixed_batch: int | None) -> bool:
    """Equal, but for a symbolic batch (axis 0) fixed to the batch the prepared graph is fed."""
    if len(dims) != len(new_dims) or dims[1:] != new_dims[1:]:
        return False
    return not dims or dims[0] == new_dims[0] or (isinstance(dims[0], str) and new_dims[0] == fixed_batch)


def _dims(dims: list) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _guarded_candidates(info: ModelInfo, folder: Path, limits: guarded.Limits) -> list[tuple[str, Prepared]]:
    """`candidates` in a guarded process (matrix.run.guarded): onnxsim runs the model to check its folding."""
    answer = guarded.run("preparations", {"model": str(info.path.resolve())}, folder, limits)
    return [(row["name"], Prepared(onnx.load(str(folder / row["file"])), row["steps"], row["fixed_batch"],
                                   {k: tuple(v) for k, v in row["host_argmax"].items()}, row["error"]))
            for row in answer["candidates"]]


def guarded_step(spec: dict, folder: Path) -> dict:
    rows = []
    for i, (name, prepared) in enumerate(candidates(model_loader.load(Path(spec["model"])).proto)):
        onnx.save(prepared.proto, str(folder / f"{i}.onnx"))
        rows.append({"name": name, "file": f"{i}.onnx", "steps": prepared.steps, "fixed_batch": prepared.fixed_batch,
                     "host_argmax": prepared.host_argmax, "error": prepared.error})
    return {"candidates": rows}


def _in_report(path: Path, report_root: Path) -> str:
    """`path`'s place in the report folder, however each was given: the variants' files come back resolved, and a
    user's `--out report` is relative."""
    return str(path.resolve().relative_to(report_root.resolve()))


def _attempt(cell, info, template, judge, folder, report_root, env, limits: guarded.Limits, name, prepared: Prepared) -> FixAttempt:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    path = folder / f"{slug}.onnx"
    onnx.save(prepared.proto, str(path))
    attempt = FixAttempt(preparation=name, steps=prepared.steps, verdict="SKIP", prepared_onnx=_in_report(path, report_root),
                         host_step=_host_step(prepared))
    try:
        prepared_info = model_loader.load(path)
        paths, errors = core_variants.produce_guarded(prepared_info, [cell.variant], folder / f"{slug}-variants", limits,
                                                      keep_fp32=prepared.keep_fp32)
    except Exception as error:  # the tool made an unusable graph: its problem, not the runtime's
        attempt.reasons = [f"the prepared graph is unusable: {error_line(error, 400)}"]
        return attempt
    if cell.variant != "fp32" and cell.variant in paths:  # what the runtime ran: that precision's file, made from the graph
        attempt.prepared_onnx = _in_report(paths[cell.variant], report_root)
    attempt.size_bytes = (report_root / attempt.prepared_onnx).stat().st_size
    batch = prepared.fixed_batch
    spec = template.for_cell(
        cell.configuration, onnx_variants={k: str(v) for k, v in paths.items()},
        variant_errors=errors, symbolic_batch=batch is None, chunk=batch or template.chunk,
        batch_sizes=[batch] if batch else template.batch_sizes,
    )
    outcome = cells.execute(folder / slug, spec, env, limits.timeout_s, lambda stage: None, memory_limit=limits.memory_limit)
    _host_argmax(outcome.arrays, prepared.host_argmax)
    judged = judge(outcome, cell, dc_replace(info, inputs=prepared_info.inputs))
    attempt.verdict, attempt.reasons, attempt.drift = judged.verdict, judged.reasons, judged.max_drift
    if judged.latency:
        timed = judged.latency[0]
        attempt.p50_us, attempt.p99_us, attempt.timed_calls, attempt.batch = timed.p50_us, timed.p99_us, timed.n, timed.batch
    attempt.emulated = bool(judged.backend and judged.backend.emulated)
    return attempt


def _host_step(prepared: Prepared) -> str:
    return "; ".join(
        f"{output} = argmax({logits}, axis={axis}{', keepdims' if keep else ''}) as {dtype}, on the host"
        for output, (logits, axis, keep, dtype) in prepared.host_argmax.items()
    )


def _host_argmax(arrays: dict[str, np.ndarray], cuts: dict[str, tuple[str, int, bool, str]]) -> None:
    """What the application does after an ArgMax head cut: argmax of the returned logits."""
    for output, (logits, axis, keepdims, dtype) in cuts.items():
        for key in [k for k in arrays if k.endswith(f"/{logits}")]:
            prefix = key[: -len(logits)]
            chosen = np.argmax(arrays.pop(key), axis=axis)
            arrays[f"{prefix}{output}"] = (np.expand_dims(chosen, axis) if keepdims else chosen).astype(dtype)


# --- helpers -------------------------------------------------------------------------------


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


def _opset(proto: onnx.ModelProto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def _graph_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {tensor.name for tensor in proto.graph.initializer}
    return [value for value in proto.graph.input if value.name not in initializers]


def constants(proto: onnx.ModelProto, kinds: str = "f") -> dict[str, np.ndarray]:
    """Initializers and Constant node values by tensor name, of the given dtype kinds."""
    found = {tensor.name: numpy_helper.to_array(tensor) for tensor in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return {name: value for name, value in found.items() if value.dtype.kind in kinds}


def _scalar(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    graph.initializer.append(numpy_helper.from_array(np.asarray(value).reshape(()), name))
    return name


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)


def _retype_outputs(proto: onnx.ModelProto) -> None:
    """Give untyped graph outputs (the exposed logits) their inferred types."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {value.name: value for value in [*inferred.graph.value_info, *inferred.graph.output]}
    for index, output in enumerate(proto.graph.output):
        if not output.type.HasField("tensor_type") and output.name in types:
            proto.graph.output[index].CopyFrom(types[output.name])

