"""Core ML (coremltools): conversion everywhere, prediction on macOS.

Conversion (ONNX -> onnx2torch -> torch.jit.trace -> coremltools ML Program, in
its own environment, cached) is coreml_conversion.py. Prediction must run where
coremltools lives, so on macOS each cell starts coreml_predict.py in that same
environment and talks to it over a pipe (JSON lines, jsonl_process.py; arrays
as .npz): predict, timing (measured in that process) and MLComputePlan
placement all happen there. One registered target per compute-unit setting,
plus `coreml`, conversion only, which reports on every host.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from .base import NO_SETTINGS, Artifact, BackendInfo, CellSkip, Feeds, PlacementRow, PrepareContext, Session, Settings, Target
# ENV_NAME, REQUIREMENTS, build_environment: `policy-matrix setup coreml` builds the environment through this module.
from .coreml_conversion import (  # noqa: F401
    ENV_NAME, MAX_BATCH, REQUIREMENTS, CoremlArtifact, artifact_from, build_environment, convert, environment_missing,
    pinned_versions,
)
from .jsonl_process import JsonLinesProcess

PREDICT_SCRIPT = Path(__file__).parent / "coreml_predict.py"


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
    _started_helper: PredictHelper | None = None  # started by start_runtime, taken by the next _open

    def unavailable_reason(self) -> str | None:
        return "CoreML prediction needs macOS" if sys.platform != "darwin" else environment_missing()

    def start_runtime(self, threads: int) -> None:
        """The prediction process, its coremltools import done, so cold start is Core ML's load + first predict."""
        if self._started_helper is None and not self.unavailable_reason():
            self._started_helper = PredictHelper()

    def _open(self, artifact: Artifact, threads: int, settings: Settings = NO_SETTINGS) -> Session:
        # Core ML chooses its own threads: `threads` has no Core ML counterpart.
        helper, self._started_helper = self._started_helper, None
        return CoremlSession(artifact, self.compute_units, self.accelerators, helper)


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


class PredictHelper:
    """coreml_predict.py running in the CoreML environment, with a private folder for the .npz arrays.

    The process answers once coremltools is imported; start_ms is how long that took.
    """

    def __init__(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="coreml-helper-"))
        started = time.perf_counter_ns()
        self.server = JsonLinesProcess([str(build_environment()), str(PREDICT_SCRIPT)], "the Core ML prediction process")
        try:
            self.server.reply()  # {"ready": true}
        except BaseException:
            self.close()
            raise
        self.start_ms = (time.perf_counter_ns() - started) / 1e6

    def ask(self, op: str, **request) -> dict:
        return self.server.call(op, **request)

    def arrays_file(self, feeds: Feeds) -> str:
        path = self.tmp / "feeds.npz"
        np.savez(path, **feeds)
        return str(path)

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class CoremlSession(Session):
    """One MLModel loaded with one compute-unit setting, inside a PredictHelper."""

    def __init__(self, artifact: CoremlArtifact, compute_units: str, accelerators: frozenset[str],
                 helper: PredictHelper | None = None):
        record = artifact.conversion
        self.compute_units, self.accelerators = compute_units, accelerators
        self.ops = {output: op for op in record["ops"] for output in op["outputs"]}
        self.helper = helper or PredictHelper()
        try:
            self.loaded = self.helper.ask("load", path=str(artifact.path), compute_units=compute_units,
                                          inputs=record["inputs"], outputs=record["outputs"])
        except BaseException:
            self.close()  # the process ends with the session that failed to load
            raise
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
        self.helper.ask("run", feeds=self.helper.arrays_file(feeds), out=str(out))
        with np.load(out) as outputs:
            return {name: outputs[name] for name in outputs.files}

    def time(self, feeds: Feeds, warmup: int, iters: int) -> list[int]:
        return self.helper.ask("time", feeds=self.helper.arrays_file(feeds), warmup=warmup, iters=iters)["samples"]

    def placement(self) -> list[PlacementRow]:
        return self.placement_rows(self.helper.ask("placement")["rows"])

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
