"""First divergent node: where a drifting cell's intermediate tensors leave the float64 reference.

For a cell that FAILs or WARNs on drift, a copy of its ONNX variant gets every
node output as a graph output and runs through the same target, in a worker,
like any cell (targets whose artifact is that ONNX graph: the ORT family,
onnxruntime-node/-web, tract). The float64 reference evaluates the ORIGINAL
graph and keeps every intermediate. Tensors are matched by their original name
(the fp16 variant adds Casts under new names, int8 renames its quantized
tensors; what no longer exists is not compared), then walked in the original
topological order. A tensor the variant renamed (the fp16 converter's
`/Min_output_cast_0` for `/Min_output_0`) is followed through the node that
produces it.

Threshold (stated in the report): a float tensor diverges when
    max |y - y_ref| > level * max(1, max |y_ref|)
where level is the one the cell's verdict crossed (its tolerance for a FAIL,
half of it for a WARN): absolute for unit-scale tensors, relative to the
tensor's peak for large ones. When no node crosses it (drift that accumulates
over many nodes, e.g. int8 everywhere), the note names the node with the
largest relative drift. Integer and boolean tensors (shapes, indices)
are not compared. Bounded: only failing/warning cells, and only the first
DIAGNOSE_OBSERVATIONS observations of the run's set (the seeded set puts its
edge cases first).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ..run import cells, guarded, variants
from ..inputs import observations
from ..reference import reference
from ..inputs import model as model_loader
from ..inputs.model import ModelInfo
from ..run.protocol import CellInputs
from .preparations import constants
from ..judge.rules import WARN_FRACTION
from ..results import Cell, Diagnosis, NodeDrift

DIAGNOSE_OBSERVATIONS = 32
FP16_MAX = 65504.0
FP16_SMALLEST_NORMAL = 6.103515625e-05
FP32_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
QUANTIZERS = {"DynamicQuantizeLinear", "QuantizeLinear"}
THRESHOLD_RULE = "max|y - y_ref| > level x max(1, max|y_ref|); level = tolerance (FAIL) or half of it (WARN)"


def wants_diagnosis(cell: Cell) -> bool:
    """FAIL or WARN because of drift or flipped actions (not a crash, not a contract, not a fallback)."""
    level = (cell.tolerance or 0.0) * WARN_FRACTION
    drifting = any((p.kind == "continuous" and p.max_abs > level) or (p.flips or 0) > 0 for p in cell.parity)
    return cell.verdict in ("FAIL", "WARN") and cell.error is None and drifting


def expose_intermediates(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy whose graph outputs also hold `names` (the original graph's node outputs), typed by shape inference.

    Only tensors of rank >= 1 with a known type: an untyped output makes runtimes refuse
    the graph, and scalars cannot be concatenated across observation chunks.
    """
    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    inferred = onnx.shape_inference.infer_shapes(exposed)
    types = {value.name: value for value in inferred.graph.value_info}
    present = {value.name for value in exposed.graph.output}
    produced = set(_node_outputs(exposed.graph))  # converters leave value_info behind for tensors they renamed
    for name in names:
        value = types.get(name)
        if name not in present and name in produced and value is not None and len(value.type.tensor_type.shape.dim) >= 1:
            exposed.graph.output.append(value)
            present.add(name)
    return exposed


def reference_intermediates(proto: onnx.ModelProto, feeds: observations.Feeds) -> dict[str, np.ndarray]:
    """Every node output of the original graph, evaluated in float64."""
    wide = reference.to_float64(proto)
    names = _node_outputs(wide.graph)
    values = reference.evaluator_for(wide).run(names, {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()})
    return dict(zip(names, values))


def _guarded_intermediates(model: ModelInfo, subset_path: Path, folder: Path, limits: guarded.Limits) -> dict[str, np.ndarray]:
    """reference_intermediates in a guarded process (matrix.run.guarded); arrays come back by index, names in JSON."""
    answer = guarded.run("intermediates", {"model": str(model.path.resolve()), "observations": str(subset_path)}, folder, limits)
    by_index = observations.read(folder / "intermediates.npz")
    return {name: by_index[str(i)] for i, name in enumerate(answer["names"])}


