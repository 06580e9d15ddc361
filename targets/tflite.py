"""TFLite / LiteRT: onnx2tf converts the policy, the LiteRT interpreter runs it.

Conversion happens in onnx2tf's own virtual environment (its pins clash with
the core: old onnx, numpy 1.26, protobuf 4) through targets/tflite_convert.py,
files in and JSON out. Converted files are cached under ctx.cache_dir keyed by
the ONNX bytes, the converter environment and the recipe, so repeated runs
reuse them. Running needs only `ai-edge-litert` in the main environment.

Variants (all converted from the fp32 ONNX model; onnx2tf makes its own
reduced-precision files rather than translating the ORT ones):
  fp32  onnx2tf float32 file
  fp16  onnx2tf float16 file: fp16 weights, dequantized at load, float32 I/O
  int8  dynamic-range quantization: int8 weights, float activations
The `tflite-int8-full` target has only int8: full integer quantization
(int8 weights and activations, float32 I/O) calibrated on the run's
observation set.

Two interpreter configurations are separate targets so the report shows
whether the XNNPACK delegate changes numbers or speed: `tflite` (LiteRT's
default, XNNPACK) and `tflite-noxnn` (builtin kernels only).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx

from . import isolated_env
from .base import NO_SETTINGS, Artifact, BackendInfo, Feeds, Knob, PlacementRow, PrepareContext, Session, Settings, Target
from .versions import PipRelease

REQUIREMENTS = Path(__file__).parent / "requirements" / "onnx2tf.txt"
CONVERT_SCRIPT = Path(__file__).parent / "tflite_convert.py"
ENV_NAME = "onnx2tf"
# Pinned LiteRT releases (`tflite@2.2.0`), measured on the bundled MLP: 1.0.0 has no schema_py_generated
# (the op inventory reads it), 1.1.0's Interpreter does not start here ("no attribute '_interpreter'").
LITERT_FLOOR = "1.2.0"
LITERT_FLOOR_WHY = "1.0 lacks schema_py_generated and 1.1's Interpreter does not start beside this project's packages"
# Bump when the conversion flags in tflite_convert.py change, so cached files are rebuilt.
RECIPE_REVISION = "2"  # 2: entries keep the files that were made and say why others are missing
CONVERT_TIMEOUT_S = 900
# Calibration samples for full-integer quantization: TF calibrates one sample at a time.
MAX_CALIBRATION_SAMPLES = 128
RECIPE_FILES = {"dynamic": ("fp32", "fp16", "int8"), "full": ("int8-full",)}
XNNPACK = "XNNPACK"
BUILTIN = "builtin kernels"


def litert_version() -> str | None:
    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return None


def converter_pin() -> str:
    """'onnx2tf 1.29.24' from the requirements file, without starting the environment."""
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("onnx2tf=="):
            return "onnx2tf " + line.split("==", 1)[1].strip()
    return "onnx2tf"


class TfliteTarget(Target):
    name = "tflite"
    summary = "onnx2tf -> LiteRT interpreter, XNNPACK delegate (LiteRT's default)"
    xnnpack: ClassVar[bool] = True
    # Which conversion produces this target's files: "dynamic" (fp32/fp16/int8 dynamic-range)
    # or "full" (full-integer int8 calibrated on the observation set).
    recipe: ClassVar[str] = "dynamic"
    # `tflite@2.2.0` runs another LiteRT on the same converted file (targets/versions.py)
    release = PipRelease("ai-edge-litert", floor=LITERT_FLOOR, why_floor=LITERT_FLOOR_WHY)
    knobs = {
        "threads": Knob("Interpreter(num_threads=...) (default: --threads)"),
        # The same switch as the tflite-noxnn target, as a grid axis of this one (tflite-noxnn stays a
        # target of its own: earlier results and --targets globs name it).
        "xnnpack": Knob("XNNPACK delegate on (LiteRT's default) or off (builtin kernels only)", ("on", "off")),
    }

    def runtime_version(self) -> str:
        return f"ai-edge-litert {litert_version() or 'missing'} ({converter_pin()})"

    def unavailable_reason(self) -> str | None:
        if litert_version() is None:
            return "ai-edge-litert is not installed: run `policy-matrix setup tflite`"
        if isolated_env.env_python(ENV_NAME, REQUIREMENTS) is None:
            if not sys.platform.startswith("linux"):
                return "the onnx2tf conversion environment installs on Linux only (its ai-edge-litert==2.1.0 pin has no wheel here)"
            return "needs setup: run `policy-matrix setup tflite` (builds the onnx2tf environment once, about 2.6 GB, ~2 min)"
        return None

    def prepare(self, ctx: PrepareContext, variant: str) -> Artifact:
        model = ctx.onnx_variant("fp32")  # onnx2tf makes its own fp16/int8 files from fp32
        entry, fresh = converted(ctx, model, self.recipe)
        meta = json.loads((entry / "meta.json").read_text())
        file_variant = variant if self.recipe == "dynamic" else "int8-full"
        if file_variant in meta.get("missing", {}):  # this cell only: its siblings have their files
            raise RuntimeError(meta["missing"][file_variant])
        path = entry / f"{file_variant}.tflite"
        onnx_io = onnx_interface(model)
        artifact = Artifact(
            path=path,
            conversion_s=meta["seconds"],
            op_inventory=op_inventory(path.read_bytes()),
            quantization=quantization(path.read_bytes()) if variant == "int8" else None,
            notes=[f"converted by {meta['converter']}" + ("" if fresh else " (cached)")],
            extra={"layers": original_node_names(meta["layers"], onnx_io["node_order"]), **onnx_io},
        )
        artifact.notes += variant_notes(variant, self.recipe, artifact.quantization) + layout_notes(onnx_io, artifact.op_inventory)
        artifact.notes += flex_notes(artifact.op_inventory)
        return artifact

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        xnnpack = settings.get("xnnpack", "on" if self.xnnpack else "off") == "on"
        return TfliteSession(artifact, int(settings.get("threads", threads)), xnnpack)


class TfliteNoXnnpack(TfliteTarget):
    name = "tflite-noxnn"
    summary = "onnx2tf -> LiteRT interpreter, builtin kernels only (XNNPACK delegate off)"
    xnnpack = False
    knobs = {"threads": TfliteTarget.knobs["threads"]}  # XNNPACK is off by definition here


class TfliteInt8Full(TfliteTarget):
    name = "tflite-int8-full"
    summary = "onnx2tf full-integer int8 (calibrated on the observation set) -> LiteRT, XNNPACK"
    variants = ("int8",)
    recipe = "full"


# ---------------------------------------------------------------- conversion + cache


def build_environment() -> Path:
    """Build (once) the onnx2tf environment and return its interpreter: `policy-matrix setup tflite`."""
    return isolated_env.ensure_env(ENV_NAME, REQUIREMENTS)


def converted(ctx: PrepareContext, model: Path, recipe: str) -> tuple[Path, bool]:
    """The cache entry (a folder of .tflite files + meta.json) for this model and recipe,
    and whether this call made it."""
    calibration = calibration_set(ctx.calibration) if recipe == "full" else {}
    entry = ctx.cache_dir / "tflite" / cache_key(model, recipe, calibration)
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{entry}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # cells of one run convert the same model at once
        if (entry / "meta.json").exists():
            return entry, False
        answer = run_converter(ctx, model, recipe, calibration)
        store(entry, answer, RECIPE_FILES[recipe])
    return entry, True


def cache_key(model: Path, recipe: str, calibration: Feeds) -> str:
    digest = hashlib.sha256(model.read_bytes())
    digest.update(REQUIREMENTS.read_bytes())  # the converter version and its whole environment
    digest.update(f"{recipe}:{RECIPE_REVISION}".encode())
    for name in sorted(calibration):
        digest.update(name.encode() + calibration[name].tobytes() + str(calibration[name].shape).encode())
    return f"{recipe}-{digest.hexdigest()[:20]}"


def calibration_set(feeds: Feeds) -> Feeds:
    return {name: np.ascontiguousarray(array[:MAX_CALIBRATION_SAMPLES]) for name, array in feeds.items()}


def run_converter(ctx: PrepareContext, model: Path, recipe: str, calibration: Feeds) -> dict:
    python = build_environment()
    work = ctx.workdir / f"onnx2tf-{recipe}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # A private copy under a fixed name: onnx2tf rewrites its input file in place
    # (simplified, with its metadata) and names its outputs after it.
    source = work / "policy.onnx"
    shutil.copyfile(model, source)
    calibration_files = {}
    for index, (name, array) in enumerate(calibration.items()):
        calibration_files[name] = str(work / f"calibration{index}.npy")  # never a model string as a path
        np.save(calibration_files[name], array.astype(np.float32))
    request = {
        "onnx": str(source), "workdir": str(work), "out_dir": str(work / "out"), "quantize": recipe,
        "keep_nchw": image_like_inputs(source), "calibration": calibration_files,
    }
    answer = isolated_env.run_json(python, CONVERT_SCRIPT, request, CONVERT_TIMEOUT_S)
    if not answer["ok"]:
        raise RuntimeError(answer["error"])  # onnx2tf's own words: the worker makes it a FAIL cell
    return answer


def store(entry: Path, answer: dict, wanted: tuple[str, ...]) -> None:
    """Copy the files into the cache atomically: a half-written entry is never seen.

    A file the converter could not write is recorded with its reason, so only
    the cell that needs it fails; with none written, the conversion failed."""
    made = [name for name in wanted if name in answer["files"]]
    if not made:
        raise RuntimeError(f"onnx2tf wrote no {', '.join(wanted)} file (its log: {answer.get('log', 'n/a')})")
    staging = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name in made:
        shutil.copyfile(answer["files"][name], staging / f"{name}.tflite")
    meta = {key: answer[key] for key in ("seconds", "converter", "layers")}
    meta["missing"] = {
        name: answer.get("errors", {}).get(name) or f"onnx2tf wrote no {name} file" for name in wanted if name not in made
    }
    (staging / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(entry, ignore_errors=True)
    staging.rename(entry)


def image_like_inputs(model: Path) -> list[str]:
    """Inputs onnx2tf would turn NHWC: keep them NCHW so every target gets the same observations."""
    return [name for name, dims in onnx_interface(model)["onnx_inputs"].items() if 3 <= len(dims) <= 5]


def onnx_interface(model: Path) -> dict:
    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}

    def dims(value) -> list:
        return [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in value.type.tensor_type.shape.dim]

    producers = {output: node.name for node in graph.node for output in node.output}
    return {
        "onnx_inputs": {v.name: dims(v) for v in graph.input if v.name not in initializers},
        "onnx_outputs": {v.name: dims(v) for v in graph.output},
        "output_producers": {v.name: producers.get(v.name, v.name) for v in graph.output},
        "node_order": [node.name for node in graph.node],
    }


# ---------------------------------------------------------------- inspection of a .tflite file


def op_inventory(content: bytes) -> dict[str, int]:
    """TFLite op counts read from the flatbuffer (works for files the interpreter cannot prepare)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    model = schema.Model.GetRootAsModel(content, 0)
    codes = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        custom = code.CustomCode()
        codes.append(custom.decode() if builtin == schema.BuiltinOperator.CUSTOM and custom else names.get(builtin, str(builtin)))
    counts: dict[str, int] = {}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for o in range(subgraph.OperatorsLength()):
            name = codes[subgraph.Operators(o).OpcodeIndex()]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def variant_notes(variant: str, recipe: str, counted: dict | None = None) -> list[str]:
    """What the file is, stated from what it holds (`counted`), not from the recipe's name."""
    if variant == "int8" and counted is not None and not counted["quantized_weights"]:
        return [f"int8 in name only: the quantizer left all {counted['float_weights']} weight tensors float "
                "(TF's dynamic-range quantization skips small tensors)"]
    if recipe == "full":
        return [f"full-integer int8 (weights and activations), float32 I/O, calibrated on up to "
                f"{MAX_CALIBRATION_SAMPLES} observations"]
    return {
        "fp32": [],
        "fp16": ["fp16 weights dequantized to float32 at load; compute and I/O in float32"],
        "int8": ["dynamic-range int8: int8 weights, activations quantized per call, float32 I/O"],
    }[variant]


