"""Stable-Baselines3's other action spaces, exported the documented way (the policy wrapped to call itself
deterministically, torch.onnx.export with dynamo=False) from the framework's own interpreter, untrained.

Discrete(2) (CartPole) exports ArgMax -> Cast -> Reshape into `action [N]` int64, which tract types as a TDim and
its Python API does not hand back: it is read back converted to the declared int64 and judged as any runtime's.
MultiDiscrete([3, 5]) exports one ArgMax per dimension, each Unsqueezed and Concatenated into `action [N, 2]`
int64: every decision has its own margin, which the reference reads through the Concat, so a near tie in one
dimension is a near tie, not a flip that every runtime shares. MultiBinary(4) exports `Round(Sigmoid(logits))`,
a float {0, 1} per element: a decision too, whose margin is the probability's distance from 0.5.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from source_policies import SB3_ONNXABLE_POLICY, sb3_exports

from matrix.inputs import model, observations
from matrix.reference import reference

pytestmark = pytest.mark.slow

EXPORT = '''
import sys

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO


class Env(gym.Env):
    observation_space = spaces.Box(-1, 1, (6,), np.float32)

    def __init__(self, action_space):
        self.action_space = action_space

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}

''' + SB3_ONNXABLE_POLICY + '''

for name, action_space in (("multidiscrete", spaces.MultiDiscrete([3, 5])), ("multibinary", spaces.MultiBinary(4))):
    model = PPO("MlpPolicy", Env(action_space), n_steps=8, batch_size=8, device="cpu", seed=0)
    th.onnx.export(OnnxablePolicy(model.policy), th.zeros(1, 6), f"{name}.onnx", opset_version=17, input_names=["obs"],
                   output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)

cartpole = PPO("MlpPolicy", "CartPole-v1", device="cpu", seed=0)
th.onnx.export(OnnxablePolicy(cartpole.policy), th.zeros(1, 4), "cartpole.onnx", opset_version=17, input_names=["obs"],
               output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return Path(shutil.copytree(sb3_exports("sb3-action-spaces", EXPORT),
                                tmp_path_factory.mktemp("sb3") / "exported"))


@pytest.fixture
def multidiscrete(exported) -> Path:
    return exported / "multidiscrete.onnx"


def test_each_dimension_of_a_multidiscrete_action_has_its_own_margin(multidiscrete):
    info = model.load(multidiscrete)
    feeds = observations.seeded(info, 64, 0)
    ref = reference.compute(info, feeds, 16)
    assert ref.outputs["action"].shape == (64, 2)
    margins = ref.margins["action"]
    assert margins.shape == (64, 2) and np.all(margins >= 0) and np.any(margins[:, 0] != margins[:, 1])


def test_a_multidiscrete_policy_passes_where_the_runtimes_agree_with_the_reference(multidiscrete, tmp_path, policy_matrix):
    """Before: ort-cpu, tract and wasm each WARNed the same '1 action flip' at fp32 (no margin was known)."""
    done = policy_matrix(["run", multidiscrete, "--targets", "ort-cpu,tract", "--variants", "fp32", "--iters", "5",
                          "--warmup", "1", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    for cell in json.loads((tmp_path / "results.json").read_text())["cells"]:
        assert cell["verdict"] == "PASS", (cell["target"], cell["reasons"])
        (action,) = cell["parity"]
        assert action["judged_rows"] + action["near_ties"] <= 256 and action["flips"] == 0


def test_a_multibinary_action_is_a_decision_per_element_with_the_probabilitys_distance_from_one_half(exported):
    info = model.load(exported / "multibinary.onnx")
    assert {node.op_type for node in info.nodes} >= {"Sigmoid", "Round"}
    feeds = observations.seeded(info, 64, 0)
    ref = reference.compute(info, feeds, 16)
    assert ref.outputs["action"].shape == (64, 4) and set(np.unique(ref.outputs["action"])) <= {0.0, 1.0}
    margins = ref.margins["action"]
    assert margins.shape == (64, 4) and np.all((margins >= 0) & (margins <= 0.5))


def test_a_multibinary_policy_is_judged_by_agreement_not_by_a_drift_of_1(exported, tmp_path, policy_matrix):
    """Before: every runtime and variant FAILed 'drift 1' where a probability sat at 0.5 within float rounding."""
    done = policy_matrix(["run", exported / "multibinary.onnx", "--targets", "ort-cpu,tract", "--variants", "fp32",
                          "--iters", "5", "--warmup", "1", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    for cell in json.loads((tmp_path / "results.json").read_text())["cells"]:
        assert cell["verdict"] == "PASS", (cell["target"], cell["reasons"])
        (action,) = cell["parity"]
        assert action["kind"] == "discrete" and action["flips"] == 0, action


def test_tract_reads_cartpoles_int64_action_back_and_is_judged_against_the_reference(exported, tmp_path,
                                                                                      policy_matrix):
    """tract opens the export and runs it; its ONNX loader types the Cast to int64 as a TDim, which its Python API
    does not hand back ('Unsupported DatumType in the public API TDim'), and the cell FAILed at its first run: the
    tool's way of reading the output, not tract's computation. Read back converted to the declared int64, tract's
    actions are judged as any runtime's (tract 0.23.9)."""
    done = policy_matrix(["run", exported / "cartpole.onnx", "--targets", "tract", "--variants", "fp32", "--iters", "5",
                          "--warmup", "1", "--out", tmp_path])
    (cell,) = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert done.returncode == 0 and cell["verdict"] == "PASS", cell["reasons"]
    (action,) = cell["parity"]
    assert action["kind"] == "discrete" and action["flips"] == 0 and action["judged_rows"] > 0, action
    assert {check["name"]: check["ok"] for check in cell["contract"]}["output dtypes"] is True
    assert "output 'action' converted to the declared int64" in cell["backend"]["detail"]
