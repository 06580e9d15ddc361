"""onnx2tf conversion of a policy into .tflite files, cached by content.

onnx2tf runs in its own virtual environment (its pins clash with the core: old
onnx, numpy 1.26, protobuf 4) through tflite_convert.py, files in and JSON out.
A cache entry (a folder of .tflite files + meta.json) is keyed by the ONNX
bytes, the converter environment's pins and the recipe, built once under the
cache's lock (build_once.py), and reused by every later cell and run. A
conversion onnx2tf refused is an entry with its words (build_once.REFUSAL).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx

from . import isolated_env
from .base import Feeds, PrepareContext
from .build_once import build_once, cached_words, converted_or_refused, keep_refusal, raise_if_refused
from .tflite_provenance import OnnxInterface

REQUIREMENTS = Path(__file__).parent / "requirements" / "onnx2tf.txt"
CONVERT_SCRIPT = Path(__file__).parent / "tflite_convert.py"
ENV_NAME = "onnx2tf"
# Bump when the conversion flags in tflite_convert.py change, so cached files are rebuilt.
RECIPE_REVISION = "3"  # 2: entries keep the files that were made and say why others are missing; 3: offline, no run's paths
CONVERT_TIMEOUT_S = 900
# Calibration samples for full-integer quantization: TF calibrates one sample at a time.
MAX_CALIBRATION_SAMPLES = 128
RECIPE_FILES = {"dynamic": ("fp32", "fp16", "int8"), "full": ("int8-full",)}
WORK_FOLDER = "<onnx2tf's work folder>"  # stands for the converting cell's folder in cached reasons
CACHED_WORDS = cached_words("onnx2tf")
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def converter_pin() -> str:
    """'onnx2tf 1.29.24' from the requirements file, without starting the environment."""
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("onnx2tf=="):
            return "onnx2tf " + line.split("==", 1)[1].strip()
    return "onnx2tf"


def build_environment() -> Path:
    """Build (once) the onnx2tf environment and return its interpreter: `policy-matrix setup tflite`."""
    return isolated_env.ensure_env(ENV_NAME, REQUIREMENTS)


def converted(ctx: PrepareContext, model: Path, recipe: str) -> tuple[Path, bool]:
    """The cache entry (a folder of .tflite files + meta.json) for this model and recipe,
    and whether this call made it (cells of one run convert the same model at once: one converts).
    Raises RuntimeError with onnx2tf's words when it refused the model, now or in the run that cached it."""
    calibration = calibration_set(ctx) if recipe == "full" else {}
    entry = ctx.cache_dir / "tflite" / cache_key(model, recipe, calibration)

    def convert(staging: Path) -> None:
        answer = run_converter(ctx, model, recipe, calibration)
        if answer["ok"]:
            store(staging, answer, RECIPE_FILES[recipe])
        else:
            keep_refusal(staging, answer["error"])

    made = build_once(entry, convert, ready=converted_or_refused("meta.json"))
    try:
        raise_if_refused(entry, made, "onnx2tf")  # every cell of this recipe fails with its words
    except RuntimeError as refused:
        raise RuntimeError(calibration_words(str(refused), model)) from None
    return entry, made


def cache_key(model: Path, recipe: str, calibration: Feeds) -> str:
    digest = hashlib.sha256(model.read_bytes())
    digest.update(REQUIREMENTS.read_bytes())  # the converter version and its whole environment
    digest.update(f"{recipe}:{RECIPE_REVISION}".encode())
    for name in sorted(calibration):
        digest.update(name.encode() + calibration[name].tobytes() + str(calibration[name].shape).encode())
    return f"{recipe}-{digest.hexdigest()[:20]}"


def calibration_set(ctx: PrepareContext) -> Feeds:
    """onnx2tf calibrates on `data[i:i+1]` of every input's array: each observation as it is fed at
    batch 1 (cut along the input's own batch axis; an input without one, a rank-0 `sr` too, as it is
    fed), joined along axis 0."""
    samples = ctx.calibration_samples(MAX_CALIBRATION_SAMPLES)
    return {name: np.concatenate([np.atleast_1d(sample[name]) for sample in samples]) for name in ctx.calibration}


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
    # Its words are cached and shown to later runs (what is missing, or why nothing was made): without this run's folder.
    if not answer["ok"]:
        answer["error"] = answer["error"].replace(str(work), WORK_FOLDER)
    answer["errors"] = {name: text.replace(str(work), WORK_FOLDER) for name, text in answer.get("errors", {}).items()}
    return answer


def calibration_words(error: str, model: Path) -> str:
    """onnx2tf's full-integer calibration casts every input's samples to float32 (its representative dataset does),
    and LiteRT refuses them for an input of another type ("Cannot set tensor: Got value of type FLOAT32 but expected
    type BOOL for input 0, name: serving_default_deterministic:0"): the converter's words, with the inputs it cannot
    calibrate, so a rank-0 flag's FAIL does not read as a broken model."""
    if "Cannot set tensor: Got value of type FLOAT32" not in error:
        return error
    graph = onnx.load(str(model), load_external_data=False).graph
    constants = {init.name for init in graph.initializer}
    others = [f"{value.name!r} ({onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)})"
              for value in graph.input if value.name not in constants and value.type.tensor_type.elem_type not in FLOAT_TYPES]
    if not others:
        return error
    return (f"{error} (onnx2tf's int8 calibration feeds every input as float32; this model also takes "
            f"{', '.join(others)}, which it cannot calibrate)")


def store(staging: Path, answer: dict, wanted: tuple[str, ...]) -> None:
    """Copy the converter's files into a staging folder (build_once renames it into the cache).

    A file the converter could not write is recorded with its reason, so only
    the cell that needs it fails; with none written, the conversion failed."""
    made = [name for name in wanted if name in answer["files"]]
    if not made:
        raise RuntimeError(f"onnx2tf wrote no {', '.join(wanted)} file (its log: {answer.get('log', 'n/a')})")
    staging.mkdir()
    for name in made:
        shutil.copyfile(answer["files"][name], staging / f"{name}.tflite")
    meta = {key: answer[key] for key in ("seconds", "converter", "layers")}
    meta["missing"] = {
        name: answer.get("errors", {}).get(name) or f"onnx2tf wrote no {name} file" for name in wanted if name not in made
    }
    (staging / "meta.json").write_text(json.dumps(meta))


def image_like_inputs(model: Path) -> list[str]:
    """Inputs onnx2tf would turn NHWC: keep them NCHW so every target gets the same observations."""
    return [name for name, dims in onnx_interface(model).onnx_inputs.items() if 3 <= len(dims) <= 5]


def onnx_interface(model: Path) -> OnnxInterface:
    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}

    def dims(value) -> list:
        return [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in value.type.tensor_type.shape.dim]

    producers = {output: node.name for node in graph.node for output in node.output}
    return OnnxInterface(
        onnx_inputs={v.name: dims(v) for v in graph.input if v.name not in initializers},
        onnx_outputs={v.name: dims(v) for v in graph.output},
        output_producers={v.name: producers.get(v.name, v.name) for v in graph.output},
        node_order=[node.name for node in graph.node],
    )
