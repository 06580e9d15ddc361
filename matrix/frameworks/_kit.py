"""What every framework module needs inside its own environment: the tasks' training data, the
fitting loop for frameworks without an RL trainer of their own, a torch export that records the
path it took, and the manifest the core reads.

Runs in the framework's interpreter (numpy and the framework, never policy-matrix): the framework
module is run as a script from a policy folder that holds a copy of this file beside it.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
OBS_SIZE = {"CartPole-v1": 4, "Pendulum-v1": 3}
ACTIONS = {"CartPole-v1": 2, "Pendulum-v1": 1}  # CartPole: discrete choices; Pendulum: action dimensions
PENDULUM_MAX_TORQUE = 2.0


def cartpole_controller(obs: np.ndarray) -> np.ndarray:
    """A linear controller that holds CartPole-v1 for 500 steps from every seed tried (0-4)."""
    x, x_dot, theta, theta_dot = obs.T
    return (theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0).astype(np.int64)


def pendulum_controller(obs: np.ndarray) -> np.ndarray:
    """Energy pumping far from the top, a PD hold near it: Pendulum-v1 returns of about -170 (seeds 0-4)."""
    cos, sin, speed = obs.T
    angle = np.arctan2(sin, cos)
    energy = 0.5 * speed**2 + 10 * (cos - 1)
    swing = np.where(energy < 0, PENDULUM_MAX_TORQUE * np.sign(speed), -0.5 * speed)
    torque = np.where(cos > 0.8, -10 * angle - 2 * speed, swing)
    return np.clip(torque, -PENDULUM_MAX_TORQUE, PENDULUM_MAX_TORQUE)[:, None].astype(np.float32)


def imitation_data(task: str, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """States sampled over the task's observation space, labelled by its controller: supervised
    training in seconds that gives a policy whose episodes mean something, with no simulator."""
    rng = np.random.default_rng(seed)
    if task == "CartPole-v1":
        obs = rng.uniform([-2.4, -2.0, -0.21, -2.0], [2.4, 2.0, 0.21, 2.0], (rows, 4)).astype(np.float32)
        return obs, cartpole_controller(obs)
    angle, speed = rng.uniform(-np.pi, np.pi, rows), rng.uniform(-8, 8, rows)
    obs = np.stack([np.cos(angle), np.sin(angle), speed], axis=1).astype(np.float32)
    return obs, pendulum_controller(obs)


def fit_torch(module, task: str, seed: int, steps: int = 800, logits=None) -> str:
    """Adam on the controller's labels in minibatches of 256, one thread (the machine is shared):
    cross-entropy on `logits(obs)` (discrete) or MSE on the module's output (continuous).
    Returns the training line for the manifest."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    obs, target = imitation_data(task, 4096, seed)
    obs_t, target_t = torch.as_tensor(obs), torch.as_tensor(target)
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    rows = torch.Generator().manual_seed(seed)
    started = time.monotonic()
    for _ in range(steps):
        batch = torch.randint(0, len(obs_t), (256,), generator=rows)
        optimizer.zero_grad()
        if task == "CartPole-v1":
            loss = torch.nn.functional.cross_entropy((logits or module)(obs_t[batch]), target_t[batch])
        else:
            loss = torch.nn.functional.mse_loss(module(obs_t[batch]), target_t[batch])
        loss.backward()
        optimizer.step()
    return imitation_line(steps, loss.item(), time.monotonic() - started)


def imitation_line(steps: int, loss: float, seconds: float) -> str:
    return f"imitation of a hand-written controller, {steps} Adam steps of 256 sampled states ({seconds:.0f} s, loss {loss:.3g})"


def torch_export(module, example, path: Path, documented: dict, fallbacks: list[str]) -> str:
    """torch.onnx.export as the framework documents it (`documented`: its keyword arguments). Without a
    `dynamo` choice there, torch's default (the dynamo exporter) is tried first and, where it fails, the
    TorchScript exporter: the failure is kept as a fallback. Returns the path taken."""
    import torch

    if "dynamo" in documented:
        torch.onnx.export(module, example, str(path), **documented)
        return f"torch.onnx.export(dynamo={documented['dynamo']})"
    try:
        torch.onnx.export(module, example, str(path), **documented)
        return "torch.onnx.export (torch's default: the dynamo exporter)"
    except Exception as error:  # the default exporter's own words become the row's fallback
        fallbacks.append(f"dynamo exporter failed: {_first_line(error)}; used dynamo=False")
        path.unlink(missing_ok=True)
        torch.onnx.export(module, example, str(path), **documented, dynamo=False)
        return "torch.onnx.export(dynamo=False)"


def _first_line(error: Exception) -> str:
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(error)).split())  # torch colours its messages
    return f"{type(error).__name__}: {text[:240]}"


def version(package: str) -> str:
    return importlib.metadata.version(package)


def write_manifest(folder: Path, **facts) -> None:
    (folder / MANIFEST).write_text(json.dumps(facts, indent=1))


def read_manifest(module_file: str) -> dict:
    return json.loads(Path(module_file).with_name(MANIFEST).read_text())


def main(build) -> None:
    """`python FRAMEWORK_MODULE.py build POLICY FOLDER SEED`: train, save, export and write the manifest."""
    _, policy, folder, seed = sys.argv[1:5]
    started = time.monotonic()
    facts = build(policy, Path(folder), int(seed))
    write_manifest(Path(folder), policy=policy, build_s=round(time.monotonic() - started, 1), **facts)
