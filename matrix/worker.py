"""One cell, in its own process: `python -m matrix.worker CELL_DIR`.

Reads CELL_DIR/spec.json, drives one target through prepare -> open ->
contract runs -> parity run -> latency -> placement, and leaves what it
measured in CELL_DIR (measurement.json, outputs.npz). It prints one JSON line
per stage so the parent can show progress. It judges nothing: verdicts are
the core's job, made from these files. A crash or hang here costs this cell only.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import numpy as np

import targets
from targets.base import CellSkip, PrepareContext

from . import observations, rollouts, variants
from .cells import CellSpec
from .contract import CONTRACT_BATCHES
from .metrics import latency_stats


def stage(name: str, progress: str = "") -> None:
    print(json.dumps({"stage": name, **({"progress": progress} if progress else {})}), flush=True)


def main(cell_dir: Path) -> None:
    spec = CellSpec(**json.loads((cell_dir / "spec.json").read_text()))
    measurement: dict = {"stage": "prepare"}
    arrays: dict[str, np.ndarray] = {}
    try:
        _measure(spec, cell_dir, measurement, arrays)
    except CellSkip as skip:
        measurement["skip"] = str(skip)
    except Exception as error:  # the runtime's own words become the cell's FAIL reason
        measurement["error"] = {"stage": measurement["stage"], "message": _one_line(error)}
        measurement["traceback"] = traceback.format_exc(limit=8)
    finally:
        np.savez(cell_dir / "outputs.npz", **arrays)
        (cell_dir / "measurement.json").write_text(json.dumps(measurement, default=str))


def _measure(spec: CellSpec, cell_dir: Path, measurement: dict, arrays: dict) -> None:
    target = targets.get(spec.target)
    feeds = observations.read(Path(spec.observations))
    measurement["runtime_version"] = target.runtime_version()

    def enter(name: str) -> None:
        measurement["stage"] = name
        stage(name)

    enter("prepare")
    onnx_variants = {k: Path(v) for k, v in spec.onnx_variants.items()}
    ctx = PrepareContext(
        onnx_variants=onnx_variants,
        variant_errors=spec.variant_errors,
        variant_seconds={k: variants.conversion_seconds(v) for k, v in onnx_variants.items()},
        calibration=feeds,
        workdir=cell_dir,
        cache_dir=Path(spec.cache_dir),
        threads=spec.threads,
    )
    started = time.perf_counter()
    artifact = target.prepare(ctx, spec.variant)
    measurement["artifact"] = {
        "size_bytes": artifact.size_bytes,
        "conversion_s": artifact.conversion_s or time.perf_counter() - started,
        "op_inventory": artifact.op_inventory,
        "notes": artifact.notes,
    }
    if not target.predicts:
        return

    enter("open")
    first_batch = observations.take(feeds, spec.chunk or 1)
    started = time.perf_counter_ns()
    session = target.open(artifact, spec.threads)
    session.run(first_batch)
    measurement["cold_start_ms"] = (time.perf_counter_ns() - started) / 1e6
    measurement["backend"] = asdict(session.backend())
    try:
        _run_session(session, spec, feeds, measurement, arrays, enter)
    finally:
        session.close()


def _run_session(session, spec, feeds, measurement, arrays, enter) -> None:
    enter("contract")
    if spec.symbolic_batch:
        for batch in CONTRACT_BATCHES:
            for name, value in session.run(observations.take(feeds, batch)).items():
                arrays[f"batch{batch}/{name}"] = value

    enter("parity")
    outputs = observations.run_in_batches(session.run, feeds, spec.chunk)
    repeat = observations.run_in_batches(session.run, feeds, spec.chunk)
    for name, value in outputs.items():
        arrays[f"outputs/{name}"] = value
        arrays[f"repeat/{name}"] = repeat[name]

    if spec.rollout:
        enter("rollout")
        _rollout(session, rollouts.RolloutPlan.from_dict(spec.rollout), measurement, arrays)

    enter("latency")
    measurement["latency"] = [
        latency_stats(batch, session.time(observations.take(feeds, batch), spec.warmup, spec.iters))
        for batch in spec.batch_sizes
    ]

    enter("placement")
    measurement["placement"] = [asdict(row) for row in session.placement()]
    measurement["stage"] = "done"


def _rollout(session, plan, measurement, arrays) -> None:
    """This runtime in the loop: one action per step at batch 1, the environment beside it."""
    measured, episode_arrays = rollouts.drive(session.run, plan, lambda progress: stage("rollout", progress))
    measurement["rollout"] = measured
    arrays.update(episode_arrays)


MAX_MESSAGE = 600  # the runtime's words, not its whole log: worker.log keeps the rest


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + " …"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


if __name__ == "__main__":
    main(Path(sys.argv[1]))
