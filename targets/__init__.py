"""The target registry: every runtime the matrix knows, in report order.

Adding a target is one module in this package plus one line below. A target's module is
imported when the target is first looked up, not when the registry is: a run of ort-cpu
alone does not pay for the browser, LiteRT or Core ML code (~0.35 s of imports), and
listing or matching names (`--targets 'ort-web-*'`) imports nothing.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping

from .base import Target

# name -> "module:class" in this package. tests/unit/test_registry.py checks that each class names itself so.
WHERE = {
    "ort-cpu": "ort_cpu:OrtCpu",
    "ort-cuda": "ort_cpu:OrtCuda",
    "ort-cuda-tf32": "ort_cpu:OrtCudaTf32",
    "ort-node": "ort_node:OrtNode",
    "ort-web-wasm": "ort_web:OrtWebWasm",
    "ort-web-webgl": "ort_web:OrtWebWebgl",
    "ort-web-webgpu": "ort_web:OrtWebWebgpu",
    "tract": "tract_cpu:TractCpu",
    "tflite": "tflite:TfliteTarget",
    "tflite-noxnn": "tflite:TfliteNoXnnpack",
    "tflite-int8-full": "tflite:TfliteInt8Full",
    "ort-coreml": "ort_coreml:OrtCoreml",
    "coreml": "coreml:CoremlTarget",
    "coreml-cpu": "coreml:CoremlCpu",
    "coreml-gpu": "coreml:CoremlGpu",
    "coreml-ne": "coreml:CoremlNe",
    "coreml-all": "coreml:CoremlAll",
}


class Registry(Mapping[str, Target]):
    """Target instances by name, each made on first lookup (one instance per name, whichever thread asks)."""

    def __init__(self, where: dict[str, str]):
        self._where = where
        self._made: dict[str, Target] = {}
        self._making = threading.RLock()  # a target made while making another (one module importing the next)

    def __getitem__(self, name: str) -> Target:
        with self._making:
            if name not in self._made:
                module, cls = self._where[name].split(":")
                self._made[name] = getattr(importlib.import_module(f".{module}", __name__), cls)()
            return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


REGISTRY = Registry(WHERE)


def get(name: str) -> Target:
    """A registered target, or one pinned to a release: `ort-cpu@1.20.1` (see targets/versions.py)."""
    base, pinned_to, _ = name.partition("@")
    if not pinned_to:
        return REGISTRY[name]
    from .versions import pinned

    return pinned(REGISTRY[base], name)
