"""ONNX precision variants, made once per model and cached by content hash.

fp16 keeps float32 inputs and outputs (onnxconverter-common, keep_io_types) so
the same observations feed every variant; int8 is ONNX Runtime's dynamic
quantization (8-bit weights, activations quantized per call). Weights are
unsigned (U8U8): with signed weights ORT's x86 kernels can saturate on CPUs
without VNNI (its quantization docs say so); measured here on the bundled MLP,
max drift 0.27 with S8 weights against 0.04 with U8. Targets with their
own converters (onnx2tf, coremltools) start from fp32 and make their own.

Every variant is checked before any cell uses it (`validate`): the full ONNX
checker, an ONNX Runtime load, and the same input/output names, shapes and
dtypes as the original. onnxconverter-common can change the interface (an
output ending in Min/Max became float16) or emit an invalid graph (a recurrent
cell: Gemm bound to mixed types), so fp16 is tried with kept I/O types first,
then fully converted with the interface restored by explicit Casts. A variant
that still fails is the tool's problem: its cells are skipped with the reason,
never failed on a runtime's account. An int8 file in which nothing was
quantized is not int8 either (`quantization`).

A run makes them in a guarded process (`produce_guarded`, see matrix.guarded):
the check loads each variant in ONNX Runtime, which folds constants while it
loads, so it gets the cells' timeout and memory cap.
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

from . import guarded
from . import model as model_loader
from .model import ModelInfo
from .paths import cache_dir

RECIPE = "fp16-named-keep-io-or-cast-io/int8-dynamic-u8u8/validated"  # part of the cache key: change it when a recipe changes


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
            if variant != "fp32":  # the original is what it is: runtimes judge it
                validate(model.proto, onnx.load(str(target)), variant)
            paths[variant] = target
        except VariantError as error:
            errors[variant] = str(error)
        except Exception as error:  # a converter's failure is the tool's problem, reported once
            errors[variant] = f"{variant} conversion failed: {type(error).__name__}: {error}".splitlines()[0]
    return paths, errors


def produce_guarded(model: ModelInfo, variants: list[str], folder: Path, limits: guarded.Limits) -> tuple[dict[str, Path], dict[str, str]]:
    """`produce_all` in a guarded process; a step that dies leaves every variant unmade, with why."""
    try:
        answer = guarded.run("variants", {"model": str(model.path.resolve()), "variants": variants}, folder, limits)
    except guarded.StepFailed as error:
        return {}, {variant: f"making the variants did not finish: {error}" for variant in dict.fromkeys(["fp32", *variants])}
    return {k: Path(v) for k, v in answer["paths"].items()}, answer["errors"]


def guarded_step(spec: dict, folder: Path) -> dict:
    paths, errors = produce_all(model_loader.load(Path(spec["model"])), spec["variants"])
    return {"paths": {k: str(v) for k, v in paths.items()}, "errors": errors}


def _fp32(model: ModelInfo, out: Path) -> None:
    onnx.save(model.proto, str(out))


def _fp16(model: ModelInfo, out: Path) -> None:
    first_error = None
    source = named_nodes(model.proto)
    for keep_io_types in (True, False):
        try:
            converted = restore_interface(model.proto, float16.convert_float_to_float16(source, keep_io_types=keep_io_types))
            validate(model.proto, converted, "fp16")
        except Exception as error:  # the converter's own bugs raise anything; try the other route
            first_error = first_error or error
            continue
        onnx.save(converted, str(out))
        return
    raise first_error


def named_nodes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose unnamed nodes have unique names: onnxconverter-common keys nodes by name
    and corrupts graphs whose nodes share the empty name (many exporters leave names empty)."""
    named = onnx.ModelProto()
    named.CopyFrom(proto)
    for index, node in enumerate(named.graph.node):
        node.name = node.name or f"policy_matrix_{node.op_type}_{index}"
    return named


