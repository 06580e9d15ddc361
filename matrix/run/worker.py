"""One cell in a worker process: `python -m matrix.run.worker CELL_DIR`, or the cells of one
target in turn: `python -m matrix.run.worker --serve` (cell folders on stdin; see serve()).

Reads CELL_DIR/spec.json, drives one target through prepare -> open ->
contract runs -> parity run -> latency -> placement, and leaves what it
measured in CELL_DIR (measurement.json, outputs.npz), rewritten after every
stage: a worker killed in a late stage (a slow latency loop, a runtime that
crashes in its profiler) leaves the parity and contract it already measured,
and the stage it was in ("stage" other than "done"). Latency is time-boxed:
each batch size stops after `latency_budget_s` and says how many calls it
timed. It prints one JSON line per stage so the parent can show progress. It
judges nothing: verdicts are the core's job, made from these files. A crash or
hang here costs this cell only.
"""

from __future__ import annotations

import time

WORKER_STARTED = time.time()  # before the heavy imports below: bench/matrix_wall.py shows what they cost

import itertools
import os
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx

import targets
from targets import versions
from targets.base import EMULATED_ITERS, EMULATED_WARMUP, CellSkip, PrepareContext

from ..inputs import observations
from . import rollouts, variants
from ..inputs.contract import CONTRACT_BATCHES
from ..judge.metrics import latency_stats
from ..errors import error_line
from .guarded import stage
from .protocol import (
    DONE,
    FIRST_RUN,
    GO,
    OUTPUTS_FILE,
    START,
    TIMED,
    UNTIMED,
    CellSpec,
    Measurement,
    done_message,
    gate_message,
)
from ..results import ArtifactInfo, CellError
from ..judge.rules import workaround_note


_gated = False  # serve(): the parent grants each stage (cells.StageGate)


def gate(kind: str, measurement: Measurement) -> float:
    """Wait for the parent's go for `kind` of work (protocol.TIMED: nothing else runs meanwhile); the wall-clock time
    it came. The wait is noted on the stage it falls in (Measurement.gate_wait_s), so bench/matrix_wall.py tells
    waiting from work."""
    if not _gated:
        return time.time()
    asked = time.time()
    print(gate_message(kind), flush=True)
    if sys.stdin.readline().strip() != GO:  # the parent is gone: nothing left to measure for
        sys.exit(1)
    granted = time.time()
    within = measurement.stage if measurement.stage in measurement.timeline else START
    measurement.gate_wait_s[within] = measurement.gate_wait_s.get(within, 0.0) + granted - asked
    return granted


def main(cell_dir: Path) -> None:
    spec = CellSpec.read(cell_dir)
    measurement = Measurement(stage="prepare", timeline=_first_timeline(), worker_pid=os.getpid())
    arrays: observations.Feeds = {}
    try:
        _measure(spec, cell_dir, measurement, arrays)
        measurement.stage = DONE
    except CellSkip as skip:
        measurement.skip = str(skip)
    except Exception as error:  # the runtime's own words become the cell's FAIL reason
        measurement.error = CellError(stage=measurement.stage, message=error_line(error))
        measurement.traceback = traceback.format_exc(limit=8)
    finally:
        measurement.timeline["finished"] = time.time()
        _save(cell_dir, measurement, arrays)


_cells_served = itertools.count()  # only the first cell of a process paid for its start-up


def _first_timeline() -> dict:
    if next(_cells_served):
        return {"received": time.time()}
    return {"worker_started": WORKER_STARTED, "imported": time.time()}


def _save(cell_dir: Path, measurement: Measurement, arrays: dict) -> None:
    """Write both files whole, then swap them in: a kill mid-write never leaves half a file."""
    observations.save(arrays, cell_dir / OUTPUTS_FILE)
    measurement.save(cell_dir)


_served = None  # the target whose runtime this worker holds (serve(): one worker may serve several targets)


def _serving(target) -> None:
    """A worker that moves on to another target's cells releases the runtime of the one before (its browser page)."""
    global _served
    if _served is not None and _served.name != target.name:
        _served.stop_runtime()
    _served = target


