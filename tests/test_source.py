"""`--source`: the policy as its training framework runs it, as one more column, through the real CLI
with a training-side numpy module (tests/source_policies.py). The pure parts (fitting, judging, the
report's note) are in tests/unit/test_source_column.py; torch and Stable-Baselines3 sources in
tests/test_source_frameworks.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from conftest import run_cli

from matrix.errors import InputError
from matrix.inputs import model as model_loader
from matrix.inputs import observations
from matrix.reference import source
from tests.source_policies import mlp_with_source, with_scale_input

FAST = ("--targets", "ort-cpu", "--variants", "fp32", "--iters", "10", "--warmup", "2", "--batch-sizes", "1",
        "--fail-on", "never")


# --- the column through the CLI -------------------------------------------------------------------

def source_cell(out: Path) -> dict:
    cells = json.loads((out / "results.json").read_text())["cells"]
    return next(cell for cell in cells if cell["target"] == "source")


@pytest.mark.slow
def test_a_source_that_matches_its_export_passes_at_1e_5(tmp_path, policy_matrix):
    policy = mlp_with_source(tmp_path)
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "PASS" and cell["variant"] == "python"
    assert cell["parity"][0]["max_abs"] <= 1e-5
    assert cell["latency"][0]["batch"] == 1 and any("training framework's Python path" in n for n in cell["notes"])


@pytest.mark.slow
def test_a_rank_0_side_input_goes_whole_to_a_python_source_beside_each_observation(tmp_path, policy_matrix):
    """The callable takes the dict of the model's inputs: a rank-0 `scale` beside `obs` is not per row and goes whole
    to every call (the runner sliced a row of it, and the IndexError was the source cell's FAIL, the tool's)."""
    policy = mlp_with_source(tmp_path)
    onnx.save(with_scale_input(onnx.load(policy)), policy)
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act_scaled"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "PASS" and cell["error"] is None, cell
    assert cell["parity"][0]["max_abs"] <= 1e-5 and cell["latency"], cell


@pytest.mark.slow
def test_a_rescale_outside_the_graph_is_named_and_its_returns_are_the_top_behaviour_row(tmp_path, policy_matrix):
    policy = mlp_with_source(tmp_path)
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act_rescaled",
                          "--env", "Pendulum-v1", "--episodes", "2"])
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
def test_a_framework_far_better_than_its_export_fails_the_export(tmp_path, policy_matrix):
    """tianshou's DDPG on Pendulum (the frameworks table): the framework's return -82.6, its ONNX export's -1015.7, and the
    source column said PASS: the behaviour rule's "a better return never warns" is right for a runtime beside the
    reference, wrong for the framework beside its own export, where better means the export lost something."""
    policy = mlp_with_source(tmp_path)
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act_retrained",
                          "--env", "Pendulum-v1", "--episodes", "3"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["rollout"]["mean_return"] > cell["rollout"]["reference_mean_return"] + 300, cell["rollout"]
    assert cell["verdict"] == "FAIL", cell["reasons"]
    assert any(line.startswith("behaviour:") and line.endswith(
        "better beyond the tolerance: the exported graph behaves worse than the policy it was exported from")
        for line in cell["reasons"]), cell["reasons"]


@pytest.mark.slow
@pytest.mark.parametrize("function, normalize, words", [
    ("act", True, "export: the source normalises observations with its statistics (--source-normalize); "
                  "the ONNX graph does not"),
    ("act_pixels", False, "export: the source divides observations by 255; the ONNX graph does not"),
])
def test_preprocessing_missing_from_the_export_is_caught_and_named(tmp_path, function, normalize, words, policy_matrix):
    policy = mlp_with_source(tmp_path)
    statistics = ("--source-normalize", tmp_path / "normalizer.npz") if normalize else ()
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", f"python:trained_policy:{function}",
                          *statistics])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "FAIL"
    assert cell["reasons"][0].startswith(words)


@pytest.mark.slow
@pytest.mark.parametrize("function, words", [("act_crashes", "RuntimeError: the checkpoint needs a GPU"),
                                             ("act_hangs", "timed out after 5 s (--timeout)")])
def test_a_source_that_crashes_or_hangs_is_one_failed_cell_with_the_reason(tmp_path, function, words, policy_matrix):
    policy = mlp_with_source(tmp_path)
    # The hang costs its whole --timeout of waiting. 5 s is ~10x what the ort-cpu cell needs and ~3x the reference job
    # on a loaded 2-core machine (load 7: 0.3 s and 1.5 s); the hanging source fails with these words wherever the
    # timeout finds it, in its imports or in act().
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--timeout", "5",
                          "--source", f"python:trained_policy:{function}"])
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "FAIL" and words in cell["reasons"][0]
    assert next(c for c in json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
                if c["target"] == "ort-cpu")["verdict"] == "PASS"


# A user's module that leaves the pid of each process importing it beside it, one line per import.
COUNTED_MODULE = """import os
from pathlib import Path

