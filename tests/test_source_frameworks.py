"""`--source` with real training frameworks in their own interpreter: torch (nn.Module, TorchScript)
from the Core ML environment, and Stable-Baselines3 installed over that torch in a cached venv.

Installing stable-baselines3 over the existing torch took ~52 s here (gymnasium, cloudpickle,
pandas and matplotlib come with it); the venv is kept under the cache and reused, and so are the SB3
policies it trains and exports (~11 s) and the torch policy's exports (~7 s), keyed by the script that makes them
and the interpreter.
The runs are `cli.main()` in the test process (policy_matrix), from the folder that holds the
user's training files, as a user runs them there.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from targets import coreml_conversion
from targets.build_once import exclusive
from targets.isolated_env import env_python
from targets.paths import cache_dir
from tests.source_policies import (SB3_TRAIN_EXPORT, TORCH_EXPORT, TORCH_FLAG_EXPORT, TORCH_MODULE, TORCH_PIXEL_EXPORT,
                                   cached_policies, sb3_with_sources, torch_script_exports, torch_with_source)
from tests.test_source import FAST, source_cell

pytestmark = [pytest.mark.slow, pytest.mark.coreml_env]

SB3_PIN = "stable-baselines3==2.9.2"


@pytest.fixture(scope="module")
def torch_python() -> Path:
    python = env_python(coreml_conversion.ENV_NAME, coreml_conversion.REQUIREMENTS)
    if python is None:
        pytest.skip("needs the Core ML environment's torch: policy-matrix setup coreml")
    return python


@pytest.fixture(scope="module")
def sb3_python(torch_python: Path) -> Path:
    """A venv over the Core ML environment's packages (a .pth file: torch is not installed twice) with SB3, made once
    under the cache's lock (xdist's workers share it). Made where it lives, `.complete` last, as
    isolated_env.ensure_env makes environments: a venv's scripts name the folder it was made in, so unlike
    `cached_policies` it cannot be made aside and renamed into place (build_once)."""
    folder = cache_dir() / "envs" / f"sb3-test-{SB3_PIN.split('==')[1]}-{torch_python.parent.parent.name}"
    python = folder / "bin" / "python"
    with exclusive(folder):
        if not (folder / ".complete").exists():
            subprocess.run([str(torch_python), "-m", "venv", "--clear", str(folder)], check=True, timeout=300)
            site = next((torch_python.parent.parent / "lib").glob("python3*/site-packages"))
            next((folder / "lib").glob("python3*/site-packages")).joinpath("torch-env.pth").write_text(f"{site}\n")
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", SB3_PIN],
                           check=True, timeout=900)
            (folder / ".complete").touch()
    return python


@pytest.fixture(scope="module")
def torch_policy(torch_python) -> Path:
    """torch_policy.py and its two exports (policy.onnx, policy.pt): one torch process makes both."""
    return cached_policies("torch", TORCH_MODULE + TORCH_EXPORT, torch_python, torch_with_source)


@pytest.mark.parametrize("spec", ["torch:torch_policy:make_policy", "torchscript:policy.pt"])
def test_an_nn_module_whose_export_matches_passes_export_parity_at_1e_5(torch_policy, tmp_path, torch_python, spec,
                                                                       policy_matrix, monkeypatch):
    _linked(torch_policy, ("torch_policy.py", "policy.onnx", "policy.pt"), tmp_path)
    monkeypatch.chdir(tmp_path)  # where `torch:torch_policy:...` imports the user's module from
    done = policy_matrix(["run", tmp_path / "policy.onnx", *FAST, "--out", tmp_path / "out", "--source", spec,
                          "--source-python", torch_python, "--tolerance", "source:*=1e-5"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "PASS", cell["reasons"]
    assert cell["parity"][0]["max_abs"] <= 1e-5 and cell["tolerance"] == 1e-5
    assert "torch 2." in cell["runtime_version"]


@pytest.mark.parametrize("spec", ["torch:flag_policy:make_policy", "torchscript:flag_policy.pt"])
def test_a_rank_0_side_input_is_fed_whole_to_a_torch_module_and_compared(torch_python, tmp_path, spec, policy_matrix,
                                                                           monkeypatch):
    """A module exported with a bool `deterministic` (rank 0) beside `obs`: the runner sliced a row of every input, and
    the rank-0 array's IndexError was the source cell's FAIL, a verdict the tool caused (so was torch.where's error on
    the float32 the runner made of every input). torch.onnx.export passed the flag positionally, whole, as a bool; the
    runner feeds it so on every call, and the column compares the export."""
    folder = cached_policies("torch-flag", TORCH_FLAG_EXPORT, torch_python, torch_script_exports("flag_policy", TORCH_FLAG_EXPORT))
    _linked(folder, ("flag_policy.py", "flag_policy.onnx", "flag_policy.pt"), tmp_path)
    monkeypatch.chdir(tmp_path)
    done = policy_matrix(["run", tmp_path / "flag_policy.onnx", *FAST, "--out", tmp_path / "out", "--source", spec,
                          "--source-python", torch_python, "--tolerance", "source:*=1e-5"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "PASS" and cell["error"] is None, cell
    assert cell["parity"][0]["max_abs"] <= 1e-5 and cell["latency"], cell


def test_a_normaliser_for_the_observation_is_not_asked_for_a_side_input(torch_python, tmp_path, policy_matrix):
    """One observation's statistics (mean, var) beside a rank-0 `deterministic`: the statistics were matched against
    every model input, so the flag made the model look like a two-key Dict observation and the file was refused
    (exit 2). A side input is fed whole and never normalised: the statistics are the observation's."""
    folder = cached_policies("torch-flag", TORCH_FLAG_EXPORT, torch_python, torch_script_exports("flag_policy", TORCH_FLAG_EXPORT))
    _linked(folder, ("flag_policy.onnx", "flag_policy.pt"), tmp_path)
    np.savez(tmp_path / "stats.npz", mean=np.full(3, 0.5, np.float32), var=np.full(3, 4.0, np.float32))
    done = policy_matrix(["run", tmp_path / "flag_policy.onnx", *FAST, "--out", tmp_path / "out", "--source",
                          "torchscript:flag_policy.pt", "--source-python", torch_python, "--source-normalize",
                          tmp_path / "stats.npz"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["error"] is None and cell["parity"], cell


@pytest.mark.parametrize("spec", ["torch:pixel_policy:make_policy", "torchscript:pixel_policy.pt"])
def test_uint8_frames_reach_a_torch_module_as_uint8_and_its_export_is_compared(torch_python, tmp_path, spec,
                                                                              policy_matrix, monkeypatch):
    """A pixel policy exported with uint8 frames scales integer pixels itself and takes float frames as scaled
    (torchvision's convention): fed anything but the export's uint8, the module computes another policy. The runner
    gives it the frames as they are, and the column compares the export on whole-number pixels."""
    folder = cached_policies("torch-pixels", TORCH_PIXEL_EXPORT, torch_python,
                             torch_script_exports("pixel_policy", TORCH_PIXEL_EXPORT))
    _linked(folder, ("pixel_policy.py", "pixel_policy.onnx", "pixel_policy.pt"), tmp_path)
    monkeypatch.chdir(tmp_path)
    done = policy_matrix(["run", tmp_path / "pixel_policy.onnx", *FAST, "--out", tmp_path / "out", "--source", spec,
                          "--source-python", torch_python, "--tolerance", "source:*=1e-5"])
    assert done.returncode == 0, done.stderr
    frames = np.load(tmp_path / "out" / "observations.npz")["frames"]
    assert frames.dtype == np.uint8 and frames.max() > 200  # pixels across their range, not a cast of small floats
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "PASS" and cell["error"] is None, cell
    assert cell["parity"][0]["max_abs"] <= 1e-5 and cell["latency"], cell


@pytest.fixture(scope="module")
def sb3_policies(sb3_python) -> Path:
    return cached_policies("sb3", SB3_TRAIN_EXPORT, sb3_python, sb3_with_sources)


def _linked(folder: Path, names: tuple[str, ...], into: Path) -> None:
    """The user's files beside each other in the run's folder (the cached originals stay untouched)."""
    for name in names:
        (into / name).symlink_to(folder / name)


def test_sb3_exports_the_documented_way_show_the_rescale_and_the_clip_named(sb3_policies, sb3_python, tmp_path,
                                                                           policy_matrix):
    _linked(sb3_policies, ("sac.zip", "sac.onnx", "ppo.zip", "ppo.onnx"), tmp_path)
    sac = policy_matrix(["run", tmp_path / "sac.onnx", *FAST, "--out", tmp_path / "sac", "--source", "sb3:sac.zip",
                         "--source-python", sb3_python, "--env", "Pendulum-v1", "--episodes", "3"])
    assert sac.returncode == 0, sac.stderr
    results = json.loads((tmp_path / "sac" / "results.json").read_text())
    cell = results["cells"][0]  # the top row of Behaviour: the training framework against the ONNX reference
    assert cell["target"] == "source" and cell["variant"] == "sb3"
    assert cell["reasons"][0].startswith("export: the source rescales [-1, 1] to the action space [-2, 2]; "
                                         "the ONNX graph does not")
    assert cell["rollout"]["mean_return"] != pytest.approx(cell["rollout"]["reference_mean_return"])
    assert "stable-baselines3 2.9.2" in cell["runtime_version"]

    ppo = policy_matrix(["run", tmp_path / "ppo.onnx", *FAST, "--out", tmp_path / "ppo", "--source", "sb3:ppo.zip",
                         "--source-python", sb3_python])
    assert ppo.returncode == 0, ppo.stderr
    assert source_cell(tmp_path / "ppo")["reasons"][0].startswith(
        "export: the source clips actions to the action space [-2, 2]; the ONNX graph does not")


def test_vecnormalize_statistics_missing_from_the_export_are_named(sb3_policies, sb3_python, tmp_path, policy_matrix):
    _linked(sb3_policies, ("ppo_normalized.onnx", "ppo_normalized.zip", "vecnormalize.pkl"), tmp_path)
    done = policy_matrix(["run", "ppo_normalized.onnx", *FAST, "--out", tmp_path / "out",
                          "--source", "sb3:ppo_normalized.zip", "--source-python", sb3_python,
                          "--source-normalize", "vecnormalize.pkl"])
    assert done.returncode == 0, done.stderr
    cell = source_cell(tmp_path / "out")
    assert cell["reasons"][0].startswith("export: the source normalises observations with its statistics "
                                         "(--source-normalize); the ONNX graph does not")


def test_an_export_with_an_input_sb3_does_not_take_is_not_compared_and_says_which(sb3_policies, sb3_python, tmp_path,
                                                                                  policy_matrix):
    """PPO's Box policy exported with a rank-0 `deterministic` input beside the observation: the runner fed SB3 the
    dict of both (or sliced the rank-0 array) and SB3's own error was the source cell's FAIL, a verdict the tool
    caused. The training policy takes the observation alone, and what the export answers depends on its other
    input: the column says it cannot compare, naming that input."""
    _linked(sb3_policies, ("ppo.zip",), tmp_path)
    exported = onnx.load(sb3_policies / "ppo.onnx")
    exported.graph.input.append(onnx.helper.make_tensor_value_info("deterministic", onnx.TensorProto.FLOAT, []))
    onnx.save(exported, tmp_path / "ppo_flag.onnx")
    done = policy_matrix(["run", tmp_path / "ppo_flag.onnx", *FAST, "--out", tmp_path / "out", "--source", "sb3:ppo.zip",
                          "--source-python", sb3_python])
    cell = source_cell(tmp_path / "out")
    assert cell["verdict"] == "SKIP" and cell["error"] is None, cell
    assert cell["reasons"] == ["not compared: SB3's policy takes its observation alone (obs, a Box of shape [3]); the "
                               "export also takes deterministic, which the training policy does not: its answers "
                               "depend on what that is fed, so export parity cannot be measured here"]
    assert done.returncode == 0, done.stderr  # a column that cannot compare fails nothing

    given = policy_matrix(["run", tmp_path / "ppo_flag.onnx", *FAST, "--out", tmp_path / "given", "--source",
                           "sb3:ppo.zip", "--source-python", sb3_python, "--side-input", "deterministic=1"])
    assert given.returncode == 0, given.stderr
    assert source_cell(tmp_path / "given")["reasons"] == [
        "not compared: SB3's policy takes its observation alone (obs, a Box of shape [3]); the export also takes "
        "deterministic, which the training policy does not: the value given (deterministic = 1.0) goes to the export "
        "alone and its answers depend on it, so export parity cannot be measured here"]
