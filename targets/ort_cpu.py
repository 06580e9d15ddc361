"""ONNX Runtime in this Python process, CPU execution provider.

`OrtTarget` is parameterized by the requested execution provider so other ORT
providers (CUDA, CoreML) are a subclass naming theirs; everything else —
session options, placement from ORT's assignment record, verification that
the requested provider was really used — is shared.

onnxruntime is imported where a session is opened (the cell's worker): the runner only
names and schedules these targets, and importing ORT there cost every run ~0.1 s.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import ClassVar

from .base import NO_SETTINGS, Artifact, BackendInfo, Feeds, Knob, PlacementRow, Session, Settings, Target
from .timing import time_calls
from .versions import PipRelease

# Provider options that change the numbers a cell measures, shown on the cell's backend line.
SHOWN_PROVIDER_OPTIONS = ("use_tf32", "device_id")

# SessionOptions.graph_optimization_level (ort.GraphOptimizationLevel members), by the names ORT's documentation uses.
GRAPH_OPTIMIZATION = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
ORT_KNOBS = {
    "threads": Knob("SessionOptions.intra_op_num_threads (default: --threads)"),
    "opt": Knob("SessionOptions.graph_optimization_level (default: all)", tuple(GRAPH_OPTIMIZATION), default="all"),
}


class OrtSession(Session):
    def __init__(self, artifact: Artifact, providers: list, threads: int, settings: Settings = NO_SETTINGS):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(settings.get("threads", threads))
        options.inter_op_num_threads = 1
        level = GRAPH_OPTIMIZATION[settings.get("opt", "all")]
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        self.model_path, self.providers, self.options = str(artifact.path), providers, options
        self.last_feeds: Feeds | None = None
        self.requested = providers[0] if isinstance(providers[0], str) else providers[0][0]
        self.session = ort.InferenceSession(str(artifact.path), options, providers=providers)
        self.settings_given = bool(settings)
        # A sequence or map output (skl2onnx's ZipMap) is left out of the matrix: only tensors are fetched.
        self.output_names = [o.name for o in self.session.get_outputs() if o.type.startswith("tensor")]

    def run(self, feeds: Feeds) -> Feeds:
        self.last_feeds = feeds
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        return time_calls(functools.partial(self.session.run, self.output_names, feeds), warmup, iters)

    def placement(self) -> list[PlacementRow]:
        if not hasattr(self.session, "get_provider_graph_assignment_info"):  # onnxruntime < 1.24 (a pinned release)
            return self._profiled_placement()
        return [
            PlacementRow(node.name, node.op_type, subgraph.ep_name, subgraph.ep_name != self.requested)
            for subgraph in self.session.get_provider_graph_assignment_info()
            for node in subgraph.get_nodes()
        ]

    def _profiled_placement(self) -> list[PlacementRow]:
        """Where each kernel ran, from ORT's profile of one call in a separate session (profiling the timed
        session would slow the calls it times). Kernels are the optimized graph's: fused nodes keep ORT's names."""
        import onnxruntime as ort

        if self.last_feeds is None:
            return []
        with tempfile.TemporaryDirectory() as scratch:
            self.options.enable_profiling = True
            self.options.profile_file_prefix = str(Path(scratch) / "profile")
            profiled = ort.InferenceSession(self.model_path, self.options, providers=self.providers)
            profiled.run(self.output_names, self.last_feeds)
            events = json.loads(Path(profiled.end_profiling()).read_text())
        kernels = {event["name"].removesuffix("_kernel_time"): event["args"] for event in events
                   if event.get("cat") == "Node" and event["name"].endswith("_kernel_time")}
        return [PlacementRow(name, args.get("op_name", ""), args.get("provider", ""), args.get("provider") != self.requested)
                for name, args in kernels.items()]

    def backend(self) -> BackendInfo:
        # ORT only warns when a requested provider is missing and silently uses CPU.
        actual = self.session.get_providers()[0]
        options = self.session.get_provider_options().get(actual, {})
        shown = {key: options[key] for key in SHOWN_PROVIDER_OPTIONS if key in options}
        detail = ", ".join(f"{key}={value}" for key, value in shown.items())
        if self.settings_given:  # read back from the session: what the runtime really uses
            applied = self.session.get_session_options()
            detail = ", ".join(part for part in (detail, f"intra_op_num_threads={applied.intra_op_num_threads}",
                                                 f"graph_optimization_level={applied.graph_optimization_level.name}") if part)
        return BackendInfo(requested=self.requested, actual=actual, detail=detail)


class OrtTarget(Target):
    runs_onnx_as_is = True
    provider: ClassVar[str]
    provider_options: ClassVar[dict[str, str]] = {}
    knobs = ORT_KNOBS
    release: ClassVar[PipRelease] = PipRelease(
        "onnxruntime", floor="1.19.0",
        why_floor="the oldest release whose wheels import beside numpy 2 (the project's numpy)")

    def runtime_version(self) -> str:
        import onnxruntime as ort

        return f"onnxruntime {ort.__version__}"

    def unavailable_reason(self) -> str | None:
        import onnxruntime as ort

        if self.provider in ort.get_available_providers():
            return None
        return f"this onnxruntime build has no {self.provider}"

    def providers(self) -> list:
        return [(self.provider, self.provider_options)]

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        return OrtSession(artifact, self.providers(), threads, settings)


class OrtCpu(OrtTarget):
    name = "ort-cpu"
    summary = "ONNX Runtime (Python), CPU execution provider"
    provider = "CPUExecutionProvider"

    def unavailable_reason(self) -> str | None:
        return None  # every onnxruntime build has the CPU provider (and onnxruntime is a dependency): no import to ask


class OrtCuda(OrtTarget):
    """fp32 means fp32 math: ORT's CUDA EP defaults to use_tf32=1, which runs MatMul/Gemm/Conv
    in TF32 (10-bit mantissa) on compute capability >= 8.0. Measured on an H200 with
    onnxruntime-gpu 1.31.1: max drift 8.4e-4 (MLP) and 1.4e-3 (CNN) with TF32, 3e-7 / 8e-7
    without. `ort-cuda-tf32` is the provider as shipped, with its default."""

    name = "ort-cuda"
    summary = "ONNX Runtime (Python), CUDA execution provider, TF32 off (onnxruntime-gpu on an NVIDIA GPU)"
    provider = "CUDAExecutionProvider"
    provider_options = {"use_tf32": "0"}
    release = PipRelease("onnxruntime-gpu", floor="1.19.0",
                         why_floor="the oldest release whose wheels import beside numpy 2 (the project's numpy)")

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        return f"{reason}: install onnxruntime-gpu on a machine with an NVIDIA GPU" if reason else None

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        # pip's onnxruntime-gpu[cuda,cudnn] brings CUDA as Python packages; preload_dlls finds them
        # (ORT >= 1.21), so no LD_LIBRARY_PATH is needed.
        import onnxruntime as ort

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        return super()._open(artifact, threads, settings)


class OrtCudaTf32(OrtCuda):
    name = "ort-cuda-tf32"
    summary = "ONNX Runtime (Python), CUDA execution provider with its default use_tf32=1 (TF32 math on Ampere and later)"
    provider_options = {}
