"""Core ML (coremltools): conversion everywhere, prediction on macOS.

Conversion goes ONNX -> onnx2torch -> torch.jit.trace -> coremltools ML Program
(coremltools 9 has no ONNX frontend) and runs in its own environment
(requirements/coreml.txt: torch is large and coremltools has its own pins),
through coreml_convert.py: files in, JSON out. Artifacts are cached by ONNX
content hash + variant + the environment's pins + the converter script.

Prediction must run where coremltools lives, so on macOS each cell starts
coreml_predict.py in that same environment and talks to it over a pipe
(JSON lines, arrays as .npz): predict, timing (measured in that process) and
MLComputePlan placement all happen there. One registered target per compute-unit
setting, plus `coreml`, conversion only, which reports on every host.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import ClassVar

import numpy as np

from .base import NO_SETTINGS, Artifact, BackendInfo, CellSkip, Feeds, PlacementRow, PrepareContext, Session, Settings, Target
from .isolated_env import PinnedWheel, ensure_env, env_python, run_json

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements" / "coreml.txt"
CONVERT_SCRIPT = HERE / "coreml_convert.py"
PREDICT_SCRIPT = HERE / "coreml_predict.py"
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


def conversion_key(onnx_path: Path, variant: str) -> str:
    digest = hashlib.sha256()
    for part in (onnx_path.read_bytes(), variant.encode(), REQUIREMENTS.read_bytes(), CONVERT_SCRIPT.read_bytes(),
                 str(MAX_BATCH).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:24]


def convert(ctx: PrepareContext, variant: str) -> tuple[Path, dict, bool]:
    """The cached .mlpackage for this ONNX + variant (converted on a miss), its record, and whether it was cached."""
    entry = ctx.cache_dir / "coreml" / conversion_key(ctx.fp32_model, variant)
    if (entry / "conversion.json").exists():
        return entry / "model.mlpackage", json.loads((entry / "conversion.json").read_text()), True
    staging = entry.with_name(f"{entry.name}.{uuid.uuid4().hex[:8]}.tmp")
    staging.mkdir(parents=True)
    try:
        example = staging / "example.npz"
        np.savez(example, **{name: array[:64] for name, array in ctx.calibration.items()})
        request = {"workdir": str(staging), "onnx": str(ctx.fp32_model), "example": str(example), "variant": variant,
                   "out": str(staging / "model.mlpackage"), "max_batch": MAX_BATCH}
        result = run_json(build_environment(), CONVERT_SCRIPT, request, CONVERT_TIMEOUT_S)
        if "error" in result:
            raise RuntimeError(result["error"])
        (staging / "conversion.json").write_text(json.dumps(result))
        if not entry.exists():
            staging.rename(entry)  # atomic: a concurrent cell either sees all of it or none
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry / "model.mlpackage", result, False


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
    return Artifact(path=path, conversion_s=record["conversion_s"], op_inventory=dict(Counter(op["mil_op"] for op in record["ops"])),
                    notes=notes, extra={"conversion": record},
                    quantization=quantization(record["ops"]) if variant == "int8" else None)


WEIGHT_OPS = {"linear", "conv", "conv_transpose", "matmul"}


def quantization(ops: list[dict]) -> dict[str, int]:
    """Weight ops whose weight comes from an 8-bit constexpr (linear_quantize_weights), and those left float."""
    quantized = [op for op in ops if op.get("inserted_by") == "linear_quantize_weights"]
    users = {op["onnx_node"] for op in quantized if op["onnx_node"]}
    weight_ops = [op for op in ops if op["mil_op"] in WEIGHT_OPS]
    float_ops = [op for op in weight_ops if op["onnx_node"] not in users]
    return {"quantized_ops": len(weight_ops) - len(float_ops), "float_ops": len(float_ops),
            "quantized_weights": len(quantized), "float_weights": len(float_ops)}


class CoremlTarget(Target):
    """`coreml`: conversion only, on every host; the cell is its conversion."""

    name = "coreml"
    summary = "Core ML conversion (onnx2torch -> coremltools ML Program): op inventory, size, time"
    variants = ("fp32", "fp16", "int8")
    predicts: ClassVar[bool] = False

    def runtime_version(self) -> str:
        pins = pinned_versions()
        return f"coremltools {pins['coremltools']} (onnx2torch {pins['onnx2torch']}, torch {pins['torch']})"

    def unavailable_reason(self) -> str | None:
        # Never build the 1.1 GB environment silently inside the first cell.
        return environment_missing()

    def prepare(self, ctx: PrepareContext, variant: str) -> Artifact:
        path, record, cached = convert(ctx, variant)
        (ctx.workdir / "coreml_ops.json").write_text(json.dumps(record["ops"], indent=1))
        return artifact_from(path, record, variant, cached)

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        raise CellSkip("coreml is conversion only; the coreml-* targets predict (on macOS)")


class CoremlPredictTarget(CoremlTarget):
    """Core ML prediction with one compute-unit setting (macOS only)."""

    predicts: ClassVar[bool] = True
    compute_units: ClassVar[str]
    accelerators: ClassVar[frozenset[str]]  # devices that count as "on the requested accelerator"

    def unavailable_reason(self) -> str | None:
        return "CoreML prediction needs macOS" if sys.platform != "darwin" else environment_missing()

    def prepare(self, ctx: PrepareContext, variant: str) -> Artifact:
        artifact = super().prepare(ctx, variant)
        if not self.unavailable_reason():
            artifact.extra["helper"] = PredictHelper()  # imports done before open() is timed
        return artifact

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        # Core ML chooses its own threads: `threads` has no Core ML counterpart.
        return CoremlSession(artifact, self.compute_units, self.accelerators, artifact.extra.pop("helper", None))


class CoremlCpu(CoremlPredictTarget):
    name, compute_units, accelerators = "coreml-cpu", "CPU_ONLY", frozenset({"CPU"})
    summary = "Core ML, compute units CPU_ONLY"


class CoremlGpu(CoremlPredictTarget):
    name, compute_units, accelerators = "coreml-gpu", "CPU_AND_GPU", frozenset({"GPU"})
    summary = "Core ML, compute units CPU_AND_GPU"


class CoremlNe(CoremlPredictTarget):
    name, compute_units, accelerators = "coreml-ne", "CPU_AND_NE", frozenset({"ANE"})
    summary = "Core ML, compute units CPU_AND_NE (Neural Engine)"


class CoremlAll(CoremlPredictTarget):
    name, compute_units, accelerators = "coreml-all", "ALL", frozenset({"ANE", "GPU"})
    summary = "Core ML, compute units ALL"


TARGETS = (CoremlTarget(), CoremlCpu(), CoremlGpu(), CoremlNe(), CoremlAll())


class PredictHelper:
    """coreml_predict.py running in the CoreML environment: JSON lines over a pipe, arrays as .npz.

    Started (and its coremltools import finished) during prepare, so the cold start the
    core times in open() is Core ML's model load and first predict, not Python's imports.
    """

    def __init__(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="coreml-helper-"))
        self.log = open(self.tmp / "helper.log", "w")
        started = time.perf_counter_ns()
        self.process = subprocess.Popen([str(build_environment()), str(PREDICT_SCRIPT)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True)
        self._answer()  # {"ready": true} once coremltools is imported
        self.start_ms = (time.perf_counter_ns() - started) / 1e6

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the Core ML prediction process exited ({self.process.wait()}): {self._log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def _log_tail(self) -> str:
        self.log.flush()
        lines = (self.tmp / "helper.log").read_text().strip().splitlines()
        return lines[-1] if lines else "no output"

    def arrays_file(self, feeds: Feeds) -> str:
        path = self.tmp / "feeds.npz"
        np.savez(path, **feeds)
        return str(path)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class CoremlSession(Session):
    """One MLModel loaded with one compute-unit setting, inside a PredictHelper."""

    def __init__(self, artifact: Artifact, compute_units: str, accelerators: frozenset[str],
                 helper: PredictHelper | None = None):
        record = artifact.extra["conversion"]
        self.compute_units, self.accelerators = compute_units, accelerators
        self.ops = {output: op for op in record["ops"] for output in op["outputs"]}
        self.helper = helper or PredictHelper()
        self.loaded = self.helper.ask({"op": "load", "path": str(artifact.path), "compute_units": compute_units,
                                       "inputs": record["inputs"], "outputs": record["outputs"]})
        self._skip_without_accelerator(self.loaded["devices"])

    def _skip_without_accelerator(self, devices: list[str] | None) -> None:
        if devices is not None and not self.accelerators & set(devices):
            self.close()
            raise CellSkip(f"Core ML sees no {' or '.join(sorted(self.accelerators))} on this Mac "
                           f"(devices: {', '.join(devices)}), so {self.compute_units} cannot be measured here")

    def run(self, feeds: Feeds) -> Feeds:
        # The converted batch dimension stops at MAX_BATCH: larger sets go in slices.
        rows = len(next(iter(feeds.values())))
        if rows <= MAX_BATCH:
            return self._run_once(feeds)
        parts = [self._run_once({k: v[i:i + MAX_BATCH] for k, v in feeds.items()}) for i in range(0, rows, MAX_BATCH)]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def _run_once(self, feeds: Feeds) -> Feeds:
        out = self.helper.tmp / "outputs.npz"
        self.helper.ask({"op": "run", "feeds": self.helper.arrays_file(feeds), "out": str(out)})
        with np.load(out) as outputs:
            return {name: outputs[name] for name in outputs.files}

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        request = {"op": "time", "feeds": self.helper.arrays_file(feeds), "warmup": warmup, "iters": iters}
        return self.helper.ask(request)["samples"]

    def placement(self) -> list[PlacementRow]:
        return self.placement_rows(self.helper.ask({"op": "placement"})["rows"])

    def placement_rows(self, plan_rows: list[dict]) -> list[PlacementRow]:
        """MLComputePlan rows (one per MIL op) -> one row per ONNX node, like every other target.

        A node whose MIL ops ran on several devices shows them all ("ANE+CPU") and is a
        fallback if any of them left the requested accelerator. MIL ops that belong to no
        ONNX node (e.g. the fp16 casts coremltools adds) keep rows of their own.
        """
        grouped: dict[str, list] = {}
        for row in plan_rows:
            op = next((self.ops[name] for name in row["outputs"] if name in self.ops), None)
            if op and op["onnx_node"]:
                key, op_type = op["onnx_node"], op["onnx_op"]
            else:
                key, op_type = f"{row['outputs'][0] if row['outputs'] else '?'} (MIL)", row["operator"]
            grouped.setdefault(key, [op_type, []])[1].append(row["preferred"] or "unknown")
        return [PlacementRow(node=node, op_type=op_type, where="+".join(dict.fromkeys(devices)),
                             fallback=any(self._fell_back(device) for device in devices))
                for node, (op_type, devices) in grouped.items()]

    def _fell_back(self, device: str) -> bool:
        # "unknown": Core ML could not say where the op runs; shown, not counted as fallback.
        return device != "unknown" and device not in self.accelerators

    def backend(self) -> BackendInfo:
        # Core ML takes compute units as a permission, not an order: the compute plan (placement)
        # shows which ops fell off the requested accelerator; here we verify the setting held.
        detail = (f"MLModel load {self.loaded['load_ms']:.0f} ms; devices "
                  f"{', '.join(self.loaded['devices'] or ['unknown'])}; helper process started in {self.helper.start_ms:.0f} ms")
        return BackendInfo(requested=self.compute_units, actual=self.loaded["compute_unit"], detail=detail)

    def close(self) -> None:
        self.helper.close()
