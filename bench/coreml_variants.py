"""CoreML variants side by side: package size and conversion time, fp32 vs fp16 vs int8.

Core ML cannot predict off macOS, so the int8 (weight-only) drift is estimated here
the way coremltools quantizes: every weight matrix / conv kernel rounded to int8 per
output channel (symmetric, scale = max|w| / 127), run by ONNX Runtime in fp32, next
to ORT's own dynamic int8 quantization. On macOS the coreml-* cells measure the real
drift. Run: .venv/bin/python bench/coreml_variants.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import quantize_dynamic

import targets
from matrix.inputs.examples import BUILDERS
from matrix.inputs.examples import path as example
from targets.base import PrepareContext


def feeds_for(model_path: Path, rows: int = 256) -> dict[str, np.ndarray]:
    value = onnx.load(model_path).graph.input[0]
    shape = [dim.dim_value or rows for dim in value.type.tensor_type.shape.dim]
    return {value.name: np.random.default_rng(0).normal(size=shape).astype(np.float32)}


def run(model_path: Path, feeds) -> np.ndarray:
    return ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def weight_only_int8(model_path: Path, out: Path) -> Path:
    """Weights (rank >= 2) fake-quantized to int8 per output channel, as coremltools does."""
    model = onnx.load(model_path)
    for init in model.graph.initializer:
        weight = numpy_helper.to_array(init)
        if weight.ndim < 2:
            continue
        scale = np.abs(weight).reshape(len(weight), -1).max(axis=1) / 127.0
        scale = scale.reshape(-1, *[1] * (weight.ndim - 1))
        init.CopyFrom(numpy_helper.from_array((np.round(weight / scale).clip(-127, 127) * scale).astype(np.float32), init.name))
    onnx.save(model, out)
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp())
    print(f"{'policy':15} {'variant':7} {'size KB':>8} {'x fp32':>7} {'convert s':>9} | int8 drift proxy vs fp32")
    for name in BUILDERS:
        feeds = feeds_for(example(name))
        ctx = PrepareContext(onnx_variants={"fp32": example(name)}, calibration=feeds, batch_axes=dict.fromkeys(feeds, 0), workdir=work,
                             cache_dir=work / name)
        sizes = {}
        for variant in ("fp32", "fp16", "int8"):
            artifact = targets.get("coreml").prepare(ctx, variant)
            sizes[variant] = artifact.size_bytes
            print(f"{name:15} {variant:7} {artifact.size_bytes / 1024:8.1f} {artifact.size_bytes / sizes['fp32']:7.2f} "
                  f"{artifact.conversion_s:9.2f}")
        reference = run(example(name), feeds)
        coreml_like = run(weight_only_int8(example(name), work / f"{name}-w8.onnx"), feeds)
        quantize_dynamic(str(example(name)), str(work / f"{name}-dyn.onnx"))
        ort_dynamic = run(work / f"{name}-dyn.onnx", feeds)
        print(f"{'':15} weight-only int8 (coremltools-style): {drift(coreml_like, reference)}   "
              f"ORT dynamic int8: {drift(ort_dynamic, reference)}")


def drift(got: np.ndarray, want: np.ndarray) -> str:
    if want.dtype.kind == "f":
        return f"max abs {np.abs(got.astype(np.float64) - want).max():.2e}"
    return f"action agreement {np.mean(got == want):.3f}"

if __name__ == "__main__":
    main()
