"""Synthetic rows for a policy that takes float pixels: whole numbers in [0, 255], where the graph says so.

Stable-Baselines3's export guide traces the policy with a float32 dummy input (`th.randn(1, *observation_size)`),
so a CnnPolicy's exported input is float32 and its first ops are SB3's `obs.float() / 255` (Cast, Div by 255).
Fed N(0, 1) rows, the network saw images of -0.004..0.004 that no camera makes, and an untrained-scale head
decided nothing on them: 124 of 128 rows were near ties, so drift and agreement were judged on states the policy
never visits. The policy here is exported from SB3's own interpreter, untrained, its action head turned up to a
trained one's scale (SB3 initialises it with gain 0.01) so that its decisions have margins.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import policies
import pytest
from source_policies import SB3_ONNXABLE_POLICY, sb3_exports

from matrix.inputs import observations

pytestmark = pytest.mark.slow

FAST = ("--iters", "5", "--warmup", "1")

EXPORT = '''
import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO


class PixelEnv(gym.Env):
    observation_space = spaces.Box(0, 255, (3, 36, 36), np.uint8)
    action_space = spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}

''' + SB3_ONNXABLE_POLICY + '''

model = PPO("CnnPolicy", PixelEnv(), n_steps=8, batch_size=8, device="cpu", seed=0)
with th.no_grad():
    model.policy.action_net.weight *= 100
observation_size = model.observation_space.shape
dummy_input = th.randn(1, *observation_size)
th.onnx.export(OnnxablePolicy(model.policy), dummy_input, "cnn_float.onnx", opset_version=17, input_names=["obs"],
               output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
'''


@pytest.fixture(scope="module")
def sb3_cnn(tmp_path_factory) -> Path:
    folder = sb3_exports("sb3-cnn-float", EXPORT)
    return Path(shutil.copy(folder / "cnn_float.onnx", tmp_path_factory.mktemp("sb3") / "cnn_float.onnx"))


def _pixels_fed(out: Path) -> np.ndarray:
    rows = observations.read(out / "observations.npz")["obs"]
    assert rows.dtype == np.float32 and rows.min() == 0 and rows.max() == 255 and np.array_equal(rows, rows.round())
    return rows


def test_sb3s_cnn_policy_exported_with_a_float_input_is_judged_on_pixels(sb3_cnn, tmp_path, policy_matrix):
    """Before: N(0, 1) rows; 4 of 128 decisions were above the tie margin, so agreement rested on 4 rows."""
    out = tmp_path / "out"
    done = policy_matrix(["run", sb3_cnn, "--targets", "ort-cpu", "--variants", "fp32,int8", *FAST, "--out", out])
    assert done.returncode == 0, done.stderr
    _pixels_fed(out)
    results = json.loads((out / "results.json").read_text())
    assert "'obs': whole numbers in [0, 255], the pixels its graph scales first (Div by 255)" in \
        results["model"]["observation_source"]
    for cell in results["cells"]:
        (action,) = cell["parity"]
        assert cell["verdict"] == "PASS", (cell["variant"], cell["reasons"])
        assert action["judged_rows"] >= 100 and action["flips"] == 0, action


@pytest.mark.parametrize("scale_op, divisor, affine, said", [
    ("Mul", 255, "", "Mul by 1/255"), ("Div", 127.5, "minus 1", "Div by 127.5"), ("Div", 255, "normalize", "Div by 255")])
def test_a_policy_that_scales_pixels_first_is_judged_on_pixels(tmp_path, policy_matrix, scale_op, divisor, affine, said):
    """By 1/255, to [-1, 1] by 127.5 then minus 1, or torchvision's normalize after the /255: the same fact."""
    path = policies.save(policies.pixels_scaled_in_graph(scale_op, divisor, affine), tmp_path, "scaled_pixels")
    out = tmp_path / "out"
    done = policy_matrix(["run", path, "--targets", "ort-cpu", "--variants", "fp32", *FAST, "--out", out])
    assert done.returncode == 0, done.stderr
    _pixels_fed(out)
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    assert cell["verdict"] == "PASS", cell["reasons"]
    assert f"the pixels its graph scales first ({said})" in done.stderr  # the console's observations line
