"""Policies with a training-side twin, for the `--source` column.

`mlp_with_source(folder)` writes what a user has after training and exporting a small
Pendulum-shaped actor: `policy.onnx` (built with onnx.helper, as jax2onnx-style exporters
write Gemm + Tanh) and `trained_policy.py`, the same network in numpy as the training code
runs it, with one callable per way the two can differ. Run the CLI with `folder` as the
current directory so `python:trained_policy:FUNC` imports it, as a user's own module would.

`cached_policies` keeps what a framework's interpreter trained and exported in the cache, made once
per recipe and interpreter, so a test pays for torch or SB3 only when its script changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from matrix.frameworks import environments, load

from targets.build_once import build_once
from targets.paths import cache_dir

OPSET = 17
HIDDEN = 16
# Observation statistics a VecNormalize-style wrapper would have gathered (Pendulum: cos, sin, theta_dot).
NORMALIZER = {"mean": np.array([0.1, -0.2, 0.5], np.float32), "var": np.array([0.5, 0.4, 9.0], np.float32)}

# SB3's documented export wrapper (its "Exporting models" guide): the policy's deterministic action, for
# torch.onnx.export; the export scripts of the tests that train an SB3 policy in its own interpreter include it.
SB3_ONNXABLE_POLICY = '''
class OnnxablePolicy(th.nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, observation):
        return self.policy(observation, deterministic=True)[0]
'''

TRAINING_MODULE = '''
"""The training code's policy: the exported network, as numpy evaluates it."""
import threading
from pathlib import Path

import numpy as np

_W = np.load(Path(__file__).with_name("weights.npz"))


def _network(obs):
    hidden = np.tanh(obs.astype(np.float32) @ _W["w1"] + _W["b1"])
    return np.tanh(hidden @ _W["w2"] + _W["b2"])  # [-1, 1], as the ONNX graph ends


def act(obs):
    """What the ONNX graph computes: export parity holds."""
    return _network(obs)


def act_rescaled(obs):
    """SAC-style predict: [-1, 1] rescaled to Pendulum's action space [-2, 2] outside the network."""
    return -2.0 + (_network(obs) + 1.0) * 2.0


def act_pixels(obs):
    """A CNN-style preprocessing: pixels divided by 255 before the network, which the export left out."""
    return _network(obs / np.float32(255))


def act_scaled(feeds):
    """A policy taking its observation and a rank-0 `scale` beside it: the dict of the model's inputs."""
    return _network(feeds["obs"]) * feeds["scale"]


def act_retrained(obs):
    """A later checkpoint than the one exported (the export is the untrained network): this one swings Pendulum up by
    pumping energy and holds it upright with a PD law, far better than the export in the loop."""
    cos, sin, speed = (np.atleast_2d(obs).astype(np.float64)[:, i] for i in range(3))
    energy = 0.5 * speed ** 2 + 15 * cos  # Pendulum's (g=10, m=l=1) energy; 15 upright at rest
    pump = np.clip(0.4 * (15 - energy) * np.sign(speed + 1e-9), -2, 2)
    hold = np.clip(-(10 * np.arctan2(sin, cos) + 2 * speed), -2, 2)
    return np.where(cos > 0.85, hold, pump)[:, None].astype(np.float32)


def act_crashes(obs):
    raise RuntimeError("the checkpoint needs a GPU that is not there")


def act_hangs(obs):
    threading.Event().wait()  # a source that never answers: only --timeout ends it
'''


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(0, 0.8, (3, HIDDEN)).astype(np.float32), "b1": rng.normal(0, 0.1, HIDDEN).astype(np.float32),
        "w2": rng.normal(0, 0.8, (HIDDEN, 1)).astype(np.float32), "b2": np.zeros(1, np.float32),
    }


def mlp_onnx(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    node = helper.make_node
    nodes = [node("Gemm", ["obs", "w1", "b1"], ["h_pre"]), node("Tanh", ["h_pre"], ["h"]),
             node("Gemm", ["h", "w2", "b2"], ["a_pre"]), node("Tanh", ["a_pre"], ["action"])]
    graph = helper.make_graph(
        nodes, "actor", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def with_scale_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """The actor's action multiplied by a rank-0 `scale` input (trained_policy.act_scaled): a side input fed whole."""
    graph = model.graph
    graph.node[-1].output[0] = "a_unscaled"
    graph.node.append(helper.make_node("Mul", ["a_unscaled", "scale"], ["action"]))
    graph.input.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, []))
    return model


def mlp_with_source(folder: Path) -> Path:
    """policy.onnx, weights.npz, trained_policy.py and normalizer.npz in `folder`; the ONNX path."""
    weights = _weights()
    np.savez(folder / "weights.npz", **weights)
    np.savez(folder / "normalizer.npz", **NORMALIZER)
    (folder / "trained_policy.py").write_text(TRAINING_MODULE)
    path = folder / "policy.onnx"
    onnx.save(mlp_onnx(weights), str(path))
    return path


# --- torch and Stable-Baselines3 sources, built and exported in an interpreter that has them ---

TORCH_MODULE = '''
"""The training code's policy as an nn.Module factory."""
import torch