WEIGHT_OPS = {"FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL", "TRANSPOSE_CONV", "UNIDIRECTIONAL_SEQUENCE_LSTM"}


def quantization(content: bytes) -> dict[str, int]:
    """Weight ops whose weights are 8-bit, and constant weight tensors (rank >= 2) by type."""
    from ai_edge_litert import schema_py_generated as schema

    integer = {schema.TensorType.INT8, schema.TensorType.UINT8, schema.TensorType.INT4}
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    model = schema.Model.GetRootAsModel(content, 0)
    opcodes = [names.get(max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode()))
               for i in range(model.OperatorCodesLength())]
    counted = {"quantized_ops": 0, "float_ops": 0, "quantized_weights": 0, "float_weights": 0}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        constant = {
            t for t in range(subgraph.TensorsLength())
            if _holds_data(model.Buffers(subgraph.Tensors(t).Buffer())) and subgraph.Tensors(t).ShapeLength() >= 2
        }
        for t in constant:
            counted["quantized_weights" if subgraph.Tensors(t).Type() in integer else "float_weights"] += 1
        for o in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(o)
            if opcodes[op.OpcodeIndex()] in WEIGHT_OPS and op.InputsLength() > 1:
                weight = op.Inputs(1)
                quantized = weight in constant and subgraph.Tensors(weight).Type() in integer
                counted["quantized_ops" if quantized else "float_ops"] += 1
    return counted


