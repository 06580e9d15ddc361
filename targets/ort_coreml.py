"""ONNX Runtime with its CoreML execution provider (macOS), ML Program format.

Nodes the CoreML EP does not take run on ORT's CPU provider; ORT's own
assignment record (shared OrtSession) lists them, and they show as fallback.
"""

from __future__ import annotations

import sys

from .ort_cpu import OrtTarget


class OrtCoreml(OrtTarget):
    name = "ort-coreml"
    summary = "ONNX Runtime (Python), CoreML execution provider (ML Program)"
    provider = "CoreMLExecutionProvider"
    # ORT's default CoreML format is the older NeuralNetwork; ML Program is what current Core ML runs.
    provider_options = {"ModelFormat": "MLProgram", "MLComputeUnits": "ALL"}

    def unavailable_reason(self) -> str | None:
        if sys.platform != "darwin":
            return "ORT's CoreML execution provider needs macOS"
        return super().unavailable_reason()

    def providers(self) -> list:
        return [(self.provider, self.provider_options), "CPUExecutionProvider"]