def guarded_step(spec: dict, folder: Path) -> dict:
    values = reference_intermediates(model_loader.load(Path(spec["model"])).proto, observations.read(Path(spec["observations"])))
    observations.save({str(i): value for i, value in enumerate(values.values())}, folder / "intermediates.npz")
    return {"names": list(values)}


def compare(
    original: onnx.ModelProto, variant: onnx.ModelProto, expected: dict[str, np.ndarray], actual: dict[str, np.ndarray],
    level: float, variant_name: str,
) -> tuple[list[NodeDrift], NodeDrift | None]:
    """Per node (original topological order) the drift of its first comparable output; the first above threshold."""
    drifts, first = [], None
    for node in original.graph.node:
        row = _node_drift(node, expected, actual, level)
        if row is None:
            continue
        drifts.append(row)
        if first is None and row.drift > row.threshold:
            first = row
    if first is not None:
        first.input_drifts = _input_drifts(first, original, variant, {d.output: d.drift for d in drifts})
        first.cause = explain(first, original, variant, expected, actual, variant_name)
    return drifts, first


def _node_drift(node, expected, actual, level) -> NodeDrift | None:
    for output in node.output:
        ref, got = expected.get(output), actual.get(output)
        if ref is None or got is None or ref.dtype.kind != "f" or np.shape(ref) != np.shape(got):
            continue
        ref = np.asarray(ref, dtype=np.float64)
        peak = float(np.max(np.abs(ref))) if ref.size else 0.0
        return NodeDrift(
            node=node.name or output, op_type=node.op_type, output=output, drift=_max_abs(got, ref),
            threshold=level * max(1.0, peak), reference_peak=peak,
        )
    return None


def _max_abs(actual: np.ndarray, expected: np.ndarray) -> float:
    diff = np.abs(np.asarray(actual, dtype=np.float64) - expected)
    if not diff.size:
        return 0.0
    return float("inf") if np.isnan(diff).any() else float(diff.max())


def _input_drifts(first: NodeDrift, original, variant, by_output: dict[str, float]) -> dict[str, float | None]:
    node = next(n for n in original.graph.node if first.output in n.output)
    graph_inputs = {value.name for value in original.graph.input}
    known = constants(original)
    variant_constants = constants(variant)
    drifts: dict[str, float | None] = {}
    for name in filter(None, node.input):
        if name in by_output:
            drifts[name] = by_output[name]
        elif name in known and name in variant_constants and known[name].shape == variant_constants[name].shape:
            drifts[name] = _max_abs(variant_constants[name], known[name].astype(np.float64))
        elif name in graph_inputs:
            drifts[name] = 0.0  # every cell is fed the same observations
        else:
            drifts[name] = None  # not comparable (renamed or integer)
    return drifts


def explain(first: NodeDrift, original, variant, expected, actual, variant_name: str) -> str:
    """A plain explanation when the numbers match a known cause, else an empty string."""
    node = next(n for n in original.graph.node if first.output in n.output)
    got = np.asarray(actual[first.output], dtype=np.float64)
    ref = np.asarray(expected[first.output], dtype=np.float64)
    causes = []
    if variant_name == "fp16":
        causes += _fp16_constants(node, original, variant)
        if first.reference_peak > FP16_MAX or np.isinf(got).any():
            causes.append(
                f"float16 overflow: the float64 reference reaches |x| = {first.reference_peak:.3g} at {first.output}, "
                f"above float16's largest finite value {FP16_MAX:g}; the fp16 variant gives {_extreme(got)} there"
            )
        tiny = _smallest_nonzero(ref)
        if not causes and tiny is not None and tiny < FP16_SMALLEST_NORMAL:
            causes.append(
                f"float16 subnormals: reference values as small as {tiny:.3g} at {first.output}, below float16's "
                f"smallest normal {FP16_SMALLEST_NORMAL:.3g}, lose precision or flush to zero"
            )
    if variant_name == "int8":
        causes += _int8_quantization(node, variant, expected)
    tiny = _smallest_nonzero(ref)
    if variant_name == "fp32" and tiny is not None and tiny < FP32_SMALLEST_NORMAL:
        causes.append(f"float32 denormals: reference values as small as {tiny:.3g}; runtimes that flush denormals give 0")
    return "; ".join(causes)


