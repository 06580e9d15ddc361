"""Load and validate a policy; everything later reads the ModelInfo made here.

Every way a file can be unusable ends in `InputError` with one sentence; the
CLI turns that into exit code 2.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from . import batch_axes, external_data, graph_facts
from .. import options, userfiles
from ..errors import InputError

# Operator domains some target implements; anything else is a custom op no runtime here has.
KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}
# Names are shown in every table of the report; past this they are an attack on it, not a name.
MAX_NAME_CHARS = 1024
# Largest tensor a model may declare (per sample for batched inputs) unless the caller says otherwise.
DEFAULT_SIZE_LIMIT_BYTES = 4 << 30


@dataclass
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list  # ints for fixed dims, strings for symbolic ones, None for unknown


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
    # Outputs that are not tensors (skl2onnx's ZipMap: a sequence of maps), left out of the matrix: name -> what it is.
    excluded_outputs: dict[str, str] = field(default_factory=dict)
    state_pairs: list[graph_facts.StatePair] = field(default_factory=list)  # found once, at load
    batch_axes: dict[str, int] = field(default_factory=dict)  # batch_axes.infer: inputs absent are fed whole
    # What a user ships: the model file and its external data files as they lie on disk (the tool's copies
    # are re-serialized, data inlined, shapes inferred: another size).
    shipped_bytes: int = 0

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.proto.graph.node)

    @property
    def is_policy(self) -> bool:
        """Whether the model declares an action (its metadata's action_space, or an output named action): the
        action contract applies, and only finite observations are states."""
        return "action_space" in self.metadata or any(spec.name == "action" for spec in self.outputs)

    def summary(self) -> dict:
        return {
            "name": self.path.name,
            "sha256": self.sha256,
            "opset": self.opset,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "inputs": [vars(spec) for spec in self.inputs],
            "outputs": [vars(spec) for spec in self.outputs],
            "excluded_outputs": self.excluded_outputs,
            "n_nodes": len(self.proto.graph.node),
            "op_types": sorted({node.op_type for node in self.proto.graph.node}),
            "node_names": [node.name for node in self.proto.graph.node],
            "metadata": self.metadata,
            "batch_axes": self.batch_axes,
        }


def load(path: Path, given_batch_axes: dict[str, int] | None = None, limit_bytes: int = DEFAULT_SIZE_LIMIT_BYTES) -> ModelInfo:
    """The checked model at `path`, read once (a regular file within `limit_bytes`, with its external data);
    `given_batch_axes` is the user's --batch-axis (the rest is inferred)."""
    path = Path(path)
    with userfiles.open_regular(path, "model", min(limit_bytes, external_data.PROTOBUF_LIMIT_BYTES)) as stream:
        serialized = stream.read()
    proto = _parse(path, serialized)
    _check_names(proto)
    data_bytes = external_data.load_all(all_tensors(proto), path.parent, limit_bytes, model_bytes=len(serialized))
    _check_domains(proto)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise InputError(f"{path}: not a valid ONNX model: {_first_line(error)}") from None
    proto = onnx.shape_inference.infer_shapes(proto)
    excluded = _check_interface(proto)
    info = ModelInfo(
        path=path,
        sha256=hashlib.sha256(serialized).hexdigest(),
        proto=proto,
        inputs=[_spec(v) for v in _graph_inputs(proto)],
        outputs=[_spec(v) for v in proto.graph.output if v.name not in excluded],
        excluded_outputs=excluded,
        opset=next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0),
        ir_version=proto.ir_version,
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
        metadata={prop.key: prop.value for prop in proto.metadata_props},
        shipped_bytes=len(serialized) + data_bytes,
    )
    _check_action_metadata(path, info.metadata)
    batch_axes.check_given(info, given_batch_axes or {})
    info.state_pairs = graph_facts.state_pairs(info, given_batch_axes)
    info.batch_axes = batch_axes.infer(info, given_batch_axes)
    return info


def _check_action_metadata(path: Path, metadata: dict[str, str]) -> None:
    """The action metadata the contract check reads (action_n; action_low/action_high, infinite for an unbounded
    Box) are the model's words, not the runtime's: a value that is no count or bound is refused here."""
    def shown(key: str) -> str:
        return f"{path}: metadata {key} = {metadata[key][:40]!r}"

    count = metadata.get("action_n")
    if count is not None and not (re.fullmatch(r"[0-9]{1,9}", count.strip()) and int(count) >= 1):
        raise InputError(f"{shown('action_n')}: expected a whole number of actions >= 1")
    bounds = {}
    for key in ("action_low", "action_high"):
        if key in metadata:
            try:  # Python's float() also reads digit groups ('-1_0' is -10): no exporter writes a number so
                bounds[key] = float(metadata[key]) if "_" not in metadata[key] else math.nan
            except ValueError:
                bounds[key] = math.nan
            if math.isnan(bounds[key]):
                raise InputError(f"{shown(key)}: expected a number (-inf and inf for an unbounded side)")
    # an action_low of inf (or an action_high of -inf) leaves no value inside: every cell's contract would FAIL
    # on the model's own words, whatever the runtime returned
    for key, closed in (("action_low", math.inf), ("action_high", -math.inf)):
        if bounds.get(key) == closed:
            raise InputError(f"{shown(key)}: no action is inside it ({'-inf' if closed > 0 else 'inf'} for an unbounded side)")
    if bounds.get("action_low", -math.inf) > bounds.get("action_high", math.inf):
        raise InputError(f"{shown('action_low')} is above action_high = {metadata['action_high'][:40]!r}")