def _holds_data(buffer) -> bool:
    return buffer is not None and (buffer.DataLength() > 0 or buffer.Offset() > 1)


def flex_notes(inventory: dict[str, int]) -> list[str]:
    flex = sorted(op for op in inventory if op.startswith("Flex"))
    if not flex:
        return []
    return [f"Select TF (Flex) ops {', '.join(flex)}: the LiteRT interpreter has no Flex delegate and cannot run them"]


def layout_notes(onnx_io: dict, inventory: dict[str, int]) -> list[str]:
    """Say so when the converter changed a layout (inputs kept NCHW still compute in NHWC)."""
    notes = []
    image_inputs = [name for name, dims in onnx_io["onnx_inputs"].items() if 3 <= len(dims) <= 5]
    if image_inputs and inventory.get("TRANSPOSE"):
        notes.append(f"inputs {', '.join(image_inputs)} kept NCHW; onnx2tf computes in NHWC and inserted "
                     f"{inventory['TRANSPOSE']} TRANSPOSE op(s)")
    return notes


# ---------------------------------------------------------------- running


class TfliteSession(Session):
    def __init__(self, artifact: Artifact, threads: int, xnnpack: bool):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        self.requested = XNNPACK if xnnpack else BUILTIN
        self.artifact = artifact
        # Flex (Select TF) ops fail here with LiteRT's own message: the cell FAILs with it.
        self.interpreter = Interpreter(
            model_path=str(artifact.path), num_threads=threads, experimental_op_resolver_type=resolver
        )
        self.interpreter.allocate_tensors()
        signature = self.interpreter._get_full_signature_list().get("serving_default") or unsigned(self.interpreter)
        self.inputs = map_signature(signature["inputs"], list(artifact.extra["onnx_inputs"]), "input_")
        self.outputs = map_signature(signature["outputs"], list(artifact.extra["onnx_outputs"]), "output_")
        self.output_permutations = output_permutations(self.interpreter, self.outputs, artifact.extra["onnx_outputs"])
        self.shapes = {name: self.interpreter.get_tensor(index).shape for name, index in self.inputs.items()}
        # onnx2tf may narrow an input's type (int64 -> int32); the observations keep the ONNX type.
        self.dtypes = {name: self.interpreter.get_tensor(index).dtype for name, index in self.inputs.items()}

    def _set_inputs(self, feeds: Feeds) -> None:
        """Resize when the batch changes: the file's batch is dynamic but allocated at 1."""
        interpreter = self.interpreter
        changed = {name: value.shape for name, value in feeds.items() if self.shapes.get(name) != value.shape}
        for name, shape in changed.items():
            interpreter.resize_tensor_input(self.inputs[name], shape, strict=False)
            self.shapes[name] = shape
        if changed:
            interpreter.allocate_tensors()
        for name, value in feeds.items():
            interpreter.set_tensor(self.inputs[name], value.astype(self.dtypes[name], copy=False))

    def _get_outputs(self) -> Feeds:
        get = self.interpreter.get_tensor
        outputs = {name: get(index) for name, index in self.outputs.items()}
        for name, permutation in self.output_permutations.items():
            outputs[name] = np.transpose(outputs[name], permutation)
        return outputs

    def run(self, feeds: Feeds) -> Feeds:
        self._set_inputs(feeds)
        self.interpreter.invoke()
        return self._get_outputs()

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        """Per call: copy inputs in, invoke, copy outputs out (what ORT's run() includes too).

        The two copies cost about 1.5 us through the Python API, which dominates a tiny
        MLP at batch 1 (bench/tflite_bench.py prints the ratio to a bare invoke() loop).
        """
        self._set_inputs(feeds)
        feeds = {name: value.astype(self.dtypes[name], copy=False) for name, value in feeds.items()}
        set_tensor, invoke, read, clock = self.interpreter.set_tensor, self.interpreter.invoke, self._get_outputs, time.perf_counter_ns
        fill = [(self.inputs[name], value) for name, value in feeds.items()]

        def call() -> None:
            for index, value in fill:
                set_tensor(index, value)
            invoke()
            read()

        for _ in range(warmup):
            call()
        samples = []
        for _ in range(iters):
            start = clock()
            call()
            samples.append(clock() - start)
        return samples

    def placement(self) -> list[PlacementRow]:
        ops = self.interpreter._get_ops_details()
        return placement_rows(ops, tensor_names(self.interpreter), self.artifact.extra, self.outputs, self.requested)

    def backend(self) -> BackendInfo:
        ops = self.interpreter._get_ops_details()
        delegated = delegated_ops(ops)
        builtin_ops = [op["op_name"] for op in ops if op["op_name"] != "DELEGATE" and op["index"] not in delegated]
        # One rule, whether XNNPACK took some ops or none: builtin kernels are LiteRT's own
        # per-op fallback, shown as fallback placement rows (a WARN), never a wrong backend.
        actual = self.requested
        detail = f"{len(delegated)} op(s) in XNNPACK, {len(builtin_ops)} on builtin kernels"
        if delegated and builtin_ops:
            detail += f" ({', '.join(sorted(set(builtin_ops)))})"
        return BackendInfo(requested=self.requested, actual=actual, detail=detail)

    def close(self) -> None:
        self.interpreter = None


