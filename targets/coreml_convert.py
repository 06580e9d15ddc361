"""ONNX -> CoreML ML Program, run inside the CoreML environment (files in, JSON out).

`python coreml_convert.py request.json` with request keys: onnx, example (an .npz
of a few observations, used to trace), variant (fp32 | fp16 | int8), out (the
.mlpackage to write), max_batch. Prints one JSON line: the program's op
inventory with the ONNX node each MIL op came from, or {"error": ...} with the
converter's own words.

Route: onnx2torch -> torch.jit.trace -> coremltools.convert, because coremltools
9 has no ONNX frontend. This file imports nothing from policy-matrix: it runs
in another interpreter.
"""

from __future__ import annotations

import json
import re
import sys
import time
import types

import numpy as np

# ML Program features used here (per-channel int8 weights) need macOS 13 / iOS 16.
DEPLOYMENT_TARGET = "macOS13"


def _import_onnx2torch():
    """onnx2torch imports torchvision for NMS/RoiAlign only; stub it when it cannot load.

    PyPI's Linux torchvision is linked against CUDA torch and fails beside the CPU
    wheel. The stub makes exactly those two ops fail, with a message that says why.
    """
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # RuntimeError / OSError from its C extension
        for name in [name for name in sys.modules if name.startswith("torchvision")]:
            del sys.modules[name]
        reason = f"torchvision cannot load here ({type(error).__name__}), so NMS/RoiAlign cannot convert"

        def unavailable(*_args, **_kwargs):
            raise NotImplementedError(reason)

        ops = types.ModuleType("torchvision.ops")
        ops.roi_align = ops.nms = ops.box_convert = unavailable
        stub = types.ModuleType("torchvision")
        stub.ops = ops
        sys.modules.update({"torchvision": stub, "torchvision.ops": ops})
    import onnx2torch

    return onnx2torch


def _coreml_dtype(onnx_elem_type: int):
    """CoreML tensors are fp32/fp16/int32/bool: ints come back as int32 (recast later)."""
    import onnx

    np_type = onnx.helper.tensor_dtype_to_np_dtype(onnx_elem_type)
    if np.issubdtype(np_type, np.floating):
        return np.float32
    if np.issubdtype(np_type, np.integer):
        return np.int32
    return None  # let coremltools infer (e.g. bool)


def _input_types(ct, graph_inputs, example: dict, batch_axes: dict, max_batch: int) -> list:
    """Each input as traced, its batch axis (any axis; none for a side input) flexible unless fixed."""
    types_ = []
    for value in graph_inputs:
        dims = value.type.tensor_type.shape.dim
        shape = list(example[value.name].shape)
        axis = batch_axes.get(value.name)
        if axis is not None and not dims[axis].dim_value > 0:
            shape[axis] = ct.RangeDim(1, max_batch, default=1)
        types_.append(ct.TensorType(name=value.name, shape=tuple(shape), dtype=_coreml_dtype(value.type.tensor_type.elem_type)))
    return types_


def _trace_example(graph_inputs, arrays: dict, batch_axes: dict) -> dict:
    """A fixed batch as declared, else 2 rows along each input's batch axis: batch 1 could let the trace
    specialize on size 1. Inputs without a batch axis as they are fed."""
    example = {}
    for value in graph_inputs:
        dims = value.type.tensor_type.shape.dim
        axis = batch_axes.get(value.name)
        if axis is None:
            example[value.name] = arrays[value.name]
            continue
        rows = dims[axis].dim_value if dims[axis].dim_value > 0 else 2
        example[value.name] = np.ascontiguousarray(np.take(arrays[value.name], range(rows), axis=axis))
    return example


MISSING = re.compile(r"domain='(?P<domain>[^']*)', operation_type='(?P<op>\w+)', version=(?P<version>\d+)")


