"""A converted .tflite file opened in the LiteRT interpreter (ai-edge-litert, no TensorFlow needed).

The only module that touches LiteRT's private API (`_get_full_signature_list`,
`_get_ops_details`): what it reads goes to the pure functions of
tflite_provenance.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .base import Artifact, BackendInfo, Feeds, PlacementRow, Session
from .tflite_provenance import (
    BUILTIN, XNNPACK, OpDetails, Provenance, channel_first_permutation, map_signature, placement_rows,
)
from .timing import time_calls


@dataclass(kw_only=True)
class TfliteArtifact(Artifact):
    """A .tflite file and what ties it back to the ONNX model it was converted from."""

    provenance: Provenance


class TfliteSession(Session):
    def __init__(self, artifact: TfliteArtifact, threads: int, xnnpack: bool):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        self.requested = XNNPACK if xnnpack else BUILTIN
        self.provenance = artifact.provenance
        interface = artifact.provenance.interface
        # Flex (Select TF) ops fail here with LiteRT's own message: the cell FAILs with it.
        self.interpreter = Interpreter(
            model_path=str(artifact.path), num_threads=threads, experimental_op_resolver_type=resolver
        )
        self.interpreter.allocate_tensors()
        signature = self.interpreter._get_full_signature_list().get("serving_default") or unsigned(self.interpreter)
        self.inputs = map_signature(signature["inputs"], list(interface.onnx_inputs), "input_")
        self.outputs = map_signature(signature["outputs"], list(interface.onnx_outputs), "output_")
        self.output_permutations = output_permutations(self.interpreter, self.outputs, interface.onnx_outputs)
        self.shapes = {name: self.interpreter.get_tensor(index).shape for name, index in self.inputs.items()}
        # onnx2tf may narrow an input's type (int64 -> int32); the observations keep the ONNX type.
        self.dtypes = {name: self.interpreter.get_tensor(index).dtype for name, index in self.inputs.items()}

    def _set_inputs(self, feeds: Feeds) -> None:
        """Resize when the batch changes: the file's batch is dynamic but allocated at 1."""
        interpreter = self.interpreter
        changed = {name: value.shape for name, value in feeds.items() if self.shapes.get(name) != value.shape}
        for name, shape in changed.items():
            interpreter.resize_tensor_input(self.inputs[name], shape, strict=False)
            self.shapes[name] = shape
        if changed:
            interpreter.allocate_tensors()
        for name, value in feeds.items():
            interpreter.set_tensor(self.inputs[name], value.astype(self.dtypes[name], copy=False))

    def _get_outputs(self) -> Feeds:
        get = self.interpreter.get_tensor
        outputs = {name: get(index) for name, index in self.outputs.items()}
        for name, permutation in self.output_permutations.items():
            outputs[name] = np.transpose(outputs[name], permutation)
        return outputs

    def run(self, feeds: Feeds) -> Feeds:
        self._set_inputs(feeds)
        self.interpreter.invoke()
        return self._get_outputs()

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        """Per call: copy inputs in, invoke, copy outputs out (what ORT's run() includes too).

        The two copies cost about 1.5 us through the Python API, which dominates a tiny
        MLP at batch 1 (bench/tflite_bench.py prints the ratio to a bare invoke() loop).
        """
        self._set_inputs(feeds)
        feeds = {name: value.astype(self.dtypes[name], copy=False) for name, value in feeds.items()}
        set_tensor, invoke, read = self.interpreter.set_tensor, self.interpreter.invoke, self._get_outputs
        fill = [(self.inputs[name], value) for name, value in feeds.items()]

        def call() -> None:
            for index, value in fill:
                set_tensor(index, value)
            invoke()
            read()

        return time_calls(call, warmup, iters)

    @functools.cached_property
    def _op_details(self) -> OpDetails:
        """Read once: delegation is decided when the interpreter is prepared, not per batch size."""
        return OpDetails.of(self.interpreter._get_ops_details())

    def placement(self) -> list[PlacementRow]:
        return placement_rows(self._op_details, tensor_names(self.interpreter), self.provenance, self.outputs, self.requested)

    def backend(self) -> BackendInfo:
        details = self._op_details
        builtin_ops = [op["op_name"] for op in details.kernels() if details.where(op) == BUILTIN]
        # One rule, whether XNNPACK took some ops or none: builtin kernels are LiteRT's own
        # per-op fallback, shown as fallback placement rows (a WARN), never a wrong backend.
        detail = f"{len(details.delegated)} op(s) in XNNPACK, {len(builtin_ops)} on builtin kernels"
        if details.delegated and builtin_ops:
            detail += f" ({', '.join(sorted(set(builtin_ops)))})"
        return BackendInfo(requested=self.requested, actual=self.requested, detail=detail)

    def close(self) -> None:
        self.interpreter = None


def output_steps(artifact: TfliteArtifact) -> dict[str, float]:
    """ONNX output name -> the scale of the integer tensor it is dequantized from, for each output so made: a
    full-integer file computes its last ops in int8 and DEQUANTIZEs, so an output takes only values on that grid."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(artifact.path))
    signature = interpreter._get_full_signature_list().get("serving_default") or unsigned(interpreter)
    outputs = map_signature(signature["outputs"], list(artifact.provenance.interface.onnx_outputs), "output_")
    tensors = {detail["index"]: detail for detail in interpreter.get_tensor_details()}
    writers = {index: op for op in interpreter._get_ops_details() for index in op["outputs"]}
    steps = {}
    for name, index in outputs.items():
        op = writers.get(index)
        source = tensors[op["inputs"][0]] if op is not None and op["op_name"] == "DEQUANTIZE" else tensors[index]
        scale = source["quantization"][0]
        if scale and np.dtype(source["dtype"]).kind in "iu":
            steps[name] = float(scale)
    return steps


def unsigned(interpreter) -> dict:
    """A file without a signature (onnx2tf writes none when its SavedModel step fails): its
    tensors are named Placeholder/Identity, in the model's input and output order."""
    return {
        "inputs": {f"input_{i}": d["index"] for i, d in enumerate(interpreter.get_input_details())},
        "outputs": {f"output_{i}": d["index"] for i, d in enumerate(interpreter.get_output_details())},
    }


def output_permutations(interpreter, outputs: dict[str, int], onnx_outputs: dict[str, list]) -> dict[str, tuple]:
    """Outputs onnx2tf left channel-last, and the permutation that gives them the ONNX layout."""
    details = {d["index"]: d for d in interpreter.get_output_details()}
    found = {name: channel_first_permutation(onnx_outputs[name], list(details[index]["shape_signature"]))
             for name, index in outputs.items()}
    return {name: permutation for name, permutation in found.items() if permutation is not None}


def tensor_names(interpreter) -> dict[int, str]:
    return {detail["index"]: detail["name"] for detail in interpreter.get_tensor_details()}
