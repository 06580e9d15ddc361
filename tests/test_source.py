"""`--source`: the policy as its training framework runs it, as one more column.

The fitting of contract differences is pure numpy and tested directly; the column itself runs
the real CLI with a real training-side module (numpy), torch's nn.Module and TorchScript (in the
Core ML environment's interpreter, which has torch) and Stable-Baselines3 (installed into a
cached environment over that torch).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from matrix import source
from matrix.cells import CellOutcome
from matrix.errors import InputError
from matrix.protocol import Measurement
from matrix.reference import Reference
from matrix.source_fit import DIVIDE_255, NORMALIZE, Bounds, explain, rescale
from tests.source_policies import mlp_with_source

PENDULUM = Bounds(np.array([-2.0]), np.array([2.0]))
TOLERANCE = 1e-4
FAST = ("--targets", "ort-cpu", "--variants", "fp32", "--iters", "10", "--warmup", "2", "--batch-sizes", "1",
        "--fail-on", "never")


def _tanh_outputs(rows: int = 64, scale: float = 1.0) -> np.ndarray:
    return np.tanh(np.random.default_rng(0).normal(0, 2, (rows, 1))) * scale


# --- naming a contract difference by fitting -------------------------------------------------------

def test_a_rescale_to_the_action_space_is_named_and_a_clip_is_not():
    reference = _tanh_outputs()
    found = explain(rescale(reference, PENDULUM), reference, TOLERANCE, PENDULUM)
    assert found.transform == "rescale"
    assert found.text == "the source rescales [-1, 1] to the action space [-2, 2]; the ONNX graph does not"


def test_a_clip_to_the_action_space_is_named_when_the_graph_leaves_the_space():
    reference = _tanh_outputs(scale=3.0)  # an unsquashed Gaussian mean, as PPO's documented export returns
    found = explain(np.clip(reference, -2, 2), reference, TOLERANCE, PENDULUM)
    assert found.transform == "clip"
    assert "clips actions to the action space [-2, 2]" in found.text


def test_the_other_direction_says_the_graph_does_it():
    source = _tanh_outputs()
    assert explain(source, rescale(source, PENDULUM), TOLERANCE, PENDULUM).transform == "onnx-rescales"


def test_observation_transforms_are_named_from_the_reference_on_transformed_observations():
    reference, on_pixels = _tanh_outputs(), _tanh_outputs(scale=0.5)
    found = explain(on_pixels, reference, TOLERANCE, PENDULUM, {DIVIDE_255: on_pixels, NORMALIZE: reference})
    assert found.transform == DIVIDE_255 and "divides observations by 255" in found.text


def test_nothing_is_named_when_outputs_agree_or_no_transform_explains_them():
    reference = _tanh_outputs()
    assert explain(reference + 1e-6, reference, TOLERANCE, PENDULUM) is None
    noisy = reference + np.random.default_rng(1).normal(0, 0.1, reference.shape)
    assert explain(noisy, reference, TOLERANCE, PENDULUM, {DIVIDE_255: reference * 0.3}) is None


def test_without_an_action_space_an_affine_map_is_fitted_and_said_as_such():
    reference = _tanh_outputs()
    found = explain(3.0 * reference + 0.5, reference, TOLERANCE)
    assert found.transform == "affine" and "x 3 + 0.5" in found.text


# --- judging the column -----------------------------------------------------------------------------

def _rules(reference: np.ndarray) -> source.Judging:
    return source.Judging(host="h", reference=Reference({"action": reference}, {}), dev_runtime=None, tolerance=TOLERANCE,
                          tie_margin=1e-3, min_agreement=0.99, reference_rollout=None, rollout=None, return_tolerance=None)


def _judged(answers: np.ndarray, reference: np.ndarray, facts: dict | None = None):
    spec = source.SourceSpec("python", "trained_policy:act", sys.executable)
    outcome = CellOutcome(Measurement(stage="done"), {"outputs/action": answers}, 1.0)
    return source.judge(spec, outcome, facts or {}, _rules(reference))


def test_the_column_is_judged_by_the_cell_rules_and_names_the_difference_first():
    reference = _tanh_outputs()
    cell = _judged(rescale(reference, PENDULUM).reshape(len(reference), -1).astype(np.float32), reference,
                   {"action_space": {"low": [-2.0], "high": [2.0]}})
    assert (cell.target, cell.variant, cell.verdict) == ("source", "python", "FAIL")
    assert cell.reasons[0].startswith("export: the source rescales [-1, 1] to the action space [-2, 2]")
    assert cell.reasons[1].startswith("action: drift")


def test_answers_that_fit_no_output_are_a_skip_not_the_exports_verdict():
    reference = _tanh_outputs()
    cell = _judged(np.zeros((len(reference), 2)), reference)
    assert cell.verdict == "SKIP" and not cell.parity
    assert "fit none of the ONNX outputs (action [1])" in cell.reasons[0]


# --- the column through the CLI -------------------------------------------------------------------

def run_in(folder: Path, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI run from the folder that holds the user's training module, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "matrix", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=folder, env=env)


def source_cell(out: Path) -> dict:
    cells = json.loads((out / "results.json").read_text())["cells"]
    return next(cell for cell in cells if cell["target"] == "source")


@pytest.mark.slow
def test_a_source_that_matches_its_export_passes_at_1e_5(tmp_path):
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act")
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "PASS" and cell["variant"] == "python"
    assert cell["parity"][0]["max_abs"] <= 1e-5
    assert cell["latency"][0]["batch"] == 1 and any("training framework's Python path" in n for n in cell["notes"])


@pytest.mark.slow
def test_a_rescale_outside_the_graph_is_named_and_its_returns_are_the_top_behaviour_row(tmp_path):
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act_rescaled",
                  "--env", "Pendulum-v1", "--episodes", "2")
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    cell = results["cells"][0]
    assert cell["target"] == "source" and cell["verdict"] == "FAIL"
    assert cell["reasons"][0].startswith("export: the source rescales [-1, 1] to the action space [-2, 2]; the ONNX graph does not")
    ort = next(c for c in results["cells"] if c["target"] == "ort-cpu")
    assert cell["rollout"]["reference_mean_return"] == pytest.approx(ort["rollout"]["reference_mean_return"])
    assert cell["rollout"]["mean_return"] != pytest.approx(cell["rollout"]["reference_mean_return"])
    assert results["settings"]["source"]["source"] == "python:trained_policy:act_rescaled"


@pytest.mark.slow
def test_a_normaliser_missing_from_the_export_is_caught_and_named(tmp_path):
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act",
                  "--source-normalize", tmp_path / "normalizer.npz")
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "FAIL"
    assert cell["reasons"][0].startswith("export: the source normalises observations with its statistics")


@pytest.mark.slow
@pytest.mark.parametrize("function, words", [("act_crashes", "RuntimeError: the checkpoint needs a GPU"),
                                             ("act_hangs", "timed out after 20 s (--timeout)")])
def test_a_source_that_crashes_or_hangs_is_one_failed_cell_with_the_reason(tmp_path, function, words):
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, *FAST, "--out", tmp_path / "out", "--timeout", "20",
                  "--source", f"python:trained_policy:{function}")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "FAIL" and words in cell["reasons"][0]
    assert next(c for c in json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
                if c["target"] == "ort-cpu")["verdict"] == "PASS"


@pytest.mark.slow
def test_an_interpreter_without_the_framework_is_exit_2_naming_the_package(tmp_path):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("this interpreter has torch: it cannot stand for one that lacks it")
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, "--targets", "ort-cpu", "--source", "torch:trained_policy:act")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"policy-matrix: error: --source torch:trained_policy:act: {sys.executable} lacks the package 'torch' "
        "(install it in the training environment, or pass that environment's --source-python)"]


@pytest.mark.slow
def test_an_interpreter_without_numpy_is_exit_2_naming_numpy(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "bare"], check=True)
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, "--targets", "ort-cpu", "--source", "python:trained_policy:act",
                  "--source-python", tmp_path / "bare" / "bin" / "python")
    assert done.returncode == 2
    assert "lacks the package 'numpy'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text, normalize, words", [
    ("keras:model.h5", None, "--source 'keras:model.h5': expected one of sb3:PATH.zip"),
    ("sb3:missing.zip", None, "no such file 'missing.zip'"),
    ("python:trained_policy", None, "expected python:MODULE:FUNC"),
    ("torch:../evil:make", None, "expected torch:MODULE:ATTR"),
    ("python:trained_policy:act", Path("missing.npz"), "--source-normalize missing.npz: no such file"),
])
def test_a_malformed_source_is_refused_before_anything_runs(tmp_path, monkeypatch, text, normalize, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=re.escape(words)):
        source.parse(text, None, normalize)


def test_a_missing_source_interpreter_is_refused():
    with pytest.raises(InputError, match="--source-python /no/such/python: no such executable"):
        source.parse("python:trained_policy:act", "/no/such/python", None)


@pytest.mark.slow
def test_source_options_without_a_source_are_one_line_and_exit_2(tmp_path):
    policy = mlp_with_source(tmp_path)
    done = run_in(tmp_path, "run", policy, "--targets", "ort-cpu", "--source-normalize", tmp_path / "normalizer.npz")
    assert done.returncode == 2
    assert done.stderr.strip() == "policy-matrix: error: --source-python and --source-normalize need --source"