from trained_policy import act

with Path(__file__).with_name("imports.log").open("a") as log:
    log.write(f"{os.getpid()}\\n")
"""


def counted_source(folder: Path) -> Path:
    """policy.onnx with its training code, as counted_policy:act, whose imports are written to imports.log."""
    policy = mlp_with_source(folder)
    (folder / "counted_policy.py").write_text(COUNTED_MODULE)
    return policy


def imported_by(folder: Path) -> list[int]:
    return [int(pid) for pid in (folder / "imports.log").read_text().split()]


@pytest.mark.slow
def test_the_training_interpreter_imports_the_source_once_per_run(tmp_path, policy_matrix):
    # The check (a missing package is exit 2) and the column share one training interpreter: torch or SB3 is imported
    # once per run (2.5-7 CPU s), not once to check and again to run.
    policy = counted_source(tmp_path)
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:counted_policy:act"])
    assert done.returncode == 0, done.stderr
    assert source_cell(tmp_path / "out")["verdict"] == "PASS"
    assert len(imported_by(tmp_path)) == 1


@pytest.mark.slow
def test_the_columns_timeout_counts_its_work_not_its_wait_for_the_column(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = counted_source(tmp_path)
    checked = source.preflight(source.parse("python:counted_policy:act", None, None), None, 60)
    timeout_s = 3.0  # 20x the column's work here (0.15 s at load 2.4)
    time.sleep(timeout_s + 1)  # the checked process waits for its column longer than the column's --timeout...
    assert checked.column.process.poll() is None
    outcome = source.execute(checked, column_inputs(policy, timeout_s), tmp_path / "source", lambda stage: None)
    assert outcome.measurement.error is None and outcome.measurement.latency  # ...and its column still runs whole
    assert len(imported_by(tmp_path)) == 1


@pytest.mark.slow
def test_a_source_that_hangs_on_import_is_its_cells_timeout_where_it_hangs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = mlp_with_source(tmp_path)
    (tmp_path / "hangs_on_import.py").write_text("import threading\n\nthreading.Event().wait()\n")
    spec = source.preflight(source.parse("python:hangs_on_import:act", None, None), None, 1)
    assert spec.column is None  # no answer in time is not exit 2: the column starts a process of its own
    outcome = source.execute(spec, column_inputs(policy, 3), tmp_path / "source", lambda stage: None)
    assert (outcome.measurement.error.stage, outcome.measurement.error.message) == ("open", "timed out after 3 s (--timeout)")


def column_inputs(policy: Path, timeout_s: float) -> source.ColumnInputs:
    """The column's share of a run: 16 observations beside the policy, 10 timed calls, no memory cap, no episodes."""
    path = policy.with_name("observations.npz")
    observations.save({"obs": np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)}, path)
    return source.ColumnInputs(model_loader.load(policy), path, 0, 2, 10, timeout_s, None, None, {})


@pytest.mark.slow
def test_a_run_that_ends_before_its_column_leaves_no_training_interpreter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = counted_source(tmp_path)
    done = run_cli("run", policy, "--targets", "ort-cpu", "--source", "python:counted_policy:act",
                   "--baseline", tmp_path / "no-such-results.json")  # refused after the source was checked
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    [checked_in] = imported_by(tmp_path)
    gone_by = time.monotonic() + 30  # the kill is immediate; the deadline only bounds a broken case
    while _running(checked_in):
        assert time.monotonic() < gone_by, "the checked training interpreter outlived the run"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_an_interpreter_without_the_framework_is_exit_2_naming_the_package(tmp_path, policy_matrix):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("this interpreter has torch: it cannot stand for one that lacks it")
    policy = mlp_with_source(tmp_path)
    done = policy_matrix(["run", policy, "--targets", "ort-cpu", "--source", "torch:trained_policy:act"])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"policy-matrix: error: --source torch:trained_policy:act: {sys.executable} lacks the package 'torch' "
        "(install it in the training environment, or pass that environment's --source-python)"]


