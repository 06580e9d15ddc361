"""`policy-matrix run` end to end on the real onnxruntime, as a user runs it."""

import csv
import json
from xml.etree import ElementTree as ET

import pytest
from conftest import EXAMPLES, load_results, run_cli

from matrix.decide import decide
from matrix.judge import noise
from matrix import results as schema
from matrix.inputs.examples import path as example
from matrix.run.protocol import STAGES

pytestmark = [pytest.mark.slow]

OUTPUT_FILES = ("index.html", "results.json", "results.jsonl", "results.csv", "summary.md", "junit.xml", "observations.npz")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_output_file_is_written_and_readable(ort_cpu_runs, name):
    out = ort_cpu_runs[name]
    for file in OUTPUT_FILES:
        assert (out / file).stat().st_size > 0, file
    results = schema.load(out / "results.json")
    assert [(c.target, c.variant) for c in results.cells] == [("ort-cpu", v) for v in ("fp32", "fp16", "int8")]
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [row["variant"] for row in rows] == ["fp32", "fp16", "int8"]
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "3"
    assert "| ort-cpu |" in (out / "summary.md").read_text()


@pytest.mark.parametrize("name", ["continuous_mlp", "pixel_cnn"])
def test_fp32_matches_reference_and_lower_precisions_drift_more(ort_cpu_runs, name):
    cells = {c["variant"]: c for c in load_results(ort_cpu_runs[name])["cells"]}
    drift = {v: max(p["max_abs"] for p in c["parity"]) for v, c in cells.items()}
    assert 0 < drift["fp32"] < 1e-5
    assert drift["fp16"] > 10 * drift["fp32"] and drift["int8"] > drift["fp16"]
    assert all(c["verdict"] == "PASS" for c in cells.values()), {v: c["reasons"] for v, c in cells.items()}


def test_discrete_policy_reports_agreement_and_flips(ort_cpu_runs):
    cells = {c["variant"]: c for c in load_results(ort_cpu_runs["discrete_mlp"])["cells"]}
    fp32 = cells["fp32"]["parity"][0]
    assert fp32["kind"] == "discrete" and fp32["agreement"] == 1.0 and fp32["flips"] == 0
    assert cells["int8"]["parity"][0]["agreement"] is not None


@pytest.mark.parametrize("name", EXAMPLES)
def test_latency_placement_and_contract_are_measured(ort_cpu_runs, name):
    data = load_results(ort_cpu_runs[name])
    node_names = set(data["model"]["node_names"])
    fp32 = data["cells"][0]
    assert [s["batch"] for s in fp32["latency"]] == [1, 64]
    for stats in fp32["latency"]:
        assert stats["n"] == 30 and 0 < stats["min_us"] <= stats["p50_us"] <= stats["p90_us"] <= stats["p99_us"]
    assert fp32["cold_start_ms"] > 0
    assert {row["node"] for row in fp32["placement"]} == node_names  # every ONNX node, placed
    assert all(row["where"] == "CPUExecutionProvider" and not row["fallback"] for row in fp32["placement"])
    assert fp32["backend"] == {"requested": "CPUExecutionProvider", "actual": "CPUExecutionProvider", "emulated": False, "detail": "",
                               "timer_resolution_us": None}  # perf_counter_ns: no coarse step to report
    checks = {c["name"]: c["ok"] for c in fp32["contract"]}
    assert checks == {"output shapes": True, "batch 1/2/7": True, "finite outputs": True, "output dtypes": True,
                      "action bounds": True, "deterministic": True}


def test_lints_are_in_the_results(ort_cpu_runs):
    lints = {item["id"]: item["level"] for item in load_results(ort_cpu_runs["continuous_mlp"])["lints"]}
    assert set(lints.values()) == {"ok"} and "symbolic-batch" in lints