def tf_spellings(onnx_name: str) -> list[str]:
    """How onnx2tf may respell an ONNX name: ':' becomes '__', and when it writes signatures
    or int8 files a leading '/' becomes 'wa/' (SavedModel refuses both)."""
    plain = onnx_name.replace(":", "__")
    return list(dict.fromkeys([onnx_name, plain, re.sub("^/", "wa/", plain)]))


def unsigned(interpreter) -> dict:
    """A file without a signature (onnx2tf writes none when its SavedModel step fails): its
    tensors are named Placeholder/Identity, in the model's input and output order."""
    return {
        "inputs": {f"input_{i}": d["index"] for i, d in enumerate(interpreter.get_input_details())},
        "outputs": {f"output_{i}": d["index"] for i, d in enumerate(interpreter.get_output_details())},
    }


def map_signature(signature: dict[str, int], onnx_names: list[str], renamed_prefix: str | None) -> dict[str, int]:
    """ONNX name -> tensor index. Signature keys are the ONNX names as onnx2tf spells them,
    except that TF's full-integer converter renames outputs output_0, output_1, ... in the
    model's output order, and a file without a signature is read in order (`unsigned`):
    then, and only then, the position decides."""
    found = {name: next((s for s in tf_spellings(name) if s in signature), None) for name in onnx_names}
    if all(found.values()) and len(signature) == len(onnx_names):
        return {name: signature[key] for name, key in found.items()}
    positional = {f"{renamed_prefix}{i}": name for i, name in enumerate(onnx_names)} if renamed_prefix else {}
    if positional and set(signature) == set(positional):
        return {positional[key]: index for key, index in signature.items()}
    raise RuntimeError(f"cannot map the .tflite signature {sorted(signature)} to the ONNX names {onnx_names}")


