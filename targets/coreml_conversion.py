"""Core ML conversion: ONNX -> onnx2torch -> torch.jit.trace -> coremltools ML Program, cached.

coremltools 9 has no ONNX frontend; the route runs in its own environment
(requirements/coreml.txt: torch is large and coremltools has its own pins)
through coreml_convert.py: files in, JSON out. Artifacts are cached by ONNX
content hash + variant + the environment's pins + the converter script, built
once under the cache's lock (build_once.py), and so is a refusal in the
converter's words (build_once.py says which failures are not cached).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .base import Artifact, PrepareContext
from .build_once import build_once, converted_or_refused, keep_refusal, raise_if_refused
from .isolated_env import PinnedWheel, ensure_env, env_python, run_json

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements" / "coreml.txt"
CONVERT_SCRIPT = HERE / "coreml_convert.py"
ENV_NAME = "coreml"
# Where the CPU-only torch wheels live (PyPI's Linux wheel is the CUDA build).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MAX_BATCH = 1024  # upper bound of the flexible batch dimension (RangeDim)
CONVERT_TIMEOUT_S = 600

PRECISION_NOTES = {
    "fp32": "fp32: compute_precision=FLOAT32 (coremltools' default would be FLOAT16)",
    "fp16": "fp16: compute_precision=FLOAT16, coremltools' default: weights and activations in float16",
    "int8": "int8: weights linear-quantized to int8 per output channel (coremltools.optimize), compute in float16",
}


def pinned_versions() -> dict[str, str]:
    """Package pins of the CoreML environment, read from its requirements file."""
    pins = (line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return dict(pin.split("==", 1) for pin in pins if "==" in pin)


def cpu_torch() -> tuple[PinnedWheel, ...]:
    """On Linux, the CPU build of the pinned torch, installed before the rest of the pins."""
    if not sys.platform.startswith("linux"):
        return ()
    return (PinnedWheel(f"torch=={pinned_versions()['torch']}+cpu", TORCH_CPU_INDEX),)


def build_environment() -> Path:
    """Build the CoreML environment ahead of any cell (`policy-matrix setup coreml`); returns its python."""
    return ensure_env(ENV_NAME, REQUIREMENTS, first=cpu_torch())


def environment_missing() -> str | None:
    """What to run when the CoreML environment is not built yet, else None."""
    if env_python(ENV_NAME, REQUIREMENTS) is None:
        return "needs setup: run `policy-matrix setup coreml` (builds its environment once, ~1.1 GB)"
    return None


def conversion_key(onnx_path: Path, variant: str, batch_axes: dict[str, int]) -> str:
    digest = hashlib.sha256()
    for part in (onnx_path.read_bytes(), variant.encode(), REQUIREMENTS.read_bytes(), CONVERT_SCRIPT.read_bytes(),
                 str(MAX_BATCH).encode(), json.dumps(batch_axes, sort_keys=True).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:24]


def convert(ctx: PrepareContext, variant: str) -> tuple[Path, dict, bool]:
    """The cached .mlpackage for this ONNX + variant (converted on a miss), its record, and whether it was cached.
    Raises RuntimeError with the converter's words when it refused the model, now or in the run that cached it."""
    entry = ctx.cache_dir / "coreml" / conversion_key(ctx.fp32_model, variant, ctx.batch_axes)

    def write(staging: Path) -> None:
        staging.mkdir()
        example = staging / "example.npz"
        np.savez(example, **ctx.calibration_head(64))
        request = {"workdir": str(staging), "onnx": str(ctx.fp32_model), "example": str(example), "variant": variant,
                   "out": str(staging / "model.mlpackage"), "max_batch": MAX_BATCH, "batch_axes": ctx.batch_axes}
        result = run_json(build_environment(), CONVERT_SCRIPT, request, CONVERT_TIMEOUT_S)
        if "error" not in result:
            (staging / "conversion.json").write_text(json.dumps(result))
        else:
            keep_refusal(staging, result["error"].replace(str(staging), str(entry)))  # where its files are once cached

    made = build_once(entry, write, ready=converted_or_refused("conversion.json"))
    raise_if_refused(entry, made, "the converter")
    return entry / "model.mlpackage", json.loads((entry / "conversion.json").read_text()), not made


def ops_by_onnx_node(ops: list[dict]) -> str:
    """'Gemm->linear x3, ArgMax->reduce_argmax x1': which MIL ops each ONNX op type became."""
    pairs = Counter(f"{op['onnx_op'] or '(' + (op.get('inserted_by') or 'converter') + ')'}->{op['mil_op']}" for op in ops)
    return ", ".join(f"{pair} x{count}" for pair, count in pairs.items())


def artifact_from(path: Path, record: dict, variant: str, cached: bool) -> Artifact:
    notes = [PRECISION_NOTES[variant], f"ML Program, deployment target {record['deployment_target']}, "
             f"flexible batch RangeDim(1, {MAX_BATCH})", f"MIL ops from ONNX: {ops_by_onnx_node(record['ops'])}"]
    narrowed = [name for name, spec in record["outputs"].items() if spec["dtype"] in ("int64", "uint64")]
    if narrowed:
        notes.append(f"{', '.join(narrowed)}: int32 inside Core ML (no int64 tensors), cast back to int64")
    notes += [f"workaround: {fix}" for fix in record.get("workarounds", [])]
    if cached:
        notes.append("conversion reused from the cache (time is the original conversion's)")
    return CoremlArtifact(path=path, conversion_s=record["conversion_s"], op_inventory=dict(Counter(op["mil_op"] for op in record["ops"])),
                          notes=notes, variant=variant, conversion=record,
                          quantization=quantization(record["ops"]) if variant == "int8" else None)


WEIGHT_OPS = {"linear", "conv", "conv_transpose", "matmul"}


def quantization(ops: list[dict]) -> dict[str, int]:
    """Weight ops whose weight comes from an 8-bit constexpr (linear_quantize_weights), and those left float; weight-only,
    so no op quantizes activations per call."""
    quantized = [op for op in ops if op.get("inserted_by") == "linear_quantize_weights"]
    users = {op["onnx_node"] for op in quantized if op["onnx_node"]}
    weight_ops = [op for op in ops if op["mil_op"] in WEIGHT_OPS]
    float_ops = [op for op in weight_ops if op["onnx_node"] not in users]
    return {"quantized_ops": len(weight_ops) - len(float_ops), "float_ops": len(float_ops),
            "quantized_weights": len(quantized), "float_weights": len(float_ops), "per_call_ops": 0}


@dataclass(kw_only=True)
class CoremlArtifact(Artifact):
    """An .mlpackage and coreml_convert.py's record of it: its ops (each MIL op with the ONNX node it came
    from), its inputs and outputs (Core ML names and dtypes), deployment target and workarounds."""

    conversion: dict