def make_policy():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1), torch.nn.Tanh())
'''

TORCH_EXPORT = '''
"""Export the module as torch users do: torch.onnx.export (TorchScript path) and torch.jit.trace."""
import torch

import torch_policy

policy = torch_policy.make_policy().eval()
example = torch.zeros(1, 3)
torch.onnx.export(policy, example, "policy.onnx", opset_version=17, input_names=["obs"], output_names=["action"],
                  dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
torch.jit.trace(policy, example).save("policy.pt")
'''

# A policy with a rank-0 side input beside its observation, as torch.onnx.export passes it (positionally): a bool
# `deterministic` flag, one value for every row of a batch, chooses the mean or a shifted action.
TORCH_FLAG_EXPORT = '''
"""A module taking (obs, deterministic), exported by torch.onnx.export and traced to TorchScript."""
import torch


class FlagPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def forward(self, obs, deterministic):
        mean = self.net(obs)
        return torch.tanh(torch.where(deterministic, mean, mean + 0.5))


def make_policy():
    return FlagPolicy().eval()


if __name__ == "__main__":
    policy = make_policy()
    example = (torch.zeros(1, 3), torch.tensor(True))
    torch.onnx.export(policy, example, "flag_policy.onnx", opset_version=17, input_names=["obs", "deterministic"],
                      output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
    torch.jit.trace(policy, example).save("flag_policy.pt")
'''

# The same flag as the graph's output, as SB3's SAC actor gives it wrapped in torch.where(deterministic, its mean
# action, its sampled one): the exploring branch's shape is computed at run time (torch.distributions' broadcast),
# so torch names the action's width after the Where ("Whereaction_dim_1") instead of 1. Bias-free layers export as
# MatMul, which tract runs in fp16 (it refuses an fp16 Gemm with a bias), so the fp16 variant itself is what loads.
TORCH_WHERE_FLAG_EXPORT = '''
"""A module taking (obs, deterministic) whose output is a Where, exported by torch.onnx.export."""
import torch


class WhereFlagPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 32, bias=False), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 1, bias=False))

    def forward(self, obs, deterministic):
        mean = torch.tanh(self.net(obs))
        return torch.where(deterministic, mean, torch.tanh(mean + torch.full(mean.shape, 0.5)))


if __name__ == "__main__":
    torch.onnx.export(WhereFlagPolicy().eval(), (torch.zeros(1, 3), torch.tensor(True)), "where_flag_policy.onnx",
                      opset_version=17, input_names=["obs", "deterministic"], output_names=["action"],
                      dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
'''

# A pixel policy taking uint8 frames, as a camera or an Atari wrapper gives them, exported with a uint8 example. It
# follows torchvision's convert_image_dtype convention: integer pixels are scaled to [0, 1], float frames are taken
# as scaled already; so it computes what its export does only when fed the export's uint8.
TORCH_PIXEL_EXPORT = '''
"""A module taking uint8 frames [B, 3, 8, 8], exported by torch.onnx.export and traced to TorchScript."""
import torch


class PixelPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, stride=2)
        self.head = torch.nn.Linear(4 * 3 * 3, 2)

    def forward(self, frames):
        scaled = frames.float() / 255.0 if frames.dtype == torch.uint8 else frames
        return torch.tanh(self.head(torch.relu(self.conv(scaled)).flatten(1)))


def make_policy():
    return PixelPolicy().eval()