def _fp16_constants(node, original, variant) -> list[str]:
    """Constants the fp16 converter changed beyond rounding (it clamps to float16's range: variants.FLOAT16_RANGE)."""
    known, changed = constants(original), constants(variant)
    found = []
    for name in node.input:
        if name not in known or name not in changed or known[name].shape != changed[name].shape:
            continue
        before, after = known[name].astype(np.float64), changed[name].astype(np.float64)
        worst = np.abs(after - before) / np.maximum(np.abs(before), 1e-30)
        if worst.size and float(worst.max()) > 1e-2:
            index = int(np.argmax(worst))
            found.append(
                f"constant {name} truncated by the fp16 converter: {before.ravel()[index]:.6g} became {after.ravel()[index]:.6g}"
            )
    return found


def _int8_quantization(node, variant, expected) -> list[str]:
    quantized = {n.input[0] for n in variant.graph.node if n.op_type in QUANTIZERS}
    found = []
    for name in node.input:
        if name in quantized and name in expected:
            values = np.asarray(expected[name], dtype=np.float64)
            low, high = float(values.min()), float(values.max())
            step = (max(high, 0.0) - min(low, 0.0)) / 255
            found.append(
                f"int8 quantization of {name}: 256 levels over [{low:.3g}, {high:.3g}], a step of {step:.3g}; "
                "values beyond a calibrated range saturate"
            )
    return found


def _extreme(values: np.ndarray) -> str:
    if np.isnan(values).any():
        return "NaN"
    if np.isinf(values).any():
        return "inf"
    return f"|x| up to {float(np.max(np.abs(values))):.3g}"


def _smallest_nonzero(values: np.ndarray) -> float | None:
    nonzero = np.abs(values[values != 0])
    return float(nonzero.min()) if nonzero.size else None


def _node_outputs(graph: onnx.GraphProto) -> list[str]:
    return list(dict.fromkeys(name for node in graph.node for name in node.output if name))


def renamed_outputs(original: onnx.ModelProto, variant: onnx.ModelProto) -> dict[str, str]:
    """Each original node output -> the same node's output in the variant.

    Converters rename tensors (fp16: `/Min_output_0` -> `/Min_output_cast_0` when they wrap a node
    in Casts) but keep node names, so a node is matched by name (unnamed ones by the name the
    variant maker gave them) and an output by its position.
    """
    produced = {node.name: list(node.output) for node in variant.graph.node}
    mapping = {}
    for node in variants.named_nodes(original).graph.node:
        for position, name in enumerate(node.output):
            renamed = produced.get(node.name, [])[position:position + 1]
            if name and renamed and renamed[0]:
                mapping[name] = renamed[0]
    return mapping


# --- running it through the cell's own target ------------------------------------------


def diagnose_cell(cell: Cell, template: CellInputs, model: ModelInfo, folder: Path, env: dict, limits: guarded.Limits,
                  cell_outputs: Path | None = None) -> Diagnosis:
    """Expose the cell variant's intermediates, run them on the cell's target, compare with float64.
    `cell_outputs`: the cell's own outputs.npz, to tell a drift the exposed graph no longer has."""
    folder.mkdir(parents=True, exist_ok=True)
    original = model.proto
    variant = onnx.load(template.onnx_variants[cell.variant])
    feeds = _subset(template)
    subset_path = folder / "observations.npz"
    observations.save(feeds, subset_path)
    level = (cell.tolerance or 0.0) * (1.0 if cell.verdict == "FAIL" else WARN_FRACTION)
    diagnosis = Diagnosis(runtime=cell.target, observations=observations.count(feeds, template.batch_axes),
                          threshold_rule=THRESHOLD_RULE, level=level)
    renamed = renamed_outputs(original, variant)
    names = [renamed.get(name, name) for name in _node_outputs(original.graph)]
    outcome = _run_exposed(cell, template, variant, names, subset_path, folder, env, limits)
    error = outcome.measurement.error
    if error:
        diagnosis.note = f"the {cell.target} runtime could not run the graph with exposed intermediates: {error.message}"
        return diagnosis
    actual = {name: outcome.arrays[f"outputs/{renamed.get(name, name)}"] for name in _node_outputs(original.graph)
              if f"outputs/{renamed.get(name, name)}" in outcome.arrays}
    expected = _guarded_intermediates(model, subset_path, folder / "float64", limits)
    diagnosis.nodes, diagnosis.first = compare(original, variant, expected, actual, level, cell.variant)
    if diagnosis.first is not None and not diagnosis.first.cause and cell.backend and "no shader-f16" in cell.backend.detail:
        diagnosis.first.cause = ("the WebGPU adapter has no shader-f16 feature, yet onnxruntime-web runs the fp16 kernels "
                                 "on it: the first fp16 op computes wrong values while its inputs are still right")
    if diagnosis.first is None:
        diagnosis.note = (_lost_by_exposing(original, expected, actual, cell_outputs, feeds, template, level)
                          or f"no single node exceeds the threshold on these {diagnosis.observations} observations" + _largest(diagnosis.nodes))
    return diagnosis