def _missing_converter(message: str) -> str:
    """onnx2torch's 'Converter is not implemented (...)' with what its registry does have for that op:
    its `version` is the op's schema version (LSTM at opset 17 says 14), and often there is none at all."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY

    match = MISSING.search(message)
    if match is None:
        return message
    op, version = match["op"], match["version"]
    versions = sorted(d.version for d in _CONVERTER_REGISTRY if d.operation_type == op and d.domain == match["domain"])
    if not versions:
        return f"onnx2torch has no {op} converter at any opset ({message})"
    return f"onnx2torch has no {op} converter for schema version {version}, only for {', '.join(map(str, versions))} ({message})"


def mil_operations(block):
    """Every operation of a MIL block, nested blocks included (coreml_predict.py walks plans with it too)."""
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from mil_operations(inner)


def _op_records(program, onnx_nodes: dict) -> list[dict]:
    """Every non-const MIL op, with the ONNX node whose torch module it was traced from."""
    from coremltools.converters.mil.mil.scope import ScopeSource

    records = []
    for op in mil_operations(program.functions["main"]):
        if op.op_type == "const":
            continue
        scopes = op.scopes or {}
        modules = scopes.get(ScopeSource.TORCHSCRIPT_MODULE_NAME, [])
        node = onnx_nodes.get(modules[0]) if modules else None
        passes = scopes.get(ScopeSource.COREMLTOOLS_GRAPH_PASS, [])
        # The fp16 pass tags every op it touches, but only its casts are its own (unless
        # the ONNX node itself is a Cast): those belong to no ONNX node.
        inserted_by = "add_fp16_cast" if op.op_type == "cast" and "add_fp16_cast" in passes else None
        if inserted_by and node is not None and node.operation_type == "Cast":
            inserted_by = None
        records.append(_record(op, None if inserted_by else node, inserted_by))
    return records


def _record(op, node, inserted_by: str | None) -> dict:
    return {
        "mil_op": op.op_type,
        "outputs": [var.name for var in op.outputs],
        "onnx_node": node.name if node is not None else None,
        "onnx_op": node.operation_type if node is not None else None,
        "inserted_by": inserted_by,
    }


def _dequantize_records(program, records: list[dict]) -> list[dict]:
    """The constexpr ops that weight quantization adds, attributed to the node using the weight."""
    by_output = {name: record for record in records for name in record["outputs"]}
    added = []
    for op in mil_operations(program.functions["main"]):
        if not op.op_type.startswith("constexpr_"):
            continue
        users = [by_output.get(child.outputs[0].name) for child in op.outputs[0].child_ops if child.outputs]
        user = next((u for u in users if u and u["onnx_node"]), None)
        record = _record(op, None, "linear_quantize_weights")
        record.update(onnx_node=user and user["onnx_node"], onnx_op=user and user["onnx_op"])
        added.append(record)
    return added


def _register_broadcast_to() -> None:
    """torch.broadcast_to(x, shape) is x.expand(shape); coremltools 9 converts only the latter.

    onnx2torch lowers ONNX Min/Max with a broadcast operand to broadcast_to, so without
    this alias a clipped policy cannot convert. Registered only where coremltools lacks it.
    """
    from coremltools.converters.mil.frontend.torch import ops, register_torch_op
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    if _TORCH_OPS_REGISTRY.get_func("broadcast_to") is not None:
        return

    def broadcast_to(context, node):
        ops.expand(context, node)

    register_torch_op(broadcast_to)


def _quantize_weights(ct, mlmodel):
    """int8 = weights linear-quantized per output channel (symmetric); compute stays fp16."""
    import coremltools.optimize.coreml as cto

    op_config = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel", weight_threshold=0)
    config = cto.OptimizationConfig(global_config=op_config)
    return cto.linear_quantize_weights(mlmodel, config=config)


def convert(request: dict) -> dict:
    import coremltools as ct
    import onnx
    import torch

    onnx2torch = _import_onnx2torch()
    _register_broadcast_to()
    model = onnx.load(request["onnx"])
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [value for value in model.graph.input if value.name not in initializers]
    example = _trace_example(graph_inputs, dict(np.load(request["example"])), request["batch_axes"])
    started = time.perf_counter()
    try:
        module = onnx2torch.convert(model).eval()
    except NotImplementedError as error:
        raise NotImplementedError(_missing_converter(str(error))) from None
    traced = torch.jit.trace(module, tuple(torch.from_numpy(example[v.name]) for v in graph_inputs))
    workarounds = _workarounds_used(traced)
    precision = ct.precision.FLOAT32 if request["variant"] == "fp32" else ct.precision.FLOAT16
    outputs = [ct.TensorType(name=out.name, dtype=_coreml_dtype(out.type.tensor_type.elem_type)) for out in model.graph.output]
    mlmodel = ct.convert(
        traced,
        convert_to="mlprogram",
        inputs=_input_types(ct, graph_inputs, example, request["batch_axes"], request["max_batch"]),
        outputs=outputs,
        compute_precision=precision,
        minimum_deployment_target=getattr(ct.target, DEPLOYMENT_TARGET),
    )
    # Read right after conversion: scopes (the ONNX provenance) do not survive save/optimize.
    ops = _op_records(mlmodel._mil_program, dict(onnx2torch.onnx_graph.OnnxGraph(model.graph).nodes))
    if request["variant"] == "int8":
        mlmodel = _quantize_weights(ct, mlmodel)
        ops = _dequantize_records(mlmodel._mil_program, ops) + ops
    mlmodel.save(request["out"])
    conversion_s = time.perf_counter() - started
    spec = mlmodel.get_spec().description
    return {
        "conversion_s": conversion_s,
        "ops": ops,
        # Names as CoreML spells them, in ONNX order (coremltools may sanitize names).
        "inputs": {v.name: f.name for v, f in zip(graph_inputs, spec.input)},
        "outputs": {
            out.name: {"coreml": f.name, "dtype": str(onnx.helper.tensor_dtype_to_np_dtype(out.type.tensor_type.elem_type))}
            for out, f in zip(model.graph.output, spec.output)
        },
        "versions": {"coremltools": ct.__version__, "torch": torch.__version__, "onnx2torch": _version("onnx2torch")},
        "deployment_target": DEPLOYMENT_TARGET,
        "workarounds": workarounds,
    }


def _workarounds_used(traced) -> list[str]:
    """The tool's own fixes this model needed: a user converting with stock coremltools would fail here."""
    kinds = {node.kind() for node in traced.inlined_graph.nodes()}
    if "aten::broadcast_to" in kinds:
        return ["torch broadcast_to converted as expand (stock coremltools 9 has no broadcast_to and fails on this model)"]
    return []


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main(request_file: str) -> None:
    request = json.loads(open(request_file).read())
    try:
        result = convert(request)
    except Exception as error:  # the converter's own words become the cell's FAIL reason
        text = " ".join(str(error).split())
        result = {"error": f"{type(error).__name__}: {text}" if text else type(error).__name__}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