if __name__ == "__main__":
    policy = make_policy()
    example = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    torch.onnx.export(policy, example, "pixel_policy.onnx", opset_version=17, input_names=["frames"],
                      output_names=["action"], dynamic_axes={"frames": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
    torch.jit.trace(policy, example).save("pixel_policy.pt")
'''

# Stable-Baselines3's export guide: the actor (SAC) or the policy (PPO) wrapped in a module that calls it
# deterministically, exported with torch.onnx.export (dynamo=False: the new exporter fails on SB3's actors).
SB3_TRAIN_EXPORT = '''
import sys

import torch as th
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize


class OnnxableSAC(th.nn.Module):
    def __init__(self, actor):
        super().__init__()
        self.actor = actor

    def forward(self, observation):
        return self.actor(observation, deterministic=True)

''' + SB3_ONNXABLE_POLICY + '''

def export(module, name):
    th.onnx.export(module, th.zeros(1, 3), f"{name}.onnx", opset_version=17, input_names=["obs"], output_names=["action"],
                   dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)


# A short run of each (seconds, not a trained policy: the export contract is the same).
sac = SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, seed=0, device="cpu")
sac.learn(100)
sac.save("sac.zip")
export(OnnxableSAC(sac.policy.actor), "sac")

ppo = PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
ppo.learn(64)
with th.no_grad():
    ppo.policy.action_net.bias += 2.5  # a mean that leaves [-2, 2], as a trained Pendulum policy's often does
ppo.save("ppo.zip")
export(OnnxablePolicy(ppo.policy), "ppo")

# Trained under VecNormalize: its statistics are saved beside the zip and stay outside the exported graph.
venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0), norm_reward=False)
normalized = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu").learn(64)
normalized.save("ppo_normalized.zip")
venv.save("vecnormalize.pkl")
export(OnnxablePolicy(normalized.policy), "ppo_normalized")
'''


def torch_with_source(folder: Path, python: Path) -> None:
    """policy.onnx and policy.pt exported from torch_policy.make_policy by `python` (an interpreter with torch)."""
    (folder / "torch_policy.py").write_text(TORCH_MODULE)
    (folder / "export.py").write_text(TORCH_EXPORT)
    subprocess.run([str(python), "export.py"], cwd=folder, check=True, capture_output=True, timeout=600)


def torch_script_exports(name: str, script: str):
    """cached_policies' maker of NAME.py (`script`), run where it is written: it leaves its exports beside itself."""
    def make(folder: Path, python: Path) -> None:
        (folder / f"{name}.py").write_text(script)
        subprocess.run([str(python), f"{name}.py"], cwd=folder, check=True, capture_output=True, timeout=600)

    return make


def sb3_with_sources(folder: Path, python: Path) -> None:
    """sac, ppo and ppo_normalized (.zip/.onnx, plus vecnormalize.pkl), saved and exported the documented way by
    `python` (an interpreter with SB3)."""
    (folder / "train_export.py").write_text(SB3_TRAIN_EXPORT)
    # SB3's logger makes a folder even when it logs nothing: SB3_LOGDIR keeps it out of /tmp (its default).
    env = {**os.environ, "SB3_LOGDIR": str(folder / "sb3-log")}
    subprocess.run([str(python), "train_export.py"], cwd=folder, check=True, capture_output=True, timeout=900, env=env)


def sb3_exports(name: str, script: str, files: tuple[Path, ...] = ()) -> Path:
    """The folder `script` (training and exporting with SB3) leaves, run beside `files` by the SB3 framework's
    interpreter, made once per script and files (cached_policies); the test is skipped where that interpreter is not
    built (`policy-matrix setup frameworks`)."""
    python = environments.python(load("sb3"))
    if python is None:
        pytest.skip("needs the SB3 framework environment: policy-matrix setup frameworks")

    def run(folder: Path, python: Path) -> None:
        for path in files:
            shutil.copy(path, folder / path.name)
        (folder / "export.py").write_text(script)
        # SB3's logger makes a folder even when it logs nothing: SB3_LOGDIR keeps it out of /tmp (its default).
        done = subprocess.run([str(python), "export.py"], cwd=folder, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "SB3_LOGDIR": str(folder / "sb3-log")})
        assert done.returncode == 0, done.stderr

    return cached_policies(name, script + "".join(path.read_text() for path in files), python, run)


def cached_policies(name: str, recipe: str, python: Path, make) -> Path:
    """A folder of exported policies (read only), made once per recipe (the script's text) and interpreter, whole
    (build_once), as the cache's converted models are: the tests measure the tool on these files, not the framework's
    training and export (a torch process importing torch, ~7 s; SB3's training, ~11 s)."""
    key = hashlib.sha256(f"{recipe}{python.parent.parent}".encode()).hexdigest()[:12]
    folder = cache_dir() / "test-policies" / f"{name}-{key}"

    def export(staging: Path) -> None:
        staging.mkdir()
        make(staging, python)

    build_once(folder, export)
    return folder