def original_node_names(layers: dict[str, list[str]], node_order: list[str]) -> dict[str, list[str]]:
    """Key the recorded layers by the ONNX node names, undoing onnx2tf's respelling."""
    original = {spelling: name for name in node_order for spelling in tf_spellings(name)}
    return {original.get(name, name): names for name, names in layers.items()}


def output_permutations(interpreter, outputs: dict[str, int], onnx_outputs: dict[str, list]) -> dict[str, tuple]:
    """onnx2tf may leave a rank-3+ output channel-last; undo that so outputs match ONNX."""
    details = {d["index"]: d for d in interpreter.get_output_details()}
    permutations = {}
    for name, index in outputs.items():
        expected, got = onnx_outputs[name], list(details[index]["shape_signature"])
        rank = len(got)
        if rank < 3 or len(expected) != rank or _dims_match(expected, got):
            continue
        channel_first = (0, rank - 1, *range(1, rank - 1))
        if _dims_match(expected, [got[axis] for axis in channel_first]):
            permutations[name] = channel_first
    return permutations


def _dims_match(expected: list, got: list) -> bool:
    return all(not isinstance(e, int) or e == g or g == -1 for e, g in zip(expected, got))


def delegated_ops(ops: list[dict]) -> set[int]:
    """Indices of the ops a DELEGATE node replaced.

    The op list keeps the original nodes and appends one DELEGATE node per
    delegated partition, whose inputs/outputs are the partition's boundary
    tensors. Walking back from its outputs to its inputs finds the ops inside.
    """
    producer = {int(t): op for op in ops if op["op_name"] != "DELEGATE" for t in op["outputs"]}
    inside: set[int] = set()
    for delegate in (op for op in ops if op["op_name"] == "DELEGATE"):
        boundary = {int(t) for t in delegate["inputs"]}
        pending = [int(t) for t in delegate["outputs"]]
        while pending:
            op = producer.get(pending.pop())
            if op is None or op["index"] in inside:
                continue
            inside.add(op["index"])
            pending += [int(t) for t in op["inputs"] if int(t) >= 0 and int(t) not in boundary]
    return inside


