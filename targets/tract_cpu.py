"""tract (Sonos' Rust inference engine) on the CPU: an independent ONNX implementation.

Every other ONNX target here shares onnxruntime's kernels; tract shares none, so
agreement between the two is evidence about the policy, not about one library.
It runs the core's ONNX variants as they are. Placement comes from tract's own
profile: each ONNX node with the op tract turned it into (e.g. Gemm -> OptMatMul).
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import onnx

from .base import NO_SETTINGS, Artifact, BackendInfo, Feeds, PlacementRow, Session, Settings, Target
from .timing import time_calls

WHERE = "tract (CPU)"


def _rows(inputs: list[np.ndarray]) -> int:
    return inputs[0].shape[0] if inputs and inputs[0].ndim else 1


class TractSession(Session):
    def __init__(self, artifact: Artifact):
        import tract

        graph = onnx.load(str(artifact.path), load_external_data=False).graph
        initializers = {tensor.name for tensor in graph.initializer}
        # tract names outputs after the node that makes them: take the tensor names from the graph.
        self.input_names = [value.name for value in graph.input if value.name not in initializers]
        self.output_names = [value.name for value in graph.output]
        try:
            self.runnable = tract.onnx().load(str(artifact.path)).into_model().into_runnable()
        except Exception as error:  # tract appends a Rust stack trace to its own words
            raise RuntimeError(str(error).split("Stack backtrace:")[0].strip()) from None
        self.profile_inputs: list[np.ndarray] | None = None

    def _inputs(self, feeds: Feeds) -> list[np.ndarray]:
        # asarray, not ascontiguousarray: that one makes a scalar input 1-d
        inputs = [np.asarray(feeds[name], order="C") for name in self.input_names]
        # tract's profiler runs the model many times over: profile with the smallest batch seen
        # (the plan, and so the placement, is the same at every batch; batch 64 cost ~3 s per cell)
        if self.profile_inputs is None or _rows(inputs) <= _rows(self.profile_inputs):
            self.profile_inputs = inputs
        return inputs

    def run(self, feeds: Feeds) -> Feeds:
        values = self.runnable.run(self._inputs(feeds))
        return {name: value.to_numpy() for name, value in zip(self.output_names, values)}

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        run, inputs = self.runnable.run, self._inputs(feeds)

        def call() -> None:
            [value.to_numpy() for value in run(inputs)]  # a caller needs the action as an array

        return time_calls(call, warmup, iters)

    def placement(self) -> list[PlacementRow]:
        if self.profile_inputs is None:
            return []
        try:
            profile = json.loads(self.runnable.profile_json(self.profile_inputs))
        except BaseException as error:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            raise RuntimeError(f"tract's profiler failed: {str(error).split('Stack backtrace:')[0].strip()}") from None
        return [
            PlacementRow(node=node["node_name"], op_type=node["op_name"], where=WHERE, fallback=False)
            for node in profile["nodes"]
            if node["op_name"] not in ("Const", "Source")  # constants and graph inputs run nowhere
        ]

    def backend(self) -> BackendInfo:
        return BackendInfo(requested=WHERE, actual=WHERE)


class TractCpu(Target):
    runs_onnx_as_is = True
    name = "tract"
    summary = "tract (Rust, independent of onnxruntime), CPU"

    def runtime_version(self) -> str:
        try:
            return f"tract {version('tract')}"
        except PackageNotFoundError:
            return "tract (not installed)"

    def unavailable_reason(self) -> str | None:
        try:
            import tract  # noqa: F401
        except ImportError:
            return "the tract package is not installed: run `policy-matrix setup core` (or pip install 'policy-matrix[tract]')"
        return None

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        return TractSession(artifact)
