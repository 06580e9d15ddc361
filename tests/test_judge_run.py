"""Issue 28 end to end with a real Gymnasium environment: a policy judged on the states it visits.

Pendulum-v1, 10 episodes from seed 0, ort-cpu at fp32 and int8 (ORT dynamic quantization),
the hand-written swing-up controller of tests/rollout_policies.py. Its int8 variant drifts
far beyond the int8 tolerance on single steps, yet returns what the float64 reference returns.
"""

from __future__ import annotations

import numpy as np
import pytest
import rollout_policies as policies
from conftest import load_results, run_cli

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pendulum")
    model = policies.pendulum(folder / "pendulum.onnx")
    done = run_cli("run", model, "--targets", "ort-cpu", "--variants", "fp32,int8", "--env", "Pendulum-v1",
                   "--episodes", "10", "--seed", "0", "--iters", "10", "--warmup", "2", "--out", folder / "out")
    assert done.returncode == 0, done.stderr
    return folder / "out", done


def test_int8_is_judged_by_its_paired_return_not_its_drift(pendulum_run):
    out, _ = pendulum_run
    int8 = next(cell for cell in load_results(out)["cells"] if cell["variant"] == "int8")
    rollout = int8["rollout"]
    assert int8["verdict"] == "PASS", int8["reasons"]
    assert int8["parity"][0]["tolerance_used"] > 1  # beyond the int8 drift tolerance on single steps ...
    assert any("shown, not judged: the return decides" in reason for reason in int8["reasons"])
    allowed = 0.05 * abs(rollout["reference_mean_return"])  # ... while the paired return is within 5 %
    assert -allowed < rollout["return_delta_low"] <= rollout["return_delta"] <= rollout["return_delta_high"]
    assert rollout["confidence"] == 0.95 and len(rollout["episodes"]) == 10


def test_single_step_drift_is_measured_on_states_the_environment_produced(pendulum_run):
    out, done = pendulum_run
    model = load_results(out)["model"]
    assert model["observation_kind"] == "visited" and model["observations"] == 128
    assert "10 episodes of Pendulum-v1 (seeds 0..9)" in model["observation_source"]
    with np.load(out / "observations.npz") as saved:
        states = saved["obs"].astype(np.float64)
    assert len(states) == 128  # (a controller resting at the top visits the same state often: repeats are its own)
    assert np.allclose(states[:, 0] ** 2 + states[:, 1] ** 2, 1.0, atol=1e-6)  # (cos θ, sin θ): on the circle
    assert np.abs(states[:, 2]).max() <= 8.0  # Pendulum's speed limit
    assert "observations: 128 states the float64 reference visited" in (out / "summary.md").read_text()
    assert "states the float64 reference visited" in (out / "index.html").read_text()
    assert "states the float64 reference visited" in done.stderr


def test_a_run_on_synthetic_rows_says_so_in_the_header_the_summary_and_the_reasons(tmp_path):
    model = policies.pendulum(tmp_path / "pendulum.onnx")
    done = run_cli("run", model, "--targets", "ort-cpu", "--variants", "int8", "--tolerance", "int8=1e-3",
                   "--iters", "10", "--warmup", "2", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stderr  # int8 drift beyond 1e-3 on synthetic rows: still judged, and named
    results = load_results(tmp_path / "out")
    assert results["model"]["observation_kind"] == "synthetic"
    (cell,) = results["cells"]
    assert cell["verdict"] == "FAIL" and cell["reasons"][-1].startswith("synthetic inputs: drift may come from states")
    assert "synthetic rows" in (tmp_path / "out" / "summary.md").read_text()
    assert "<strong>128 synthetic rows" in (tmp_path / "out" / "index.html").read_text()