PARSER_OUT_OF_MEMORY = "Arena alloc failed"  # protobuf's parser when its arena cannot grow


def _parse(path: Path, serialized: bytes) -> onnx.ModelProto:
    try:
        proto = onnx.load_model_from_string(serialized)
    except (DecodeError, ValueError, RuntimeError) as error:
        if PARSER_OUT_OF_MEMORY in str(error):  # not the file's fault: the process could not allocate (its memory cap)
            raise InputError(f"{path}: out of memory while parsing the model ({_first_line(error)})") from None
        raise InputError(f"{path}: not an ONNX model (the file does not parse: {_first_line(error)})") from None
    if not proto.graph.node and not proto.graph.output:
        raise InputError(f"{path}: not an ONNX model (no graph in it)")
    return proto


def all_tensors(proto: onnx.ModelProto):
    """Every stored tensor, including those inside If/Loop/Scan bodies and local functions, at any depth."""
    for graph in _all_graphs(proto):
        yield from graph.initializer
        yield from (sparse.values for sparse in graph.sparse_initializer)
        for node in graph.node:
            yield from _node_tensors(node)
    for node in _function_nodes(proto):
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto):
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors


def _all_graphs(proto: onnx.ModelProto):
    """The main graph and every subgraph nested in it or in a local function, at any depth."""
    pending = [proto.graph, *_subgraphs(_function_nodes(proto))]
    while pending:
        graph = pending.pop()
        yield graph
        pending.extend(_subgraphs(graph.node))


def _subgraphs(nodes):
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield attribute.g
            yield from attribute.graphs


def _function_nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for function in proto.functions for node in function.node]


def _check_names(proto: onnx.ModelProto) -> None:
    for kind, name in _all_names(proto):
        if len(name) > MAX_NAME_CHARS:
            raise InputError(
                f"a {kind} name is {len(name)} characters long (limit {MAX_NAME_CHARS}): refused, it starts {name[:40]!r}"
            )
        if "\0" in name:  # onnx.reference and a zip member name (the .npz files keyed by names) end at a NUL
            raise InputError(f"a {kind} name holds a NUL character: refused ({userfiles.one_line(repr(name), 100)})")


def _all_names(proto: onnx.ModelProto):
    """(kind, name) of everything a message or the report may show: graphs' and local functions' alike."""
    for graph in _all_graphs(proto):
        for item in [*graph.node, *graph.input, *graph.output, *graph.initializer, *graph.value_info]:
            yield type(item).__name__.removesuffix("Proto").lower(), item.name
    for function in proto.functions:
        yield "function", function.name
        yield "domain", function.domain
        yield from (("function input", name) for name in [*function.input, *function.output])
    for graph_nodes in [*(graph.node for graph in _all_graphs(proto)), _function_nodes(proto)]:
        for node in graph_nodes:
            yield "node", node.name
            yield "operator", node.op_type
            yield "domain", node.domain
            yield from (("tensor", name) for name in [*node.input, *node.output])


def _check_interface(proto: onnx.ModelProto) -> dict[str, str]:
    """Only batched numeric tensors can be fed observations and compared; say which one is not.
    Returns the outputs left out of the matrix (not tensors) with what they are; the tensor outputs run."""
    inputs = _graph_inputs(proto)
    if not inputs:
        raise InputError("the model has no inputs: a policy needs an observation input")
    if not proto.graph.output:
        raise InputError("the model has no outputs: a policy needs an action output")
    for position, value in enumerate(inputs):
        _check_numeric_tensor(value, "input")
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            raise InputError(f"input {value.name!r} has no declared shape: observations cannot be made for it")
        if not tensor.shape.dim and position == 0:  # the first input defines the batch; a rank-0 side input is fed whole
            raise InputError(f"input {value.name!r} has rank 0: a policy's observation input needs a batch dimension")
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in tensor.shape.dim):
            raise InputError(f"input {value.name!r} declares a negative dimension {_dims(tensor)}: not a shape")
        # An empty side input is legitimate (ReduceMean's axes=[]); an empty observation is not.
        if position == 0 and any(d.HasField("dim_value") and d.dim_value <= 0 for d in tensor.shape.dim):
            raise InputError(f"input {value.name!r} declares a zero-sized dimension {_dims(tensor)}: nothing can be fed")
    excluded = {value.name: _non_tensor(value) for value in proto.graph.output if _non_tensor(value)}
    if len(excluded) == len(proto.graph.output):
        raise InputError(f"no output of the model is a tensor ({', '.join(f'{n!r} is {k}' for n, k in excluded.items())}): "
                         "policy-matrix compares dense tensors only")
    for value in proto.graph.output:
        if value.name not in excluded:
            _check_numeric_tensor(value, "output")
    return excluded