def placement_rows(ops: list[dict], names: dict[int, str], extra: dict, outputs: dict[str, int], requested: str) -> list[PlacementRow]:
    """One row per (ONNX node, TFLite op, where it ran), from LiteRT's op details alone (pure:
    unit-tested on recorded details). An op no ONNX node can be found for keeps its own name."""
    delegated = delegated_ops(ops)
    to_node = onnx_node_lookup(extra, outputs, ops)
    order = {node: i for i, node in enumerate(extra["node_order"])}
    rows: dict[tuple, PlacementRow] = {}
    for op in ops:
        if op["op_name"] == "DELEGATE":
            continue
        where = XNNPACK if op["index"] in delegated else BUILTIN
        fallback = requested == XNNPACK and where != XNNPACK
        nodes = sorted(ops_onnx_nodes(op, names, to_node), key=lambda node: order.get(node, len(order))) or [f"{op['op_name']}#{op['index']}"]
        for node in nodes:
            rows.setdefault((node, op["op_name"], where), PlacementRow(node, op["op_name"], where, fallback))
    return list(rows.values())


def tensor_names(interpreter) -> dict[int, str]:
    return {detail["index"]: detail["name"] for detail in interpreter.get_tensor_details()}


def onnx_node_lookup(extra: dict, outputs: dict[str, int], ops: list[dict]) -> dict:
    """Keras layer name -> ONNX node, plus output tensors -> the ONNX node producing them.

    Output tensors carry the signature's name, not the layer's, so they are tied
    to the ONNX node producing that output; a converter-inserted DEQUANTIZE or
    QUANTIZE in front of an output is skipped to reach the op that computes it.
    """
    lookup = {layer: node for node, layers in extra["layers"].items() for layer in layers}
    producer = {int(t): op for op in ops if op["op_name"] != "DELEGATE" for t in op["outputs"]}
    for name, tensor in outputs.items():
        while producer.get(tensor, {}).get("op_name") in ("DEQUANTIZE", "QUANTIZE"):
            tensor = int(producer[tensor]["inputs"][0])
        lookup[tensor] = extra["output_producers"][name]
    return lookup


def ops_onnx_nodes(op: dict, names: dict[int, str], to_node: dict) -> list[str]:
    """ONNX nodes behind one TFLite op, read from its output tensor names.

    A fused op's output is named after every TF op folded into it
    ("model/tf.nn.relu/Relu;model/tf.math.add/Add;model/tf.nn.convolution/..."),
    the second path component being the Keras layer onnx2tf built for an ONNX node.
    """
    nodes = []
    for tensor in (int(t) for t in op["outputs"]):
        if tensor in to_node:
            nodes.append(to_node[tensor])
        for part in names.get(tensor, "").split(";"):
            pieces = part.split("/")
            if len(pieces) >= 2 and pieces[1] in to_node:
                nodes.append(to_node[pieces[1]])
    return list(dict.fromkeys(nodes))

