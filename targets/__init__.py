"""The target registry: every runtime the matrix knows, in report order.

Adding a target is one module in this package plus one line below.
"""

from __future__ import annotations

from . import coreml
from .base import Target
from .ort_coreml import OrtCoreml
from .ort_cpu import OrtCpu, OrtCuda, OrtCudaTf32
from .ort_node import OrtNode
from .ort_web import OrtWebWasm, OrtWebWebgl, OrtWebWebgpu
from .tflite import TfliteInt8Full, TfliteNoXnnpack, TfliteTarget
from .tract_cpu import TractCpu

REGISTRY: dict[str, Target] = {
    target.name: target
    for target in (
        OrtCpu(), OrtCuda(), OrtCudaTf32(), OrtNode(), OrtWebWasm(), OrtWebWebgl(), OrtWebWebgpu(), TractCpu(),
        TfliteTarget(), TfliteNoXnnpack(), TfliteInt8Full(), OrtCoreml(), *coreml.TARGETS,
    )
}


def get(name: str) -> Target:
    """A registered target, or one pinned to a release: `ort-cpu@1.20.1` (see targets/versions.py)."""
    base, pinned_to, _ = name.partition("@")
    if not pinned_to:
        return REGISTRY[name]
    from .versions import pinned

    return pinned(REGISTRY[base], name)
