"""tract (Sonos' Rust inference engine) on the CPU: an independent ONNX implementation.

Every other ONNX target here shares onnxruntime's kernels; tract shares none, so
agreement between the two is evidence about the policy, not about one library.
It runs the core's ONNX variants as they are. Placement comes from tract's own
plan: each ONNX node with the op tract turned it into (e.g. Gemm -> OptMatMul).
An output held in a type tract's Python API does not hand back (a TDim: its ONNX
loader makes every Cast to int64 one) is read back as the integer type the graph
declares, exactly or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
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

Reader = Callable[[object], np.ndarray]  # tract's output tensor -> its values


@dataclass
class Plan:
    """tract's runnable plan of the model, and how each of its outputs is read back (in the graph's order)."""

    runnable: object
    readers: list[Reader]


class TractSession(Session):
    def __init__(self, artifact: Artifact):
        graph = onnx.load(str(artifact.path), load_external_data=False).graph
        initializers = {tensor.name for tensor in graph.initializer}
        inputs = [value for value in graph.input if value.name not in initializers]
        # tract names outputs after the node that makes them: take the tensor names from the graph.
        self.input_names = [value.name for value in inputs]
        self.output_names = [value.name for value in graph.output]
        self.declared = [_declared_dtype(value) for value in graph.output]
        self.converted: dict[str, str] = {}  # output -> how it is read back where it is converted (backend detail)
        self.path = artifact.path
        # tract's loader is left without an input fact ("Source node without a determined fact. Help: provide
        # explicit input facts") by a dim without a name (skl2onnx's `?`, silero's state), and by an input that is
        # also a graph output (its declared shape is dropped: `..,?`). Explicit facts are how tract's own examples
        # load every model, so such a model gets the shapes it is fed, one plan per shape.
        self.why_fed_facts = _why_fed_shapes(inputs, set(self.output_names))
        self.plans: dict[tuple, Plan] = {}
        self.plan = None if self.why_fed_facts else self._planned(None)

    def _inputs(self, feeds: Feeds) -> list[np.ndarray]:
        # asarray, not ascontiguousarray: that one makes a scalar input 1-d
        return [np.asarray(feeds[name], order="C") for name in self.input_names]

    def _planned(self, facts: list[str] | None) -> Plan:
        runnable = _plan(self.path, facts)
        return Plan(runnable, [self._reader(index, fact) for index, fact in enumerate(runnable.output_facts())])

    def _reader(self, index: int, fact) -> Reader:
        """The output as tract holds it, or, where that type is one tract's Python API does not hand back, converted
        to the type the graph declares: decided once per plan, so a timed call reads it back as run() does."""
        try:
            fact.datum_type()
            return _as_held
        except Exception as error:
            why = tract_message(error)
        name, declared = self.output_names[index], self.declared[index]
        if declared is None or declared.kind not in "iu":
            return _refused(name, declared, why)
        self.converted[name] = f"converted to the declared {declared} to be read back (tract: {why})"
        return _as_declared_integer(name, declared, why)

    def _current(self, inputs: list[np.ndarray]) -> Plan:
        if not self.why_fed_facts:
            return self.plan
        key = tuple((array.shape, array.dtype.str) for array in inputs)
        if key not in self.plans:
            self.plans[key] = self._planned([_fact(array) for array in inputs])
        self.plan = self.plans[key]
        return self.plan

    def run(self, feeds: Feeds) -> Feeds:
        inputs = self._inputs(feeds)
        plan = self._current(inputs)
        try:
            outputs = plan.runnable.run(inputs)
            return {name: read(value) for name, read, value in zip(self.output_names, plan.readers, outputs)}
        except Exception as error:
            raise RuntimeError(tract_message(error)) from None

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        inputs = self._inputs(feeds)
        plan = self._current(inputs)
        run, readers = plan.runnable.run, plan.readers

        def call() -> None:
            [read(value) for read, value in zip(readers, run(inputs))]  # a caller needs the action as an array

        try:
            return time_calls(call, warmup, iters)
        except Exception as error:
            raise RuntimeError(tract_message(error)) from None

    def placement(self) -> list[PlacementRow]:
        # Without inputs, tract lists its plan without timing it: the same nodes and ops as a
        # profiled run (checked on the bundled policies) in under a millisecond instead of 3-10 s.
        try:
            profile = json.loads(self.plan.runnable.profile_json(None))
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
        details = [f"input facts from the fed shapes ({self.why_fed_facts})"] if self.why_fed_facts else []
        details += [f"output {name!r} {how}" for name, how in self.converted.items()]
        return BackendInfo(requested=WHERE, actual=WHERE, detail="; ".join(details))


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


def _as_held(value) -> np.ndarray:
    return value.to_numpy()


def _as_declared_integer(name: str, declared: np.dtype, why: str) -> Reader:
    """Reads an output through int64, which tract converts a TDim to exactly or not at all (a symbolic value), then
    as the declared integer type only where every value fits. tract's ONNX loader turns every Cast to int64 into a
    Cast to TDim, so that shapes computed in the graph stay symbolic: a discrete action cast to int64 (SB3's
    ArgMax -> Cast -> Reshape, or any Cast to int64 at the end of a graph) comes out as one."""
    import tract

    def read(value) -> np.ndarray:
        wide = value.convert_to(tract.DatumType.I64).to_numpy()
        narrowed = wide.astype(declared)
        if not np.array_equal(narrowed, wide):
            raise RuntimeError(f"output {name!r}: {why}; as int64, {np.count_nonzero(narrowed != wide)} of its "
                               f"{wide.size} values do not fit the declared {declared}")
        return narrowed

    return read


def _refused(name: str, declared: np.dtype | None, why: str) -> Reader:
    shown = "without a type" if declared is None else declared

    def read(_value) -> np.ndarray:
        raise RuntimeError(f"output {name!r}: {why}; the graph declares it {shown}, not an integer type to read it "
                           "back as")

    return read


def _declared_dtype(value: onnx.ValueInfoProto) -> np.dtype | None:
    """The element type the graph declares for an output (None: none declared)."""
    elem_type = value.type.tensor_type.elem_type
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)) if elem_type else None


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