NON_TENSOR_KINDS = {"sequence_type": "a sequence", "map_type": "a map", "optional_type": "an optional",
                    "sparse_tensor_type": "a sparse tensor"}


def _non_tensor(value: onnx.ValueInfoProto) -> str:
    """What an output is when it is not a dense tensor ('a sequence of maps'), else ''."""
    kind = value.type.WhichOneof("value")
    if kind == "tensor_type":
        return ""
    if kind == "sequence_type" and value.type.sequence_type.elem_type.WhichOneof("value") == "map_type":
        return "a sequence of maps"
    return NON_TENSOR_KINDS.get(kind, "not a tensor")


def _check_numeric_tensor(value: onnx.ValueInfoProto, role: str) -> None:
    if _non_tensor(value):
        raise InputError(f"{role} {value.name!r} is {_non_tensor(value)}: policy-matrix handles dense tensors only")
    elem_type = value.type.tensor_type.elem_type
    if _numpy_dtype(elem_type) is None:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undeclared"
        raise InputError(f"{role} {value.name!r} has element type {name}: policy-matrix handles bool, integer and "
                         "float16/32/64 tensors only")


def _numpy_dtype(elem_type: int):
    """numpy's own dtype for the element type, or None. bfloat16, float8 and int4 are ml_dtypes' (isbuiltin 2): an
    .npz cannot hold them (float8_e5m2 even says kind 'f', and came back from the reference job unreadable: '<f1')."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None
    return dtype if dtype.kind in "biuf" and dtype.isbuiltin == 1 else None


def _dims(tensor) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]


def check_declared_sizes(info: "ModelInfo", limit_bytes: int, n_obs: int) -> None:
    """Refuse what cannot fit before anything is allocated: each input per sample (an input without a
    batch axis, fed whole to every call, at its full declared shape), the whole observation set, and
    every tensor whose size shape inference could fix."""
    for spec in info.inputs:
        if spec.name not in info.batch_axes:  # fed whole to every call: at its full declared shape
            _check_whole_input(spec, limit_bytes)
            continue
        per_sample = _nbytes(batch_axes.without_batch(spec, info.batch_axes), spec.dtype)
        if per_sample > limit_bytes:
            raise InputError(f"input {spec.name!r} needs {options.memory_text(per_sample)} per sample, above the limit {options.memory_text(limit_bytes)}")
        if per_sample * n_obs > limit_bytes:
            raise InputError(
                f"input {spec.name!r} needs {options.memory_text(per_sample)} per sample: {n_obs} observations need "
                f"{options.memory_text(per_sample * n_obs)}, above the limit {options.memory_text(limit_bytes)} (use fewer with --n-obs, or --memory-limit)"
            )
    for graph in _all_graphs(info.proto):
        for value in [*graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if value.type.WhichOneof("value") != "tensor_type" or _numpy_dtype(tensor.elem_type) is None:
                continue
            size = _nbytes([d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim], _numpy_dtype(tensor.elem_type))
            if size > limit_bytes:
                raise InputError(f"tensor {value.name[:80]!r} is declared {_dims(tensor)}: {options.memory_text(size)}, above the limit {options.memory_text(limit_bytes)}")


def check_batch_sizes(info: "ModelInfo", limit_bytes: int, batch_sizes: list[int]) -> None:
    """Each timed batch is made by the tool (observations tiled by an int64 row index) before a runtime sees
    it: a batch that cannot fit is the user's option to fix, not a cell's out-of-memory FAIL."""
    per_sample = 8 + sum(_nbytes(batch_axes.without_batch(spec, info.batch_axes), spec.dtype)
                         for spec in info.inputs if spec.name in info.batch_axes)
    largest = max(batch_sizes)
    if per_sample * largest > limit_bytes:
        raise InputError(f"--batch-sizes {largest}: a batch needs {options.memory_text(per_sample * largest)}, "
                         f"above the limit {options.memory_text(limit_bytes)} (use smaller batches, or --memory-limit)")


def _check_whole_input(spec: TensorSpec, limit_bytes: int) -> None:
    size = _nbytes(spec.shape, spec.dtype)
    if size > limit_bytes:
        raise InputError(f"input {spec.name!r} is fed whole to every call at its declared shape {spec.shape}: "
                         f"{options.memory_text(size)}, above the limit {options.memory_text(limit_bytes)}")


def _nbytes(dims: list, dtype) -> int:
    count = 1
    for d in dims:
        count *= d if isinstance(d, int) else 1  # a symbolic dimension counts as 1 per sample
    return count * np.dtype(dtype).itemsize


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
    return userfiles.one_line(text.splitlines()[0]) if text else type(error).__name__
