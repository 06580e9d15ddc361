"""tract (Sonos' Rust inference engine) on the CPU: an independent ONNX implementation.

Every other ONNX target here shares onnxruntime's kernels; tract shares none, so
agreement between the two is evidence about the policy, not about one library.
It runs the core's ONNX variants as they are. Placement comes from tract's own
plan: each ONNX node with the op tract turned it into (e.g. Gemm -> OptMatMul).
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import onnx

from .base import NO_SETTINGS, Artifact, BackendInfo, Feeds, PlacementRow, Session, Settings, Target
from .timing import time_calls
from .versions import PipRelease

WHERE = "tract (CPU)"
# Pinned releases (`tract@0.23.0`): 0.22 and older have no `tract.onnx().load()` (measured: 0.20.22, 0.21.0, 0.22.4).
TRACT_FLOOR = "0.23.0"


class TractSession(Session):
    def __init__(self, artifact: Artifact):
        graph = onnx.load(str(artifact.path), load_external_data=False).graph
        initializers = {tensor.name for tensor in graph.initializer}
        inputs = [value for value in graph.input if value.name not in initializers]
        # tract names outputs after the node that makes them: take the tensor names from the graph.
        self.input_names = [value.name for value in inputs]
        self.output_names = [value.name for value in graph.output]
        self.path = artifact.path
        # tract's loader is left without an input fact ("Source node without a determined fact. Help: provide
        # explicit input facts") by a dim without a name (skl2onnx's `?`, silero's state), and by an input that is
        # also a graph output (its declared shape is dropped: `..,?`). Explicit facts are how tract's own examples
        # load every model, so such a model gets the shapes it is fed, one plan per shape.
        self.why_fed_facts = _why_fed_shapes(inputs, set(self.output_names))
        self.plans: dict[tuple, object] = {}
        self.runnable = None if self.why_fed_facts else _plan(self.path, None)

    def _inputs(self, feeds: Feeds) -> list[np.ndarray]:
        # asarray, not ascontiguousarray: that one makes a scalar input 1-d
        return [np.asarray(feeds[name], order="C") for name in self.input_names]

    def _runnable(self, inputs: list[np.ndarray]):
        if not self.why_fed_facts:
            return self.runnable
        key = tuple((array.shape, array.dtype.str) for array in inputs)
        if key not in self.plans:
            self.plans[key] = _plan(self.path, [_fact(array) for array in inputs])
        self.runnable = self.plans[key]
        return self.runnable

    def run(self, feeds: Feeds) -> Feeds:
        inputs = self._inputs(feeds)
        runnable = self._runnable(inputs)
        try:  # reading an output back can fail too (a TDim output: "Unsupported DatumType in the public API")
            return {name: value.to_numpy() for name, value in zip(self.output_names, runnable.run(inputs))}
        except Exception as error:
            raise RuntimeError(tract_message(error)) from None

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        inputs = self._inputs(feeds)
        run = self._runnable(inputs).run

        def call() -> None:
            [value.to_numpy() for value in run(inputs)]  # a caller needs the action as an array

        try:
            return time_calls(call, warmup, iters)
        except Exception as error:
            raise RuntimeError(tract_message(error)) from None

    def placement(self) -> list[PlacementRow]:
        # Without inputs, tract lists its plan without timing it: the same nodes and ops as a
        # profiled run (checked on the bundled policies) in under a millisecond instead of 3-10 s.
        try:
            profile = json.loads(self.runnable.profile_json(None))
        except BaseException as error:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            raise RuntimeError(f"tract's profiler failed: {tract_message(error)}") from None
        return [
            PlacementRow(node=node["node_name"], op_type=node["op_name"], where=WHERE, fallback=False)
            for node in profile["nodes"]
            if node["op_name"] not in ("Const", "Source")  # constants and graph inputs run nowhere
        ]

    def backend(self) -> BackendInfo:
        detail = f"input facts from the fed shapes ({self.why_fed_facts})" if self.why_fed_facts else ""
        return BackendInfo(requested=WHERE, actual=WHERE, detail=detail)


def _plan(path: Path, facts: list[str] | None):
    """tract's optimized, runnable plan of the model; `facts` fixes each input's shape and type."""
    import tract

    try:
        model = tract.onnx().load(str(path))
        for index, fact in enumerate(facts or []):
            model.set_input_fact(index, fact)
        return model.into_model().into_runnable()
    except Exception as error:
        raise RuntimeError(tract_message(error)) from None


def tract_message(error: BaseException) -> str:
    """tract's own words: it appends a Rust stack trace to them."""
    return str(error).split("Stack backtrace:")[0].strip()


def _why_fed_shapes(inputs: list[onnx.ValueInfoProto], outputs: set[str]) -> str:
    """Why tract cannot take the inputs' facts from the model ("" when it can)."""
    if any(_unnamed_dims(value) for value in inputs):
        return "the model leaves dims unnamed"
    if any(value.name in outputs for value in inputs):
        return "an input is also an output, whose declared shape tract's loader drops"
    return ""


def _unnamed_dims(value: onnx.ValueInfoProto) -> bool:
    return any(not dim.HasField("dim_value") and not dim.dim_param for dim in value.type.tensor_type.shape.dim)


def _fact(array: np.ndarray) -> str:
    """tract's fact text for a fed array: '4,3,f32', 'i64' for a scalar."""
    datum = "bool" if array.dtype.kind == "b" else f"{array.dtype.kind}{array.dtype.itemsize * 8}"
    return ",".join([*map(str, array.shape), datum])


class TractCpu(Target):
    runs_onnx_as_is = True
    name = "tract"
    summary = "tract (Rust, independent of onnxruntime), CPU"
    release = PipRelease("tract", floor=TRACT_FLOOR, why_floor="older releases have no tract.onnx().load(), which this target calls")

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
