"""A teacher and a distilled student for the decision tests: the student is a smaller MLP
whose last layer is fitted (least squares) to the teacher's actions, as a quick distillation would."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OBS, ACTIONS = 8, 2


def _mlp(layers: list[tuple[np.ndarray, np.ndarray]], obs: int = OBS, action_name: str = "action") -> onnx.ModelProto:
    nodes, inits, current = [], [], "obs"
    for index, (weight, bias) in enumerate(layers):
        inits += [numpy_helper.from_array(weight.astype(np.float32), f"w{index}"),
                  numpy_helper.from_array(bias.astype(np.float32), f"b{index}")]
        last = index == len(layers) - 1
        out = action_name if last else f"h{index}"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [out if last else f"z{index}"], name=f"/fc{index}/Gemm"))
        if not last:
            nodes.append(helper.make_node("Tanh", [f"z{index}"], [out], name=f"/fc{index}/Tanh"))
        current = out
    graph = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs])],
                              [helper.make_tensor_value_info(action_name, TensorProto.FLOAT, ["batch", ACTIONS])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _layer(rng, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(0, 1 / np.sqrt(fan_in), size=(fan_in, fan_out)), rng.normal(0, 0.1, size=fan_out)


def teacher_layers() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [_layer(rng, OBS, 64), _layer(rng, 64, 64), _layer(rng, 64, ACTIONS)]


def teacher() -> onnx.ModelProto:
    """A 64-64 MLP: the model under test."""
    return _mlp(teacher_layers())


def _forward(layers, obs: np.ndarray) -> np.ndarray:
    hidden = obs
    for weight, bias in layers[:-1]:
        hidden = np.tanh(hidden @ weight + bias)
    weight, bias = layers[-1]
    return hidden @ weight + bias


def student(obs: int = OBS, action_name: str = "action") -> onnx.ModelProto:
    """A 16-unit MLP: random features, last layer fitted by least squares to the teacher's actions."""
    rng = np.random.default_rng(12)
    samples = rng.normal(0, 1, size=(4096, OBS))
    actions = _forward(teacher_layers(), samples)
    first = _layer(rng, OBS, 16)
    features = np.tanh(samples @ first[0] + first[1])
    design = np.hstack([features, np.ones((len(features), 1))])
    fitted, *_ = np.linalg.lstsq(design, actions, rcond=None)
    if obs != OBS:  # a student exported for another observation size: the interface differs
        first = (np.resize(first[0], (obs, 16)), first[1])
    return _mlp([first, (fitted[:-1], fitted[-1])], obs=obs, action_name=action_name)