def _measure(spec: CellSpec, cell_dir: Path, measurement: Measurement, arrays: dict) -> None:
    target = targets.get(spec.target)
    feeds = observations.read(Path(spec.observations))
    measurement.runtime_version = target.runtime_version()
    versions.check_loaded(target)  # a pinned target runs its own release or not at all

    def enter(name: str) -> None:
        granted = gate(TIMED if name == "latency" else UNTIMED, measurement)
        measurement.stage = name
        # Wall-clock start of each stage, for bench/matrix_wall.py: the grant's own reading, so a stage's start less the
        # wait noted before it is when the previous stage asked to end, even when this process was preempted between.
        measurement.timeline[name] = granted
        _save(cell_dir, measurement, arrays)
        stage(name)

    enter("prepare")
    _serving(target)  # under the gate's grant: closing the previous target's page is work too
    onnx_variants = {k: Path(v) for k, v in spec.onnx_variants.items()}
    ctx = PrepareContext(
        onnx_variants=onnx_variants,
        variant_errors=spec.variant_errors,
        variant_seconds={k: variants.conversion_seconds(v) for k, v in onnx_variants.items()},
        variant_notes={k: variants.notes(k, v) for k, v in onnx_variants.items()},
        calibration=feeds,
        batch_axes=spec.batch_axes,
        workdir=cell_dir,
        cache_dir=Path(spec.cache_dir),
        threads=spec.threads,
    )
    started = time.perf_counter()
    artifact = target.prepare(ctx, spec.variant)
    measurement.artifact = ArtifactInfo(
        # The core's ONNX variant as it is: the size of what the user ships (for fp32, their own files).
        size_bytes=variants.shipped_bytes(artifact.path) if artifact.path in onnx_variants.values() else artifact.size_bytes,
        conversion_s=artifact.conversion_s or time.perf_counter() - started,
        op_inventory=artifact.op_inventory,
        notes=artifact.notes,
        quantization=_quantization(spec.variant, artifact),
        output_steps=artifact.output_steps,
    )
    if not target.predicts:
        return

    enter("open")
    first_batch = observations.take(feeds, spec.chunk or 1, spec.batch_axes)
    target.start_runtime(spec.threads)
    # Cold start is a timing too, given the machine alone; on an emulated device it means nothing (a pixel
    # CNN's first WebGPU session under SwiftShader took 8-11 s, all of it holding every other target off).
    timed_alone = not target.emulated()
    if timed_alone:
        gate(TIMED, measurement)
    started = time.perf_counter_ns()
    session = target.open(artifact, spec.threads, spec.settings)
    measurement.stage = FIRST_RUN  # a failure from here is named so (its stage, gate and timeline stay "open")
    session.run(first_batch)
    measurement.stage = "open"
    measurement.cold_start_ms = (time.perf_counter_ns() - started) / 1e6
    if timed_alone:
        gate(UNTIMED, measurement)
    measurement.backend = session.backend()
    try:
        _run_session(session, spec, feeds, measurement, arrays, enter)
    finally:
        _note_preparation(session.preparation(), cell_dir, measurement)
        session.close()


def _note_preparation(preparation, cell_dir: Path, measurement: Measurement) -> None:
    """A copy the target ran instead of the exported file is a workaround, said on the cell with the
    runtime's words on the exported file, and saved in the cell's folder like an --assist fix."""
    if preparation is None:
        return
    saved = []
    for name, source in preparation.files.items():
        shutil.copyfile(source, cell_dir / name)
        saved.append(f"{cell_dir.parent.name}/{cell_dir.name}/{name}")
    measurement.artifact.notes.append(workaround_note(preparation.name, preparation.exported_error, saved))


def _run_session(session, spec, feeds, measurement, arrays, enter) -> None:
    enter("contract")
    if spec.symbolic_batch:
        for batch in CONTRACT_BATCHES:
            for name, value in session.run(observations.take(feeds, batch, spec.batch_axes)).items():
                arrays[f"batch{batch}/{name}"] = value

    enter("parity")
    outputs = observations.run_in_batches(session.run, feeds, spec.chunk, spec.batch_axes)
    repeat = observations.run_in_batches(session.run, feeds, spec.chunk, spec.batch_axes)
    for name, value in outputs.items():
        arrays[f"outputs/{name}"] = value
        arrays[f"repeat/{name}"] = repeat[name]

    if spec.rollout:
        enter("rollout")
        _rollout(session, rollouts.RolloutPlan.from_dict(spec.rollout), measurement, arrays)

    enter("latency")
    measurement.latency = []
    emulated = bool(measurement.backend and measurement.backend.emulated)
    for batch in timed_batches(spec.batch_sizes, emulated):
        samples, budget_spent = timed_calls(session, observations.take(feeds, batch, spec.batch_axes), spec, emulated)
        measurement.latency.append(latency_stats(batch, samples))
        if budget_spent:
            measurement.notes.append(
                f"latency at batch {batch}: {len(samples)} of {spec.iters} calls timed within the {spec.latency_budget_s:g} s budget"
            )

    enter("placement")
    measurement.placement = session.placement()


