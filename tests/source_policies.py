"""Policies with a training-side twin, for the `--source` column.

`mlp_with_source(folder)` writes what a user has after training and exporting a small
Pendulum-shaped actor: `policy.onnx` (built with onnx.helper, as jax2onnx-style exporters
write Gemm + Tanh) and `trained_policy.py`, the same network in numpy as the training code
runs it, with one callable per way the two can differ. Run the CLI with `folder` as the
current directory so `python:trained_policy:FUNC` imports it, as a user's own module would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
HIDDEN = 16
# Observation statistics a VecNormalize-style wrapper would have gathered (Pendulum: cos, sin, theta_dot).
NORMALIZER = {"mean": np.array([0.1, -0.2, 0.5], np.float32), "var": np.array([0.5, 0.4, 9.0], np.float32)}

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


def mlp_with_source(folder: Path) -> Path:
    """policy.onnx, weights.npz, trained_policy.py and normalizer.npz in `folder`; the ONNX path."""
    weights = _weights()
    np.savez(folder / "weights.npz", **weights)
    np.savez(folder / "normalizer.npz", **NORMALIZER)
    (folder / "trained_policy.py").write_text(TRAINING_MODULE)
    path = folder / "policy.onnx"
    onnx.save(mlp_onnx(weights), str(path))
    return path
