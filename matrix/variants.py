"""ONNX precision variants, made once per model and cached by content hash.

fp16 keeps float32 inputs and outputs (onnxconverter-common, keep_io_types) so
the same observations feed every variant; int8 is ONNX Runtime's dynamic
quantization (8-bit weights, activations quantized per call). Weights are
unsigned (U8U8): with signed weights ORT's x86 kernels can saturate on CPUs
without VNNI (its quantization docs say so); measured here on the bundled MLP,
max drift 0.27 with S8 weights against 0.04 with U8. Targets with their
own converters (onnx2tf, coremltools) start from fp32 and make their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import onnx
import onnxruntime
from onnxconverter_common import float16
from onnxruntime.quantization import QuantType, quantize_dynamic

from .model import ModelInfo
from .paths import cache_dir

RECIPE = "fp16-keep-io/int8-dynamic-u8u8"  # part of the cache key: change it when a recipe changes


def produce_all(model: ModelInfo, variants: list[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """Paths of the variants that could be made, and the converter's words for those that could not."""
    tools = f"{RECIPE}/{onnxruntime.__version__}/{version('onnxconverter-common')}/{onnx.__version__}"
    key = hashlib.sha256(f"{model.sha256}/{tools}".encode()).hexdigest()[:16]
    folder = cache_dir() / "variants" / key
    folder.mkdir(parents=True, exist_ok=True)
    paths, errors = {}, {}
    for variant in dict.fromkeys(["fp32", *variants]):
        target = folder / f"{variant}.onnx"
        try:
            if not target.exists():
                _write_atomically(target, lambda out: MAKERS[variant](model, out))
            paths[variant] = target
        except Exception as error:  # a converter's failure is a cell result, not a crash
            errors[variant] = f"{type(error).__name__}: {error}".splitlines()[0]
    return paths, errors


def _fp32(model: ModelInfo, out: Path) -> None:
    onnx.save(model.proto, str(out))


def _fp16(model: ModelInfo, out: Path) -> None:
    onnx.save(float16.convert_float_to_float16(model.proto, keep_io_types=True), str(out))


def _int8(model: ModelInfo, out: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "fp32.onnx"
        onnx.save(model.proto, str(source))
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # it advises pre-processing on every call
        try:
            quantize_dynamic(source, out, weight_type=QuantType.QUInt8)
        finally:
            logging.getLogger().setLevel(quiet)


def _write_atomically(target: Path, write) -> None:
    partial = target.with_suffix(".partial.onnx")
    started = time.perf_counter()
    write(partial)
    _sidecar(target).write_text(json.dumps({"conversion_s": time.perf_counter() - started}))
    partial.replace(target)


def conversion_seconds(variant_file: Path) -> float:
    """How long making this cached variant took when it was made (0 for the original fp32)."""
    try:
        return json.loads(_sidecar(variant_file).read_text())["conversion_s"]
    except (OSError, ValueError, KeyError):
        return 0.0


def _sidecar(variant_file: Path) -> Path:
    return variant_file.with_suffix(".json")


MAKERS = {"fp32": _fp32, "fp16": _fp16, "int8": _int8}
