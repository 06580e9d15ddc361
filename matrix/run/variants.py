"""ONNX precision variants: each made on its own, cached by the hash of its bytes.

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
cell: Gemm bound to mixed types; a graph that starts with a float `Cast`, as
SB3's legacy export and skl2onnx write, gets float32 data into float16 nodes),
so fp16 is tried with kept I/O types first, then fully converted with the
interface restored by explicit Casts, then in mixed precision: the nodes it
cannot convert (float-producing Casts first, then each node the checker or ORT
names) stay float32 through the converter's `node_block_list`, and the variant
says which (`kept_fp32`). A variant that still fails is the tool's problem: its
cells are skipped with the reason, never failed on a runtime's account, and so is
an fp16 file holding no float16 weight the original did not (a float64 model). An int8
file in which nothing was quantized is not int8 either (`quantization`). A model its user already made fp16
or int8 is not converted again (`NothingToMake`): its fp32 cell is that model as given, and not making the
variant is the run's decision, not the tool failing; its reason starts with "not made: " (`split_errors`), so
the run and the report say it as a note, never under the tool's failure banner. An int8 model gets no fp16
variant either: it computes below fp16 already (and a QDQ model before opset 19 cannot even be halved:
DequantizeLinear takes float32 scales only there, and the converter's search failed on it under the failure banner).

A run makes fp32 itself (a copy of the loaded model: nothing is evaluated) and
each other variant in its own guarded process (`produce_guarded`, see
matrix.run.guarded): checking a variant loads it in ONNX Runtime, which folds
constants while it loads, so each gets the cells' timeout and memory cap, and a
crash making fp16 costs fp16 only.

The cache (under POLICY_MATRIX_CACHE) is content-addressed: an entry is
`VARIANT-SHA256.onnx` plus an index naming that hash, both staged under unique
names and renamed into place, and the bytes are hashed again on every use. Runs
sharing one cache never see each other's half-written files; a cached file that
was replaced or corrupted is rebuilt, never run. A run's cells use its own copy
of the verified bytes (in the run folder), so nothing another run does to the
cache reaches them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import onnx

from . import guarded
from ..inputs import model as model_loader
from ..inputs.graph_facts import PER_CALL_QUANTIZING_OPS, QUANTIZED_OPS, computes_in, subgraphs, weight_types
from ..inputs.model import ModelInfo
from ..outdir import write_atomic, write_atomic_with
from targets.base import NOT_MADE
from targets.paths import cache_dir

RECIPE = "fp16-in-float16-range-keep-io-cast-io-or-blocked-halved-own-shapes-none-of-int8/int8-dynamic-u8u8-beyond-own/validated"  # part of the cache key: change it when a recipe changes
MAX_BLOCKED_NODES = 8  # how many nodes the fp16 mixed-precision search keeps in fp32 before it gives up


@dataclass(frozen=True)
class Made:
    """A variant's bytes as verified against its cache entry, and how it was made."""

    content: bytes
    conversion_s: float
    kept_fp32: tuple[str, ...] = ()  # nodes left in float32: by the fp16 converter, or excluded from int8 quantization
    shipped_bytes: int | None = None  # the original's: the user's files, not this re-serialized copy

    def write(self, path: Path) -> Path:
        """This run's own copy, with its sidecar (conversion time, nodes kept in fp32, the size that ships)."""
        write_atomic_with(path, lambda stream: stream.write(self.content))
        write_atomic(_sidecar(path), json.dumps({"conversion_s": self.conversion_s, "kept_fp32": list(self.kept_fp32),
                                                 "shipped_bytes": self.shipped_bytes or len(self.content)}))
        return path