def test_latency_and_cold_start_are_timed_with_no_other_stage_starting(tmp_path):
    """Two targets' workers run at once, but a timed stage is granted alone: no other cell starts a stage
    while one cell's latency runs, and the waits it took are noted (Measurement.gate_wait_s)."""
    done = run_cli("run", example("continuous_mlp"), "--targets", "ort-cpu,ort-node", "--variants", "fp32,fp16",
                   "--iters", "300", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    timelines = {d.name: json.loads((d / "measurement.json").read_text()) for d in (tmp_path / "cells").iterdir()}
    starts = [(at, name) for name, m in timelines.items() for stage, at in m["timeline"].items() if stage in STAGES]
    for name, measurement in timelines.items():
        # timing ends when the worker asks for the placement stage, before the wait for that grant
        begun = measurement["timeline"]["latency"]
        ended = measurement["timeline"]["placement"] - measurement["gate_wait_s"]["latency"]
        assert not [other for at, other in starts if begun < at < ended and other != name], name


def test_a_cell_that_hangs_is_killed_keeping_what_it_measured_and_the_run_reports(tmp_path):
    # A timed loop far longer than the timeout: the cell is killed in its latency stage, keeping the parity and
    # contract it measured before, and the run writes its report. The timeout also bounds the reference job and the
    # worker's start, so it leaves room for a busy machine's imports: at load 7 on 2 cores the reference took 1.5 s and
    # the cell reached its latency stage 0.2 s after its worker started. One cell: each hung cell costs a core for the
    # whole timeout; the cells after a killed one are tested where that costs less (test_source: a hanging source
    # beside an ort-cpu cell that passes; test_worker_reuse: the next cell gets a fresh worker).
    done = run_cli("run", example("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp32",
                   "--iters", "50000000", "--timeout", "5", "--out", tmp_path)
    assert done.returncode == 1, done.stderr
    (cell,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert cell["verdict"] == "FAIL" and cell["error"]["stage"] == "latency"
    assert "timeout" in cell["error"]["message"]
    assert cell["parity"] and {c["name"]: c["ok"] for c in cell["contract"]}["batch 1/2/7"] is True
    assert cell["parity"][0]["max_abs"] < 1e-5  # fp32 against the float64 reference
    assert (tmp_path / "index.html").exists()


def test_tolerance_override_turns_a_pass_into_a_fail(tmp_path, policy_matrix):
    done = policy_matrix(["run", example("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp16", "--iters", "5",
                          "--tolerance", "ort-cpu:fp16=1e-6", "--out", tmp_path])
    assert done.returncode == 1
    cell = load_results(tmp_path)["cells"][0]
    assert cell["verdict"] == "FAIL" and cell["tolerance"] == 1e-6 and "above tolerance" in cell["reasons"][0]


def test_recorded_observations_are_used_and_saved(tmp_path, policy_matrix):
    import numpy as np

    recorded = np.random.default_rng(5).normal(size=(20, 17)).astype(np.float32)
    np.save(tmp_path / "obs.npy", recorded)
    done = policy_matrix(["run", example("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp32", "--iters", "5",
                          "--obs", tmp_path / "obs.npy", "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    saved = np.load(tmp_path / "out" / "observations.npz")["obs"]
    assert np.array_equal(saved, recorded)
    assert load_results(tmp_path / "out")["model"]["observations"] == 20


def test_an_interrupted_run_writes_its_report_and_leaves_no_worker(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import psutil

    command = [sys.executable, "-m", "matrix", "run", str(example("continuous_mlp")), "--targets", "ort-cpu",
               "--precisions", "fp32,fp16", "--iters", "50000000", "--out", str(tmp_path)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a busy CI machine is slow; what is waited for is a state, not a time
    workers = []
    while not workers and time.monotonic() < deadline and run.poll() is None:
        workers = [p for p in psutil.Process(run.pid).children(recursive=True) if "matrix.run.worker" in _cmdline(p)]
        time.sleep(0.1)
    assert workers, "the cell's worker should be running"
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert "interrupted" in stderr and (tmp_path / "index.html").exists()
    psutil.wait_procs(workers, timeout=10)
    assert not any(worker.is_running() for worker in workers)


def _cmdline(process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # it ended (or is ending) while being looked at
        return ""


def test_matrix_toml_sets_tolerances_and_a_broken_one_exits_2(tmp_path, policy_matrix):
    (tmp_path / "matrix.toml").write_text('[tolerance]\n"ort-cpu:fp16" = 1e-7\n')
    done = policy_matrix(["run", example("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp16", "--iters", "5",
                          "--config", tmp_path / "matrix.toml", "--out", tmp_path / "out"])
    assert done.returncode == 1 and load_results(tmp_path / "out")["cells"][0]["tolerance"] == 1e-7

    (tmp_path / "broken.toml").write_text("[tolerance\n")
    done = policy_matrix([example("continuous_mlp"), "--config", tmp_path / "broken.toml",
                          "--out", tmp_path / "out2"])
    assert done.returncode == 2 and "cannot read the config" in "\n".join(done.lines), done.lines


def test_recommendation_ships_the_simplest_of_equally_fast_passing_variants(ort_cpu_runs):
    results = schema.load(ort_cpu_runs["pixel_cnn"] / "results.json")
    (decision,) = results.decision  # decided with no budget: quality and the default --prefer latency
    cells = {c.variant: c for c in results.cells}
    chosen = cells[decision.chosen.variant]
    passing = [c for c in cells.values() if c.verdict == "PASS"]
    compared = [c for c in passing if c.latency[0].n >= decide.TAIL_CALLS]  # none at --iters 30: every tail is one call's
    best_tail = min((c.latency[0].p99_us for c in compared), default=None)
    steady = [c for c in passing if c not in compared or c.latency[0].p99_us <= decide.TAIL_FACTOR * best_tail]
    fastest = min(steady, key=lambda c: c.latency[0].p50_us)

    def as_fast(cell) -> bool:  # the noise bands' rule (matrix/judge/noise.py), not the decision's own code
        return not noise.differs(noise.ratio_band(fastest.latency[0].p50_band, cell.latency[0].p50_band), decide.SAME_SPEED)

    assert chosen in steady and as_fast(chosen) and decision.chosen.why
    simpler_and_as_fast = [c for c in steady if decide.VARIANT_ORDER[c.variant] < decide.VARIANT_ORDER[chosen.variant] and as_fast(c)]
    assert not simpler_and_as_fast