def timed_batches(batch_sizes: list[int], emulated: bool) -> list[int]:
    """The batch sizes latency is timed at: all of them, or on an emulated adapter the smallest only.

    An emulated adapter's latency never ranks or decides (the decision reads the smallest batch, and counts
    an emulated one as no latency at all); its larger batches cost most of a conv policy's serial timing
    (SwiftShader WebGPU ~0.3 s a call at batch 64) to show nothing the smallest does not."""
    return sorted(batch_sizes)[:1] if emulated else list(batch_sizes)


PROBE_CALLS = 3  # timed first to size the warm-up and the rounds that fit the budget


def timed_calls(session, feeds, spec: CellSpec, emulated: bool = False) -> tuple[list[int], bool]:
    """Up to spec.iters timed calls in rounds, and whether spec.latency_budget_s stopped them first.

    The first round (a few calls, no warm-up) estimates one call's cost; the
    warm-up is then cut to a quarter of the budget. Samples of the probe round
    are not reported: they ran cold. A target that times fewer calls than asked
    has decided for itself: no further rounds. An emulated backend's latency
    means nothing: a warm-up and a few calls (targets.base.EMULATED_ITERS), no probe round."""
    if emulated:
        return session.time(feeds, min(spec.warmup, EMULATED_WARMUP), min(spec.iters, EMULATED_ITERS)), False
    started = time.perf_counter()
    probe = session.time(feeds, 0, PROBE_CALLS)
    per_call_s = max(float(np.median(probe)) / 1e9, 1e-7)

    def calls_that_fit(share: float) -> int:
        return int((spec.latency_budget_s - (time.perf_counter() - started)) * share / per_call_s)

    warmup = max(0, min(spec.warmup, calls_that_fit(0.25)))
    samples: list[int] = []
    while len(samples) < spec.iters:
        wanted = min(spec.iters - len(samples), calls_that_fit(1.0))
        if wanted < 1:
            return samples or probe, True
        timed = session.time(feeds, warmup, wanted)
        samples += timed
        warmup = 0
        if len(timed) < wanted:
            break
    return samples, False


def _quantization(variant: str, artifact) -> dict | None:
    """What an int8 artifact really holds: the target's own count, or the count of its ONNX file."""
    if variant != "int8":
        return None
    counted = getattr(artifact, "quantization", None)
    if counted is None and artifact.path.suffix == ".onnx" and artifact.path.is_file():
        counted = variants.quantization(onnx.load(str(artifact.path)))
    return counted


def _rollout(session, plan, measurement, arrays) -> None:
    """This runtime in the loop: one action per step at batch 1, the environment beside it."""
    measured, episode_arrays = rollouts.drive(session.run, plan, lambda progress: stage("rollout", progress))
    measurement.rollout = measured
    arrays.update(episode_arrays)


def serve() -> None:
    """`python -m matrix.run.worker --serve`: the cells of one target in turn, one cell folder per stdin line.

    The interpreter, the imports and the runtime's own start-up are paid once per target, not per
    cell. Each cell's stderr (the runtime's native output too) goes to its own worker.log. A cell
    that crashes this process costs the cells still queued for it only: the parent starts a fresh
    worker for them (cells.WorkerProcess). Each stage waits for the parent's grant (gate())."""
    global _gated
    _gated = True
    for line in sys.stdin:
        cell_dir = Path(line.strip())
        _stderr_to(cell_dir / "worker.log")
        main(cell_dir)
        print(done_message(cell_dir), flush=True)


def _stderr_to(path: Path) -> None:
    sys.stderr.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 2)
    os.close(log)


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main(Path(sys.argv[1]))