def _int8(model: ModelInfo, out: Path) -> None:
    # Imported here, not at the top: cell workers import this module for its file helpers, and a worker
    # pinned to an older onnxruntime (targets/versions.py) has a quantization package that needs sympy.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "fp32.onnx"
        onnx.save(model.proto, str(source))
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # it advises pre-processing on every call
        try:
            quantize_dynamic(source, out, weight_type=QuantType.QUInt8)
        finally:
            logging.getLogger().setLevel(quiet)
    counted = quantization(onnx.load(str(out)))
    if not counted["quantized_ops"]:
        out.unlink()
        raise VariantError(
            f"dynamic quantization quantized nothing ({counted['float_ops']} weight ops and "
            f"{counted['float_weights']} weight tensors stayed float): this would be the fp32 model named int8"
        )


class VariantError(Exception):
    """The tool could not make a variant that keeps the model's interface and validity."""


def validate(original: onnx.ModelProto, variant: onnx.ModelProto, name: str) -> None:
    """Full checker, an ORT load, and the original's input/output names, shapes and dtypes."""
    try:
        onnx.checker.check_model(variant, full_check=True)
    except Exception as error:
        raise VariantError(f"{name} variant is not valid ONNX: {_first_line(error)}") from None
    for kind, before, after in (("input", _inputs(original), _inputs(variant)), ("output", original.graph.output, variant.graph.output)):
        expected, found = [_signature(v) for v in before], [_signature(v) for v in after]
        if expected != found:
            raise VariantError(f"{name} variant changed the model's {kind}s: {_describe(found)} instead of {_describe(expected)}")
    try:
        onnxruntime.InferenceSession(variant.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:
        raise VariantError(f"{name} variant does not load in onnxruntime: {_first_line(error)}") from None


def restore_interface(original: onnx.ModelProto, variant: onnx.ModelProto) -> onnx.ModelProto:
    """Put back the original input/output dtypes with explicit Casts where a converter changed them."""
    graph = variant.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*_inputs(original), *original.graph.output]}
    for value in _inputs(variant):
        declared, now = types.get(value.name), value.type.tensor_type.elem_type
        if declared is not None and declared != now:
            inner = f"{value.name}__as_converted"
            for node in graph.node:
                node.input[:] = [inner if name == value.name else name for name in node.input]
            graph.node.insert(0, onnx.helper.make_node("Cast", [value.name], [inner], to=now))
            value.type.tensor_type.elem_type = declared
    for value in graph.output:
        declared, now = types.get(value.name), value.type.tensor_type.elem_type
        if declared is not None and declared != now:
            inner = f"{value.name}__as_converted"
            for node in graph.node:
                node.output[:] = [inner if name == value.name else name for name in node.output]
                node.input[:] = [inner if name == value.name else name for name in node.input]
            graph.node.append(onnx.helper.make_node("Cast", [inner], [value.name], to=declared))
            value.type.tensor_type.elem_type = declared
    return variant


QUANTIZED_OPS = {
    "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "DynamicQuantizeLSTM", "QGemm", "QAttention", "QLinearAdd", "QLinearMul",
}
WEIGHT_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "Attention", "Einsum"}
INTEGER_WEIGHT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4, onnx.TensorProto.UINT4}


def quantization(proto: onnx.ModelProto) -> dict[str, int]:
    """What an "int8" ONNX file really holds: quantized ops and 8-bit weight tensors, and what stayed float."""
    nodes = list(proto.graph.node)
    tensors = [*proto.graph.initializer, *(a.t for n in nodes for a in n.attribute if a.type == onnx.AttributeProto.TENSOR)]
    weights = [t for t in tensors if len(t.dims) >= 2]  # scales, zero points and biases are not weights
    return {
        "quantized_ops": sum(n.op_type in QUANTIZED_OPS for n in nodes),
        "float_ops": sum(n.op_type in WEIGHT_OPS for n in nodes),
        "quantized_weights": sum(t.data_type in INTEGER_WEIGHT_TYPES for t in weights),
        "float_weights": sum(t.data_type not in INTEGER_WEIGHT_TYPES for t in weights),
    }


def _inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in proto.graph.initializer}
    return [v for v in proto.graph.input if v.name not in initializers]


def _signature(value: onnx.ValueInfoProto) -> tuple:
    tensor = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
    return value.name, onnx.TensorProto.DataType.Name(tensor.elem_type).lower(), dims


def _describe(signatures: list[tuple]) -> str:
    return ", ".join(f"{name} {dtype} {list(dims)}" for name, dtype, dims in signatures)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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
