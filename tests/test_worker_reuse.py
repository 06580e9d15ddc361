"""One worker process serves all variants of a target; a crash in one variant costs that cell only.

Real workers running onnxruntime on the bundled MLP; the crash is a real SIGKILL of the
worker while it times a cell. Waits are for states (a stage reported), never fixed sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from matrix.run import cells, variants
from matrix.run.protocol import TIMED
from matrix.inputs import observations
from matrix.inputs.examples import path as example
from matrix.inputs.model import load

pytestmark = [pytest.mark.slow]  # real worker processes, killed and timed out

STATE_TIMEOUT_S = 300  # CI is a busy 2-core machine: a state that never comes fails the test


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> cells.CellSpec:
    folder = tmp_path_factory.mktemp("reuse")
    info = load(example("continuous_mlp"))
    observations.save(observations.seeded(info, 16, 0), folder / "obs.npz")
    paths, errors = variants.produce_all(info, ["fp32", "fp16", "int8"], folder)
    return cells.CellSpec(target="ort-cpu", variant="fp32", observations=str(folder / "obs.npz"),
                          onnx_variants={k: str(v) for k, v in paths.items()}, variant_errors=errors,
                          batch_sizes=[1], warmup=2, iters=10, batch_axes=info.batch_axes)


def _serve(worker: cells.WorkerProcess, folder: Path, spec: cells.CellSpec, on_stage=lambda _: None) -> cells.CellOutcome:
    return cells.execute(folder, spec, {}, 600, on_stage, None, worker)


def _pid(folder: Path) -> int:
    return json.loads((folder / "measurement.json").read_text())["worker_pid"]


def test_one_worker_serves_every_variant_and_a_crash_costs_only_its_cell(tmp_path, template):
    worker = cells.WorkerProcess(memory_limit=None, lifetime_s=600)
    try:
        fp32 = _serve(worker, tmp_path / "fp32", template)
        int8 = _serve(worker, tmp_path / "int8", cells.CellSpec(**{**vars(template), "variant": "int8"}))
        assert fp32.measurement.stage == int8.measurement.stage == "done"
        first = _pid(tmp_path / "fp32")
        assert _pid(tmp_path / "int8") == first  # one process, both variants
        assert "worker_started" in fp32.measurement.timeline and "worker_started" not in int8.measurement.timeline

        timing = threading.Event()
        endless = cells.CellSpec(**{**vars(template), "variant": "fp16", "iters": 50_000_000})  # never ends by itself
        crashed: list[cells.CellOutcome] = []
        serving = threading.Thread(target=lambda: crashed.append(
            _serve(worker, tmp_path / "fp16", endless, lambda stage: stage == "latency" and timing.set())))
        serving.start()
        assert timing.wait(STATE_TIMEOUT_S), "the fp16 cell never reached its latency stage"
        os.kill(first, signal.SIGKILL)
        serving.join(STATE_TIMEOUT_S)
        (fp16,) = crashed
        assert fp16.measurement.error.stage == "latency"
        assert fp16.measurement.error.message.startswith("killed by signal 9 (SIGKILL)")
        assert "outputs/action" in fp16.arrays  # what it measured before the crash is kept

        after = _serve(worker, tmp_path / "fp32-after", template)
        assert after.measurement.stage == "done" and after.measurement.error is None
        assert _pid(tmp_path / "fp32-after") != first  # the remaining variants run in a fresh worker
        assert "worker_started" in after.measurement.timeline
    finally:
        worker.stop()


def test_a_worker_starts_only_when_no_timed_stage_runs(tmp_path, template):
    """A worker's start (its fork and imports) is untimed work: while another target's latency is timed it
    waits, holding no process, instead of running beside it."""
    gate = cells.StageGate()
    gate.acquire(TIMED)  # another target's latency
    worker = cells.WorkerProcess(memory_limit=None, lifetime_s=600, gate=gate)
    served: list[cells.CellOutcome] = []
    serving = threading.Thread(target=lambda: served.append(_serve(worker, tmp_path / "fp32", template)))
    try:
        serving.start()
        serving.join(2.0)  # a worker that did not wait has been forked well within this
        assert worker.process is None
        released = time.time()
        gate.release(TIMED)
        serving.join(STATE_TIMEOUT_S)
        (outcome,) = served
        assert outcome.measurement.stage == "done"
        assert outcome.measurement.timeline["worker_started"] >= released
    finally:
        gate.close()  # a thread still waiting for the grant gives up
        serving.join(STATE_TIMEOUT_S)
        worker.stop()


def test_a_hung_cell_times_out_and_the_next_cell_gets_a_fresh_worker(tmp_path, template):
    worker = cells.WorkerProcess(memory_limit=None, lifetime_s=600)
    try:
        _serve(worker, tmp_path / "before", template)
        endless = cells.CellSpec(**{**vars(template), "iters": 50_000_000, "latency_budget_s": 3600.0})
        # 50 million timed calls end within no timeout, wherever the kill finds the cell (its stage is not asked):
        # a short one proves the same, and each second of it burns a core beside the other tests.
        hung = cells.execute(tmp_path / "hung", endless, {}, 2, lambda _: None, None, worker)
        assert hung.measurement.error.message == "timed out after 2 s (--timeout)"
        after = _serve(worker, tmp_path / "after", template)
        assert after.measurement.stage == "done" and "worker_started" in after.measurement.timeline
        assert _pid(tmp_path / "after") != _pid(tmp_path / "before")
    finally:
        worker.stop()
