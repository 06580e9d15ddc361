"""ONNX Runtime in this Python process, CPU execution provider.

`OrtTarget` is parameterized by the requested execution provider so other ORT
providers (CUDA, CoreML) are a subclass naming theirs; everything else —
session options, placement from ORT's assignment record, verification that
the requested provider was really used — is shared.
"""

from __future__ import annotations

import time
from typing import ClassVar

import onnxruntime as ort

from .base import Artifact, BackendInfo, CellSkip, Feeds, PlacementRow, PrepareContext, Session, Target


class OrtSession(Session):
    def __init__(self, artifact: Artifact, providers: list, threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        self.requested = providers[0] if isinstance(providers[0], str) else providers[0][0]
        self.session = ort.InferenceSession(str(artifact.path), options, providers=providers)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Feeds) -> Feeds:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        run, names, clock = self.session.run, self.output_names, time.perf_counter_ns
        for _ in range(warmup):
            run(names, feeds)
        samples = []
        for _ in range(iters):
            start = clock()
            run(names, feeds)
            samples.append(clock() - start)
        return samples

    def placement(self) -> list[PlacementRow]:
        return [
            PlacementRow(node.name, node.op_type, subgraph.ep_name, subgraph.ep_name != self.requested)
            for subgraph in self.session.get_provider_graph_assignment_info()
            for node in subgraph.get_nodes()
        ]

    def backend(self) -> BackendInfo:
        # ORT only warns when a requested provider is missing and silently uses CPU.
        return BackendInfo(requested=self.requested, actual=self.session.get_providers()[0])


class OrtTarget(Target):
    provider: ClassVar[str]

    def runtime_version(self) -> str:
        return f"onnxruntime {ort.__version__}"

    def unavailable_reason(self) -> str | None:
        if self.provider in ort.get_available_providers():
            return None
        return f"this onnxruntime build has no {self.provider}"

    def prepare(self, ctx: PrepareContext, variant: str) -> Artifact:
        return Artifact(path=ctx.onnx_variant(variant), conversion_s=ctx.variant_seconds.get(variant, 0.0))

    def providers(self) -> list:
        return [self.provider]

    def open(self, artifact: Artifact, threads: int) -> Session:
        if self.unavailable_reason():
            raise CellSkip(self.unavailable_reason())
        return OrtSession(artifact, self.providers(), threads)


class OrtCpu(OrtTarget):
    name = "ort-cpu"
    summary = "ONNX Runtime (Python), CPU execution provider"
    provider = "CPUExecutionProvider"


class OrtCuda(OrtTarget):
    name = "ort-cuda"
    summary = "ONNX Runtime (Python), CUDA execution provider (onnxruntime-gpu on an NVIDIA GPU)"
    provider = "CUDAExecutionProvider"

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        return f"{reason}: install onnxruntime-gpu on a machine with an NVIDIA GPU" if reason else None