def produce_all(model: ModelInfo, variants: list[str], folder: Path, keep_fp32: tuple[str, ...] = ()) -> tuple[dict[str, Path], dict[str, str]]:
    """Make each variant in this process into `folder`: the paths of those made, the tool's words for the others."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, errors = {}, {}
    for variant in dict.fromkeys(["fp32", *variants]):
        try:
            paths[variant] = made(model, variant, keep_fp32).write(folder / f"{variant}.onnx")
        except Exception as error:  # a converter's failure is the tool's problem, reported once
            errors[variant] = _variant_error(variant, error)
    return paths, errors


def produce_guarded(model: ModelInfo, variants: list[str], folder: Path, limits: guarded.Limits,
                    keep_fp32: tuple[str, ...] = ()) -> tuple[dict[str, Path], dict[str, str]]:
    """fp32 here, every other variant in its own guarded step: a step that dies costs its variant, with why."""
    paths, errors = produce_all(model, [], folder)
    for variant in dict.fromkeys(v for v in variants if v != "fp32"):
        spec = {"model": str(model.path.resolve()), "variant": variant, "keep_fp32": list(keep_fp32),
                "out": str((folder / f"{variant}.onnx").resolve())}
        try:
            answer = guarded.run("variant", spec, folder / f"{variant}-step", limits)
        except guarded.StepFailed as error:
            errors[variant] = f"making the {variant} variant did not finish: {error}"
            continue
        if answer["error"]:  # a converter that ran out of memory under the cap says so in its own words
            errors[variant] = guarded.name_out_of_memory(answer["error"], limits.memory_limit)
        else:
            paths[variant] = Path(answer["path"])
    return paths, errors


def guarded_step(spec: dict, folder: Path) -> dict:
    variant = spec["variant"]
    try:
        path = made(model_loader.load(Path(spec["model"])), variant, tuple(spec["keep_fp32"])).write(Path(spec["out"]))
    except Exception as error:  # the converter's words, reported once
        return {"path": "", "error": _variant_error(variant, error)}
    return {"path": str(path), "error": ""}


def _variant_error(variant: str, error: Exception) -> str:
    if isinstance(error, NothingToMake):
        return f"{NOT_MADE}{error}"
    if isinstance(error, VariantError):
        return str(error)
    return f"{variant} conversion failed: {type(error).__name__}: {error}".splitlines()[0]


def split_errors(errors: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the variants the tool failed to make, those it had nothing to make for), each with its reason."""
    failed = {variant: why for variant, why in errors.items() if not why.startswith(NOT_MADE)}
    return failed, {variant: why for variant, why in errors.items() if variant not in failed}


# --- the content-addressed cache -----------------------------------------------------------


def made(model: ModelInfo, variant: str, keep_fp32: tuple[str, ...] = ()) -> Made:
    """The variant's verified bytes: from the cache when its entry's hash matches, else made and cached."""
    if variant == "fp32":  # the original is what it is: runtimes judge it, nothing is converted
        return Made(model.proto.SerializeToString(), 0.0, shipped_bytes=model.shipped_bytes)
    folder = _entry_folder(model, variant, keep_fp32)
    return _cached(folder, variant) or _make(model, variant, keep_fp32, folder)