def _lost_by_exposing(original, expected, actual, cell_outputs: Path | None, feeds, template: CellInputs, level: float) -> str:
    """When the cell's own outputs drift on these observations and the exposed graph's do not, exposing every tensor
    changed what the runtime ran: it fuses nodes only where their tensors are not outputs (onnxruntime's QDQ fusion
    of a user's int8 model: 0.299 fused, 1.2e-7 unfused). '' when that is not what the numbers say."""
    if cell_outputs is None or not cell_outputs.exists():
        return ""
    own = observations.head(_prefixed(observations.read(cell_outputs), "outputs/"), observations.count(feeds, template.batch_axes),
                            template.batch_axes)
    names = [o.name for o in original.graph.output if o.name in own and o.name in actual and o.name in expected
             and np.shape(own[o.name]) == np.shape(expected[o.name])]
    if not names:
        return ""
    drifted = max(_max_abs(own[name], np.asarray(expected[name], np.float64)) for name in names)
    exposed = max(_max_abs(actual[name], np.asarray(expected[name], np.float64)) for name in names)
    if drifted <= level or exposed > level:
        return ""
    return (f"the cell's outputs drift {drifted:.3g} on these observations, but with every intermediate exposed they drift "
            f"{exposed:.3g}: exposing a tensor stops the runtime fusing the nodes around it, so the drift is in a fused "
            "kernel (for onnxruntime, --settings ort-cpu:opt=disable,all compares its graph optimizations)")


def _prefixed(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {name.removeprefix(prefix): value for name, value in arrays.items() if name.startswith(prefix)}


def _run_exposed(cell, template, variant, names, subset_path: Path, folder: Path, env, limits: guarded.Limits) -> cells.CellOutcome:
    """The exposed graph through the cell's own target, in a worker like any cell (one timed call, no contract runs)."""
    exposed_path = folder / "exposed.onnx"
    onnx.save(expose_intermediates(variant, names), str(exposed_path))
    spec = template.for_cell(
        cell.configuration, observations=str(subset_path),
        onnx_variants={**template.onnx_variants, cell.variant: str(exposed_path)},
        batch_sizes=[template.chunk or 1], symbolic_batch=False, warmup=0, iters=1,
    )
    return cells.execute(folder / "cell", spec, env, limits.timeout_s, lambda stage: None, memory_limit=limits.memory_limit)


def _largest(nodes: list[NodeDrift]) -> str:
    if not nodes:
        return ""
    worst = max(nodes, key=lambda n: n.drift / max(1.0, n.reference_peak))
    relative = worst.drift / max(1.0, worst.reference_peak)
    return f"; the drift accumulates, largest relative drift {relative:.3g} at {worst.node} ({worst.op_type})"


def _subset(template: CellInputs) -> observations.Feeds:
    """The first DIAGNOSE_OBSERVATIONS observations, a whole number of the model's fixed batch."""
    feeds = observations.read(Path(template.observations))
    step = template.chunk or 1
    size = max(DIAGNOSE_OBSERVATIONS - DIAGNOSE_OBSERVATIONS % step, step)
    return observations.head(feeds, size, template.batch_axes)


def reason(diagnosis: Diagnosis) -> str | None:
    """The one line a cell's reasons get."""
    first = diagnosis.first
    if first is None:
        return f"diagnosis: {diagnosis.note}" if diagnosis.note else None
    inputs = ", ".join(f"{name} {_fmt(value)}" for name, value in first.input_drifts.items())
    line = (f"first divergent node: {first.node} ({first.op_type}), output {first.output} drifts {_fmt(first.drift)} "
            f"(threshold {first.threshold:.3g}); its inputs drift {inputs or 'nothing'}")
    return f"{line}. {first.cause}" if first.cause else line


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
