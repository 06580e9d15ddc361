"""Bundled example policies, built from a fixed seed so the bytes are reproducible.

`python -m matrix.inputs.examples` rewrites the shipped files; a test checks that it
reproduces them exactly. Each policy declares its action space in the model's
metadata (`action_space`, `action_low`/`action_high` or `action_n`), the way
the RL contract checks read it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXAMPLES_DIR = Path(__file__).parents[1] / "example_policies"
OPSET = 17
IR_VERSION = 8


def _dense(rng: np.random.Generator, name: str, fan_in: int, fan_out: int) -> list[onnx.TensorProto]:
    weight = rng.normal(0.0, 1.0 / np.sqrt(fan_in), size=(fan_out, fan_in)).astype(np.float32)
    bias = rng.normal(0.0, 0.1, size=(fan_out,)).astype(np.float32)
    return [numpy_helper.from_array(weight, f"{name}.weight"), numpy_helper.from_array(bias, f"{name}.bias")]


def _gemm(name: str, x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [y], name=name, transB=1)


def _model(graph: onnx.GraphProto, metadata: dict[str, str]) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="policy-matrix")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, metadata)
    onnx.checker.check_model(model, full_check=True)
    return model


def _mlp_trunk(rng, sizes: list[int], activation: str) -> tuple[list, list, str]:
    nodes, inits, x = [], [], "obs"
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-2], sizes[1:-1])):
        inits += _dense(rng, f"fc{i}", fan_in, fan_out)
        nodes += [_gemm(f"fc{i}", x, f"h{i}"), helper.make_node(activation, [f"h{i}"], [f"a{i}"], name=f"act{i}")]
        x = f"a{i}"
    return nodes, inits, x


def continuous_mlp() -> onnx.ModelProto:
    """obs[B,17] -> tanh MLP -> action[B,6] in [-1, 1] (a MuJoCo-style actor)."""
    rng = np.random.default_rng(17)
    nodes, inits, x = _mlp_trunk(rng, [17, 64, 64, 6], "Tanh")
    inits += _dense(rng, "head", 64, 6)
    nodes += [_gemm("head", x, "head_out"), helper.make_node("Tanh", ["head_out"], ["action"], name="squash")]
    graph = helper.make_graph(
        nodes, "continuous_mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 17])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 6])],
        inits,
    )
    return _model(graph, {"action_space": "continuous", "action_low": "-1.0", "action_high": "1.0"})


def discrete_mlp() -> onnx.ModelProto:
    """obs[B,8] -> ReLU MLP -> logits[B,4] -> ArgMax -> action[B] int64 (a DQN-style head)."""
    rng = np.random.default_rng(8)
    nodes, inits, x = _mlp_trunk(rng, [8, 64, 64, 4], "Relu")
    inits += _dense(rng, "q", 64, 4)
    nodes += [
        _gemm("q", x, "q_values"),
        helper.make_node("ArgMax", ["q_values"], ["action"], name="greedy", axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "discrete_mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])],
        inits,
    )
    return _model(graph, {"action_space": "discrete", "action_n": "4"})


def pixel_cnn() -> onnx.ModelProto:
    """obs[B,3,32,32] -> 2 strided convs -> MLP -> action[B,3] in [-1, 1] (a pixel actor)."""
    rng = np.random.default_rng(32)

    def conv(name, c_in, c_out):
        w = rng.normal(0, 1 / np.sqrt(c_in * 9), size=(c_out, c_in, 3, 3)).astype(np.float32)
        b = rng.normal(0, 0.1, size=(c_out,)).astype(np.float32)
        return [numpy_helper.from_array(w, f"{name}.weight"), numpy_helper.from_array(b, f"{name}.bias")]

    inits = conv("conv0", 3, 8) + conv("conv1", 8, 16) + _dense(rng, "fc0", 16 * 8 * 8, 64) + _dense(rng, "head", 64, 3)
    conv_attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    nodes = [
        helper.make_node("Conv", ["obs", "conv0.weight", "conv0.bias"], ["c0"], name="conv0", **conv_attrs),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "conv1.weight", "conv1.bias"], ["c1"], name="conv1", **conv_attrs),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Flatten", ["r1"], ["flat"], name="flatten", axis=1),
        _gemm("fc0", "flat", "h0"),
        helper.make_node("Relu", ["h0"], ["a0"], name="relu2"),
        _gemm("head", "a0", "head_out"),
        helper.make_node("Tanh", ["head_out"], ["action"], name="squash"),
    ]
    graph = helper.make_graph(
        nodes, "pixel_cnn",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    return _model(graph, {"action_space": "continuous", "action_low": "-1.0", "action_high": "1.0"})


BUILDERS = {"continuous_mlp": continuous_mlp, "discrete_mlp": discrete_mlp, "pixel_cnn": pixel_cnn}


def path(name: str) -> Path:
    return EXAMPLES_DIR / f"{name}.onnx"


def write_all(directory: Path = EXAMPLES_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in BUILDERS.items():
        target = directory / f"{name}.onnx"
        target.write_bytes(build().SerializeToString())
        written.append(target)
    return written


if __name__ == "__main__":
    for written in write_all():
        print(written)
