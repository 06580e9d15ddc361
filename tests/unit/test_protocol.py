"""The cell protocol on both sides of the seam: what the worker writes is what the judge reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from matrix.run import cells, guarded
from matrix import options
from matrix.configuration import Configuration
from matrix.judge import judge as judge_module
from matrix.judge.judge import Evidence, Judge
from matrix.run.protocol import MEASUREMENT_FILE, STAGES, CellInputs, CellSpec, Measurement
from matrix.reference.reference import Reference
from matrix.results import ArtifactInfo, Backend, CellError, LatencyStats, Placement
from targets.base import VARIANTS, BackendInfo, PlacementRow


def _inputs() -> CellInputs:
    return CellInputs(observations="obs.npz", onnx_variants={"fp32": "m.onnx"}, chunk=4, batch_axes={"obs": 0})


def test_a_cells_spec_is_the_runs_inputs_plus_its_axes_and_round_trips(tmp_path):
    configuration = Configuration.of("ort-cpu@1.20.1", "fp32", "student.onnx", {"threads": "2"})
    spec = _inputs().for_cell(configuration, iters=5)
    assert (spec.target, spec.variant, spec.candidate, spec.settings, spec.iters) == (
        "ort-cpu@1.20.1", "fp32", "student.onnx", {"threads": "2"}, 5)
    assert (spec.chunk, spec.batch_axes, spec.warmup) == (4, {"obs": 0}, options.DEFAULT_WARMUP)
    assert spec.configuration == configuration
    spec.write(tmp_path)
    assert CellSpec.read(tmp_path) == spec


def test_a_derived_cell_drives_no_episodes_unless_asked():
    """Diagnosis and fix attempts are judged on parity: a rollout there would be measured and thrown away."""
    inputs = CellInputs(observations="obs.npz", onnx_variants={}, rollout={"env": "CartPole-v1", "episodes": 10})
    plain = Configuration("ort-cpu", "fp32")
    assert inputs.for_cell(plain).rollout is None
    assert inputs.for_cell(plain, rollout=True).rollout == {"env": "CartPole-v1", "episodes": 10}


def test_a_measurement_round_trips_with_the_targets_own_records(tmp_path):
    measured = Measurement(
        stage="done", runtime_version="1.2", cold_start_ms=3.5,
        artifact=ArtifactInfo(size_bytes=10, conversion_s=0.1, op_inventory={"Gemm": 2}),
        backend=BackendInfo("webgpu", "wasm", emulated=True, detail="swiftshader"),
        placement=[PlacementRow("fc0", "Gemm", "CPU", True)],
        latency=[LatencyStats(batch=1, n=3, p50_us=1, p90_us=2, p99_us=3, mean_us=2, std_us=1, min_us=1)],
    )
    measured.save(tmp_path)
    read = Measurement.read(tmp_path)
    assert read == measured
    assert isinstance(read.backend, Backend) and not read.backend.matches
    assert isinstance(read.placement[0], Placement) and read.placement[0].fallback


def test_an_absent_or_cut_short_measurement_is_none_and_a_wrong_one_is_the_workers_error(tmp_path):
    assert Measurement.read(tmp_path) is None
    (tmp_path / MEASUREMENT_FILE).write_text('{"stage": "lat')
    assert Measurement.read(tmp_path) is None
    (tmp_path / MEASUREMENT_FILE).write_text(json.dumps({"stage": "done", "latency": "fast"}))
    wrong = Measurement.read(tmp_path)
    assert wrong.error.stage == "start" and f"invalid {MEASUREMENT_FILE}" in wrong.error.message


def _ending(tmp_path: Path, returncode: int, last_stage: str = "placement") -> guarded.Ending:
    (tmp_path / "worker.log").write_text("")
    return guarded.Ending(returncode, 1.0, False, last_stage, 60.0, None, tmp_path / "worker.log")


def test_a_worker_killed_after_its_last_stage_still_fails_in_the_stage_it_reported(tmp_path):
    Measurement(stage="done").save(tmp_path)
    measured = cells._measurement(tmp_path, _ending(tmp_path, -9))
    assert measured.error == CellError(stage="placement", message="killed by signal 9 (SIGKILL) after 1.0 s")


def test_a_worker_killed_mid_stage_keeps_what_it_measured(tmp_path):
    Measurement(stage="latency", runtime_version="1.2").save(tmp_path)
    measured = cells._measurement(tmp_path, _ending(tmp_path, -9, last_stage="latency"))
    assert measured.runtime_version == "1.2" and measured.error.stage == "latency"


def test_the_judge_reads_a_skip_and_an_unfinished_worker_from_the_measurement():
    evidence, cell = Evidence(model=None, reference=Reference({}, {})), dict(host="h", target="t", variant="fp32", predicts=True)
    skipped = Judge().cell(cells.CellOutcome(Measurement(stage="prepare", skip="needs macOS"), {}, 0.1), evidence, **cell)
    assert (skipped.verdict, skipped.reasons) == ("SKIP", ["needs macOS"])
    stopped = Judge().cell(cells.CellOutcome(Measurement(stage="open", runtime_version="9"), {}, 2.0), evidence, **cell)
    assert stopped.verdict == "FAIL" and stopped.runtime_version == "9"
    assert stopped.reasons == ["open: the worker stopped during open after 2.0 s (killed on timeout or out of memory, or crashed)"]


def test_a_service_that_cannot_start_is_that_cells_failure_in_the_service_stage():
    outcome = cells.CellOutcome.failed("service", "RuntimeError: no browser")
    assert outcome.measurement.error == CellError(stage="service", message="RuntimeError: no browser")
    assert outcome.arrays == {} and "service" not in STAGES  # the core's stage, not the worker's


def test_the_default_variants_are_every_variant_the_targets_know():
    assert options.DEFAULT_VARIANTS == VARIANTS


def test_a_late_stage_failure_keeps_parity_only_with_outputs():
    assert judge_module._measured_parity(CellError(stage="latency", message="x"), {"outputs/a": np.zeros(1)})
    assert not judge_module._measured_parity(CellError(stage="latency", message="x"), {})
    assert not judge_module._measured_parity(CellError(stage="parity", message="x"), {"outputs/a": np.zeros(1)})


def test_numpy_scalars_from_an_environment_are_written_as_numbers(tmp_path):
    Measurement(stage="done", rollout={"seeds": [np.int64(3)], "discrete": np.bool_(True), "seconds": np.float32(0.5)}).save(tmp_path)
    assert Measurement.read(tmp_path).rollout == {"seeds": [3], "discrete": True, "seconds": 0.5}


def test_stage_lines_read_back_and_runtime_chatter_is_no_message():
    from matrix.run.protocol import done_message, read_message, stage_message

    assert read_message(stage_message("rollout", "2/10 episodes")) == {"stage": "rollout", "progress": "2/10 episodes"}
    assert read_message(stage_message("latency")) == {"stage": "latency"}
    assert read_message(done_message(Path("/c"))) == {"done": "/c"}
    assert [read_message(line) for line in ("2026-01-01 [W] onnxruntime warning", "[1, 2]", "")] == [None, None, None]