def _entry_folder(model: ModelInfo, variant: str, keep_fp32: tuple[str, ...]) -> Path:
    import onnxruntime  # only where a variant is made (a guarded step): the runner itself never loads ORT

    tools = f"{RECIPE}/{onnxruntime.__version__}/{version('onnxconverter-common')}/{onnx.__version__}"
    key = hashlib.sha256(json.dumps([model.sha256, tools, variant, sorted(keep_fp32)]).encode()).hexdigest()[:24]
    folder = cache_dir() / "variants" / key
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _cached(folder: Path, variant: str) -> Made | None:
    """The entry whose bytes still hash to what its index says, or None (absent, replaced, corrupted: rebuilt)."""
    try:
        index = json.loads((folder / f"{variant}.json").read_text())
        digest = index["sha256"]
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            return None
        content = (folder / f"{variant}-{digest}.onnx").read_bytes()
        if hashlib.sha256(content).hexdigest() != digest:
            return None
        return Made(content, float(index["conversion_s"]), tuple(str(n) for n in index["kept_fp32"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _make(model: ModelInfo, variant: str, keep_fp32: tuple[str, ...], folder: Path) -> Made:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{variant}-") as staging:  # unique per process: no shared partial name
        out = Path(staging) / f"{variant}.onnx"
        kept = MAKERS[variant](model, out, keep_fp32)
        content = out.read_bytes()
    validate(model.proto, onnx.load_from_string(content), variant)
    result = Made(content, time.perf_counter() - started, tuple(kept))
    digest = hashlib.sha256(content).hexdigest()
    write_atomic_with(folder / f"{variant}-{digest}.onnx", lambda stream: stream.write(content))
    write_atomic(folder / f"{variant}.json", json.dumps(
        {"sha256": digest, "conversion_s": result.conversion_s, "kept_fp32": list(result.kept_fp32)}))
    return result


def conversion_seconds(variant_file: Path) -> float:
    """How long making this variant took when it was made (0 for the original fp32)."""
    return float(_sidecar_field(variant_file, "conversion_s", 0.0))


def shipped_bytes(variant_file: Path) -> int:
    """The size a user ships for this variant: the original's files for fp32 (model and external data), else the file."""
    return int(_sidecar_field(variant_file, "shipped_bytes", variant_file.stat().st_size))


def kept_fp32(variant_file: Path) -> list[str]:
    """The nodes an fp16 variant keeps in float32 (mixed precision), [] for a whole conversion."""
    return [str(name) for name in _sidecar_field(variant_file, "kept_fp32", [])]


def notes(variant: str, variant_file: Path) -> list[str]:
    """What a cell shows about how its variant was made: the nodes kept in fp32, by name."""
    kept = kept_fp32(variant_file)
    if not kept:
        return []
    how = "mixed precision: the converter could not make the whole graph fp16" if variant == "fp16" else "excluded from quantization"
    return [f"{variant} variant with {', '.join(kept)} kept in fp32 ({how})"]


def _sidecar_field(variant_file: Path, field: str, default):
    try:
        return json.loads(_sidecar(variant_file).read_text())[field]
    except (OSError, ValueError, KeyError, TypeError):
        return default


def _sidecar(variant_file: Path) -> Path:
    return variant_file.with_suffix(".json")


# --- the makers ----------------------------------------------------------------------------


def _fp16(model: ModelInfo, out: Path, keep_fp32: tuple[str, ...]) -> list[str]:
    """Whole if the converter can, else with the fewest nodes it names kept in fp32; the nodes kept."""
    precision, evidence = computes_in(model.proto)
    if precision == "fp16":  # onnxconverter-common refuses any graph holding float16, in its own words
        raise NothingToMake(f"fp16 conversion converted nothing to float16 beyond the model's own ({evidence}): the fp32 "
                           "variant is that fp16 model as given")
    if precision == "int8":  # halving what an int8 graph keeps in float makes no fp16 policy of it
        raise NothingToMake(f"the model is already int8 ({evidence}), below fp16, so fp16 conversion is not tried: the "
                           "fp32 variant is that int8 model as given")
    source = named_nodes(model.proto)
    blocked, first_error = list(keep_fp32), None
    for _ in range(MAX_BLOCKED_NODES + 2):
        converted, error = _convert_fp16(model.proto, source, blocked)
        if converted is not None:
            _check_halved(model.proto, converted)
            onnx.save(converted, str(out))
            return blocked
        first_error = first_error or error
        more = _nodes_to_block(source, blocked, error)
        if not more or len(blocked) + len(more) > MAX_BLOCKED_NODES:
            break
        blocked += more
    if blocked:
        raise VariantError(f"{_first_line(first_error)} (also with {', '.join(blocked)} kept in fp32)") from None
    raise first_error


def _check_halved(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """An fp16 variant holds float16 weights the original did not: the converter leaves float64 (skl2onnx's
    DoubleTensorType, a torch .double() module) as it is, and that file would be the original named fp16."""
    before, after = weight_types(original), weight_types(converted)
    if after["float16"] <= before["float16"]:
        held = ", ".join(f"{count} {dtype}" for dtype, count in sorted(after.items())) or "none"
        raise VariantError(f"fp16 conversion converted nothing to float16 (weights: {held}): this would be the model "
                           "as given named fp16")


# The converter clamps constants to float16's own range, not to its defaults (+-1e4, 1e-7): a 2e4 scale, which
# float16 holds exactly, became 1e4 and halved the action (drift 0.63 against 4.5e-4 for the model in float16), a
# FAIL of every runtime's fp16 cell that was the conversion's doing. What float16 cannot hold is still clamped.
FLOAT16_RANGE = {"max_finite_val": 65504.0, "min_positive_val": 2.0 ** -24}  # its largest finite value, smallest subnormal


def _convert_fp16(original: onnx.ModelProto, source: onnx.ModelProto, blocked: list[str]):
    """(the valid fp16 graph, None), or (None, why not) after both interface routes."""
    from onnxconverter_common import float16

    first_error = None
    for keep_io_types in (True, False):
        try:
            converted = float16.convert_float_to_float16(source, keep_io_types=keep_io_types, node_block_list=blocked or None,
                                                         **FLOAT16_RANGE)
            converted = restore_interface(original, without_added_shapes(original, converted))
            validate(original, converted, "fp16")
            return converted, None
        except Exception as error:  # the converter's own bugs raise anything; try the other route
            first_error = first_error or error
    return None, first_error


FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE}


def _nodes_to_block(source: onnx.ModelProto, blocked: list[str], error: Exception) -> list[str]:
    """Which nodes to keep in fp32 next: the Casts to a float type (the converter leaves their `to`,
    so float32 flows into fp16 nodes), else the node the checker or ORT names in its error."""
    casts = [n.name for n in source.graph.node if n.op_type == "Cast" and n.name not in blocked
             and any(a.name == "to" and a.i in FLOAT_TYPES for a in n.attribute)]
    if casts:
        return casts
    names = {n.name for n in source.graph.node}
    named = re.findall(r"node name: ([^)\s]+)\)|node \(([^)]+)\)", str(error))
    return [name for pair in named for name in pair if name in names and name not in blocked][:1]


def named_nodes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose unnamed nodes have unique names: onnxconverter-common keys nodes by name
    and corrupts graphs whose nodes share the empty name (many exporters leave names empty)."""
    named = onnx.ModelProto()
    named.CopyFrom(proto)
    for index, node in enumerate(named.graph.node):
        node.name = node.name or f"policy_matrix_{node.op_type}_{index}"
    return named


def node_name(proto: onnx.ModelProto, name_or_output: str) -> str | None:
    """The name the makers' block lists use for the node called `name_or_output` or writing that tensor
    (a node without a name is known by its output: --diagnose names it so), or None."""
    for node in named_nodes(proto).graph.node:
        if name_or_output == node.name or name_or_output in node.output:
            return node.name
    return None


def _int8(model: ModelInfo, out: Path, keep_fp32: tuple[str, ...]) -> list[str]:
    """ORT dynamic quantization, the `keep_fp32` nodes excluded; the nodes kept."""
    # Imported here, not at the top: cell workers import this module for its file helpers, and a worker
    # pinned to an older onnxruntime (targets/versions.py) has a quantization package that needs sympy.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "fp32.onnx"
        onnx.save(named_nodes(model.proto), str(source))  # the names fp16's block list uses
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # it advises pre-processing on every call
        try:
            quantize_dynamic(source, out, weight_type=QuantType.QUInt8, nodes_to_exclude=list(keep_fp32))
        finally:
            logging.getLogger().setLevel(quiet)
    counted, own = quantization(onnx.load(str(out))), quantization(model.proto)
    if counted["quantized_ops"] <= own["quantized_ops"] and counted["quantized_weights"] <= own["quantized_weights"]:
        out.unlink()
        if own["quantized_ops"] or own["quantized_weights"]:  # a user's int8 model: its as-given cell is the int8 one
            raise NothingToMake(
                f"dynamic quantization quantized nothing beyond the model's own ({own['quantized_ops']} quantized ops, "
                f"{own['quantized_weights']} 8-bit weight tensors): the fp32 variant is that int8 model as given")
        raise VariantError(
            f"dynamic quantization quantized nothing ({counted['float_ops']} weight ops and "
            f"{counted['float_weights']} weight tensors stayed float): this would be the model as given named int8"
        )
    return list(keep_fp32)


class VariantError(Exception):
    """The tool could not make a variant that keeps the model's interface and validity."""


class NothingToMake(VariantError):
    """The model as given already computes in this variant's precision: the run does not make it (a decision)."""


def validate(original: onnx.ModelProto, variant: onnx.ModelProto, name: str) -> None:
    """Full checker, an ORT load, and the original's input/output names, shapes and dtypes."""
    import onnxruntime

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


def without_added_shapes(original: onnx.ModelProto, variant: onnx.ModelProto) -> onnx.ModelProto:
    """The variant declaring only the intermediate shapes the original declared. onnxconverter-common runs shape
    inference and keeps what it infers (unk__N dims) and copies the output's declared shape onto the Cast it inserts
    before it; where the exporter only guessed that shape (torch's `[batch, Whereaction_dim_1]` on an SB3 actor's
    torch.where), a runtime that takes every declaration as a fact (tract: "Impossible to unify
    Sym(Whereaction_dim_1) with Val(1)") refuses the variant although it loads the original."""
    declared = {value.name for value in original.graph.value_info}
    kept = [value for value in variant.graph.value_info if value.name in declared]
    del variant.graph.value_info[:]
    variant.graph.value_info.extend(kept)
    return variant


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


WEIGHT_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "Attention", "Einsum"}
INTEGER_WEIGHT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4, onnx.TensorProto.UINT4}


def quantization(proto: onnx.ModelProto) -> dict[str, int]:
    """What an "int8" ONNX file really holds: quantized ops and 8-bit weight tensors, what stayed float, and the ops
    that scale activations per call (dynamic int8; a static QDQ file's scales are fixed), counted in every graph
    (If/Loop/Scan bodies too) and in Constant nodes as well as initializers."""
    nodes = [node for graph in subgraphs(proto.graph) for node in graph.node]
    tensors = [*(t for graph in subgraphs(proto.graph) for t in graph.initializer),
               *(a.t for n in nodes for a in n.attribute if a.type == onnx.AttributeProto.TENSOR)]
    weights = [t for t in tensors if len(t.dims) >= 2]  # scales, zero points and biases are not weights
    return {
        "quantized_ops": sum(n.op_type in QUANTIZED_OPS for n in nodes),
        "float_ops": sum(n.op_type in WEIGHT_OPS for n in nodes),
        "quantized_weights": sum(t.data_type in INTEGER_WEIGHT_TYPES for t in weights),
        "float_weights": sum(t.data_type not in INTEGER_WEIGHT_TYPES for t in weights),
        "per_call_ops": sum(n.op_type in PER_CALL_QUANTIZING_OPS for n in nodes),
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


MAKERS = {"fp16": _fp16, "int8": _int8}