@pytest.mark.slow
def test_a_framework_the_users_module_imports_and_the_interpreter_lacks_is_exit_2(tmp_path, policy_matrix):
    policy = mlp_with_source(tmp_path)
    (tmp_path / "flax_policy.py").write_text("import not_an_installed_framework\n\ndef act(obs):\n    return obs\n")
    done = policy_matrix(["run", policy, "--targets", "ort-cpu", "--source", "python:flax_policy:act"])
    assert done.returncode == 2
    assert done.stderr.strip() == (f"policy-matrix: error: --source python:flax_policy:act: {sys.executable} lacks the package "
                                   "'not_an_installed_framework' (install it in the training environment, or pass that "
                                   "environment's --source-python)")


@pytest.mark.slow
def test_an_interpreter_without_numpy_is_exit_2_naming_numpy(tmp_path, policy_matrix):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "bare"], check=True)
    policy = mlp_with_source(tmp_path)
    done = policy_matrix(["run", policy, "--targets", "ort-cpu", "--source", "python:trained_policy:act",
                          "--source-python", tmp_path / "bare" / "bin" / "python"])
    assert done.returncode == 2
    assert "lacks the package 'numpy'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text, normalize, words", [
    ("keras:model.h5", None, "--source 'keras:model.h5': expected one of sb3:PATH.zip"),
    ("sb3:missing.zip", None, "missing.zip: no such --source checkpoint file"),
    ("sb3:fifo.zip", None, "fifo.zip: the --source checkpoint file is a FIFO, not a regular file: refused"),
    ("python:trained_policy", None, "expected python:MODULE:FUNC"),
    ("torch:../evil:make", None, "expected torch:MODULE:ATTR"),
    ("python:trained_policy:act", Path("missing.npz"), "missing.npz: no such --source-normalize statistics file"),
    # a FIFO was called 'no such file', the words of a file that is not there
    ("python:trained_policy:act", Path("fifo.zip"), "fifo.zip: the --source-normalize statistics file is a FIFO, not a regular file"),
])
def test_a_malformed_source_is_refused_before_anything_runs(tmp_path, monkeypatch, text, normalize, words):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.zip")
    with pytest.raises(InputError, match=re.escape(words)):
        source.parse(text, None, normalize)


@pytest.mark.parametrize("statistics, words", [
    ({"mean/observation": np.zeros(3), "var/observation": np.ones(3)}, "--source-normalize holds statistics for the keys "
     "['observation'], which are not the model's observation inputs ['obs'] (stats.npz)"),
    ({"mean": np.zeros(3)}, "--source-normalize holds no var beside mean (stats.npz)"),
    ({"mean": np.zeros(3), "var": np.array([{"pickled": 1}], dtype=object)},
     "stats.npz: array 'var' is a pickled object array: refused (pickles are never loaded)"),
    # a shape for another observation, a NaN and a negative variance were the source cell's FAIL on numpy's
    # broadcasting words, or NaN observations fed to the framework
    ({"mean": np.zeros(4), "var": np.ones(4)}, "stats.npz: 'mean' has shape [4], one observation of its input has [3]"),
    ({"mean": np.full(3, np.nan), "var": np.ones(3)}, "stats.npz: 'mean' holds a value that is not a finite number"),
    ({"mean": np.zeros(3), "var": -np.ones(3)}, "stats.npz: 'var' holds a negative variance: no statistics a normaliser keeps"),
])
def test_an_npz_normalizer_not_for_the_models_inputs_is_one_line_before_anything_runs(tmp_path, statistics, words,
                                                                                       policy_matrix):
    """Its keys were read in the training interpreter, so a mismatch was the source cell's FAIL after the whole run.
    The check reads the names (no array, never a pickle) and refuses there; the training interpreter never starts."""
    policy = mlp_with_source(tmp_path)
    np.savez(tmp_path / "stats.npz", **statistics)
    done = policy_matrix(["run", policy, *FAST, "--out", tmp_path / "out", "--source", "python:trained_policy:act",
                          "--source-normalize", tmp_path / "stats.npz"])
    assert done.returncode == 2 and done.stderr.strip().endswith(words) and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_source_interpreter_is_refused():
    with pytest.raises(InputError, match="--source-python /no/such/python: no such executable"):
        source.parse("python:trained_policy:act", "/no/such/python", None)


@pytest.mark.slow
def test_source_options_without_a_source_are_one_line_and_exit_2(tmp_path, policy_matrix):
    policy = mlp_with_source(tmp_path)
    done = policy_matrix(["run", policy, "--targets", "ort-cpu", "--source-normalize", tmp_path / "normalizer.npz"])
    assert done.returncode == 2
    assert done.stderr.strip() == "policy-matrix: error: --source-python and --source-normalize need --source"
