"""Run one cell in a worker process with a timeout, then judge what it measured.

The worker leaves plain files; this side turns them into a `Cell`: parity
against the reference, the contract, the verdict. A worker that crashes, hangs
or runs out of memory becomes that cell's FAIL row with what is known.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import contract, metrics, rollouts
from .model import ModelInfo
from .paths import cache_dir
from .reference import Reference
from .results import ArtifactInfo, Backend, Cell, CellError, LatencyStats, Placement
from .verdict import decide

STAGES = ("prepare", "open", "contract", "parity", "rollout", "latency", "placement")


@dataclass
class CellSpec:
    """What a worker needs to run one cell, written to its spec.json."""

    target: str
    variant: str
    observations: str  # .npz of the observation set
    onnx_variants: dict[str, str]  # the core's ONNX files per precision
    variant_errors: dict[str, str] = field(default_factory=dict)
    cache_dir: str = field(default_factory=lambda: str(cache_dir()))
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    symbolic_batch: bool = True
    chunk: int = 0  # run the observation set in chunks of a fixed batch (0: all at once)
    warmup: int = 20
    iters: int = 200
    threads: int = 1
    rollout: dict | None = None  # rollouts.RolloutPlan as a dict: drive episodes with this cell's session


@dataclass
class CellOutcome:
    measurement: dict
    arrays: dict[str, np.ndarray]
    duration_s: float


def execute(cell_dir: Path, spec: CellSpec, env: dict[str, str], timeout_s: float, on_stage) -> CellOutcome:
    """Run the worker; on_stage(name) is called as it reports progress."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("measurement.json", "outputs.npz"):
        (cell_dir / stale).unlink(missing_ok=True)
    (cell_dir / "spec.json").write_text(json.dumps(asdict(spec)))
    started = time.perf_counter()
    last_stage = ["start"]
    with open(cell_dir / "worker.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "matrix.worker", str(cell_dir)],
            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **env}, start_new_session=True,
        )
        reader = threading.Thread(target=_follow, args=(process, last_stage, on_stage), daemon=True)
        reader.start()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:  # on a timeout, and when the run itself is interrupted: no orphaned runtime
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        reader.join(timeout=5)
    duration = time.perf_counter() - started
    return CellOutcome(_measurement(cell_dir, process.returncode, last_stage[0], timeout_s), _arrays(cell_dir), duration)


def _follow(process: subprocess.Popen, last_stage: list, on_stage) -> None:
    for line in process.stdout:
        try:
            message = json.loads(line)
            name = message.get("stage")
        except (ValueError, AttributeError):
            continue  # a runtime printing to stdout is not a protocol message
        if name:
            last_stage[0] = name
            on_stage(f"{name} ({message['progress']})" if "progress" in message else name)


def _measurement(cell_dir: Path, returncode: int, last_stage: str, timeout_s: float) -> dict:
    path = cell_dir / "measurement.json"
    if path.exists():
        return json.loads(path.read_text())
    if returncode == -signal.SIGKILL:
        message = f"killed after {timeout_s:g} s (timeout) or out of memory"
    else:
        tail = [line for line in (cell_dir / "worker.log").read_text(errors="replace").splitlines() if line.strip()]
        message = f"worker exited with code {returncode}" + (f": {tail[-1].strip()}" if tail else "")
    return {"error": {"stage": last_stage, "message": message}}


def _arrays(cell_dir: Path) -> dict[str, np.ndarray]:
    path = cell_dir / "outputs.npz"
    if not path.exists():
        return {}
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def judge(
    outcome: CellOutcome, *, host: str, target: str, variant: str, predicts: bool, model: ModelInfo,
    reference: Reference, baseline: dict[str, np.ndarray] | None, tolerance: float,
    reference_rollout: rollouts.ReferenceRollout | None = None, rollout_plan: rollouts.RolloutPlan | None = None,
    return_tolerance: rollouts.ReturnTolerance | None = None,
) -> Cell:
    m = outcome.measurement
    cell = Cell(
        host=host, target=target, variant=variant, verdict="SKIP", predicts=predicts,
        runtime_version=m.get("runtime_version", ""),
        artifact=ArtifactInfo(**m["artifact"]) if "artifact" in m else None,
        latency=[LatencyStats(**stats) for stats in m.get("latency", [])],
        cold_start_ms=m.get("cold_start_ms"),
        placement=[Placement(**row) for row in m.get("placement", [])],
        backend=Backend(**m["backend"]) if "backend" in m else None,
        error=CellError(**m["error"]) if "error" in m else None,
        tolerance=tolerance, duration_s=outcome.duration_s,
    )
    if "skip" in m:
        cell.reasons = [m["skip"]]
        return cell
    if predicts and cell.error is None:
        cell.parity = _parity(outcome.arrays, reference, baseline, tolerance)
        cell.contract = contract.check(model, outcome.arrays, reference.outputs)
        cell.rollout = rollouts.summarise(m.get("rollout"), outcome.arrays, reference_rollout, rollout_plan)
    cell.verdict, cell.reasons = decide(cell, tolerance)
    cell.verdict, cell.reasons = rollouts.with_behaviour(cell.verdict, cell.reasons, cell.rollout, return_tolerance)
    return cell


def _parity(arrays, reference: Reference, baseline, tolerance: float):
    return [
        metrics.parity(
            name, arrays[f"outputs/{name}"], expected,
            None if baseline is None else baseline.get(name),
            reference.margins.get(name), tolerance,
        )
        for name, expected in reference.outputs.items()
        if f"outputs/{name}" in arrays and arrays[f"outputs/{name}"].shape == expected.shape
    ]


def skipped(*, host: str, target: str, variant: str, reason: str, runtime_version: str = "") -> Cell:
    return Cell(host=host, target=target, variant=variant, verdict="SKIP", reasons=[reason], runtime_version=runtime_version)
