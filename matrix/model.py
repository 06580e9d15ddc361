"""Load and validate a policy; everything later reads the ModelInfo made here.

Every way a file can be unusable ends in `InputError` with one sentence; the
CLI turns that into exit code 2.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper
from onnx.external_data_helper import uses_external_data

from .errors import InputError

# Operator domains some target implements; anything else is a custom op no runtime here has.
KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}


@dataclass
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list  # ints for fixed dims, strings for symbolic ones, None for unknown

    @property
    def batch_is_symbolic(self) -> bool:
        return bool(self.shape) and not isinstance(self.shape[0], int)


@dataclass
class ModelInfo:
    path: Path
    sha256: str
    proto: onnx.ModelProto = field(repr=False)
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: int
    ir_version: int
    producer: str
    metadata: dict[str, str]

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.proto.graph.node)

    def summary(self) -> dict:
        return {
            "name": self.path.name,
            "sha256": self.sha256,
            "opset": self.opset,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "inputs": [vars(spec) for spec in self.inputs],
            "outputs": [vars(spec) for spec in self.outputs],
            "n_nodes": len(self.proto.graph.node),
            "op_types": sorted({node.op_type for node in self.proto.graph.node}),
            "node_names": [node.name for node in self.proto.graph.node],
            "metadata": self.metadata,
        }


def load(path: Path) -> ModelInfo:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    proto = _parse(path)
    _check_external_data(proto, path.parent)
    onnx.load_external_data_for_model(proto, str(path.parent))
    _check_domains(proto)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise InputError(f"{path}: not a valid ONNX model: {_first_line(error)}") from None
    proto = onnx.shape_inference.infer_shapes(proto)
    return ModelInfo(
        path=path,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        proto=proto,
        inputs=[_spec(v) for v in _graph_inputs(proto)],
        outputs=[_spec(v) for v in proto.graph.output],
        opset=next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0),
        ir_version=proto.ir_version,
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
        metadata={prop.key: prop.value for prop in proto.metadata_props},
    )


def _parse(path: Path) -> onnx.ModelProto:
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as error:
        raise InputError(f"{path}: not an ONNX model (the file does not parse: {_first_line(error)})") from None
    if not proto.graph.node and not proto.graph.output:
        raise InputError(f"{path}: not an ONNX model (no graph in it)")
    return proto


def _check_external_data(proto: onnx.ModelProto, folder: Path) -> None:
    root = folder.resolve()
    for tensor in _all_initializers(proto):
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        resolved = (root / location).resolve()
        if Path(location).is_absolute() or not resolved.is_relative_to(root):
            raise InputError(f"tensor {tensor.name!r} points to external data outside the model's folder: refused")
        if not resolved.is_file():
            raise InputError(f"tensor {tensor.name!r} needs external data file {location!r}, which is missing")


def _all_initializers(proto: onnx.ModelProto):
    yield from proto.graph.initializer
    for node in proto.graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t


def _check_domains(proto: onnx.ModelProto) -> None:
    local = {f.domain for f in proto.functions}
    for node in proto.graph.node:
        if node.domain not in KNOWN_DOMAINS and node.domain not in local:
            raise InputError(
                f"node {node.name or node.op_type!r} uses operator {node.op_type!r} from domain {node.domain!r}, "
                "which no target implements"
            )


def _graph_inputs(proto: onnx.ModelProto):
    initializers = {t.name for t in proto.graph.initializer}
    return [v for v in proto.graph.input if v.name not in initializers]


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
    return TensorSpec(value.name, dtype, dims)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
