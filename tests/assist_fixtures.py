"""Policies built for the diagnosis and conversion-assist tests, each shaped like a real export.

- `fp16_overflow_mlp`: a scale-up / scale-down pair (x 1e5, x 1e-5) between two
  Gemms; float16 cannot hold the 1e5 (its largest finite value is 65504), so the
  fp16 variant scales by 65504 and every runtime sees the drift, including ORT CPU,
  which upcasts fp16 math; the activations it scales stay in [0, 0.5], so kept in
  fp32 the scale-up's product (at most 5e4) fits float16 again.
- `sb3_pendulum_like`: SB3's continuous-actor export pattern: a tanh MLP whose
  action goes through a dead shape subgraph (Shape / ConstantOfShape / Expand /
  Reshape) and a clamp to the action bounds as Max/Min with constants.
- `jax2onnx_like`: opset 23, IR 10, MatMul + separate Add, a Cast, as jax2onnx exports.
- `sb3_multi_input_like`: SB3's MultiInputPolicy (two inputs flattened and concatenated) before an MLP
  (a continuous action, or DQN's Q-values and ArgMax).
- `pixels_and_state_like`: a Dict policy's uint8 image (cast, scaled by 1/255) beside a float state.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _finish(nodes, name, inputs, outputs, inits, opset=17, ir=8, metadata=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="policy-matrix-tests")
    model.ir_version = ir
    for key, value in (metadata or {}).items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    onnx.checker.check_model(model, full_check=True)
    return model


def _tensor(rng, name, *shape, scale=0.5):
    return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)


def fp16_overflow_mlp() -> onnx.ModelProto:
    """obs[B,4] -> fc0 (Gemm) -> clip0 [0, 0.5] -> scale_up (x1e5) -> scale_down (x1e-5) -> head (Gemm) -> action[B,2]."""
    rng = np.random.default_rng(3)
    inits = [
        _tensor(rng, "fc0.weight", 16, 4, scale=1.0), _tensor(rng, "fc0.bias", 16, scale=0.1),
        numpy_helper.from_array(np.array(0.0, np.float32), "clip0.min"), numpy_helper.from_array(np.array(0.5, np.float32), "clip0.max"),
        numpy_helper.from_array(np.array(1e5, np.float32), "up"), numpy_helper.from_array(np.array(1e-5, np.float32), "down"),
        _tensor(rng, "head.weight", 2, 16, scale=0.2), _tensor(rng, "head.bias", 2, scale=0.1),
    ]
    nodes = [
        helper.make_node("Gemm", ["obs", "fc0.weight", "fc0.bias"], ["h0"], name="fc0", transB=1),
        helper.make_node("Clip", ["h0", "clip0.min", "clip0.max"], ["r0"], name="clip0"),
        helper.make_node("Mul", ["r0", "up"], ["big"], name="scale_up"),
        helper.make_node("Mul", ["big", "down"], ["small"], name="scale_down"),
        helper.make_node("Gemm", ["small", "head.weight", "head.bias"], ["action"], name="head", transB=1),
    ]
    return _finish(nodes, "fp16_overflow_mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                   [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])], inits)


def sb3_pendulum_like() -> onnx.ModelProto:
    """obs[B,3] -> Gemm/Tanh x2 -> Gemm -> (Shape, ConstantOfShape, Expand, Add, Reshape) -> Max(-2) -> Min(2) -> action[B,1]."""
    rng = np.random.default_rng(11)
    inits = [
        _tensor(rng, "pi.0.weight", 16, 3), _tensor(rng, "pi.0.bias", 16, scale=0.1),
        _tensor(rng, "pi.2.weight", 16, 16), _tensor(rng, "pi.2.bias", 16, scale=0.1),
        _tensor(rng, "mu.weight", 1, 16), _tensor(rng, "mu.bias", 1, scale=0.1),
        numpy_helper.from_array(np.array([-1, 1], np.int64), "flat_shape"),
        numpy_helper.from_array(np.array(-2.0, np.float32), "low"), numpy_helper.from_array(np.array(2.0, np.float32), "high"),
    ]
    nodes = [
        helper.make_node("Gemm", ["obs", "pi.0.weight", "pi.0.bias"], ["h0"], name="/pi/0/Gemm", transB=1),
        helper.make_node("Tanh", ["h0"], ["a0"], name="/pi/1/Tanh"),
        helper.make_node("Gemm", ["a0", "pi.2.weight", "pi.2.bias"], ["h1"], name="/pi/2/Gemm", transB=1),
        helper.make_node("Tanh", ["h1"], ["a1"], name="/pi/3/Tanh"),
        helper.make_node("Gemm", ["a1", "mu.weight", "mu.bias"], ["mean"], name="/mu/Gemm", transB=1),
        helper.make_node("Shape", ["mean"], ["mean_shape"], name="/Shape"),
        helper.make_node("ConstantOfShape", ["mean_shape"], ["zeros"], name="/ConstantOfShape",
                         value=numpy_helper.from_array(np.array([0.0], np.float32))),
        helper.make_node("Expand", ["mean", "mean_shape"], ["expanded"], name="/Expand"),
        helper.make_node("Add", ["expanded", "zeros"], ["shifted"], name="/Add"),
        helper.make_node("Reshape", ["shifted", "flat_shape"], ["flat"], name="/Reshape"),
        helper.make_node("Max", ["flat", "low"], ["above_low"], name="/Max"),
        helper.make_node("Min", ["above_low", "high"], ["action"], name="/Min"),
    ]
    return _finish(nodes, "sb3_pendulum_like", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                   [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 1])], inits,
                   metadata={"action_low": "-2.0", "action_high": "2.0"})


def jax2onnx_like() -> onnx.ModelProto:
    """obs[B,6] -> Cast(float) -> MatMul + Add -> Tanh -> MatMul + Add -> Tanh -> action[B,2], opset 23, IR 10."""
    rng = np.random.default_rng(23)
    inits = [
        _tensor(rng, "dense_0/kernel", 6, 32), _tensor(rng, "dense_0/bias", 32, scale=0.1),
        _tensor(rng, "dense_1/kernel", 32, 2), _tensor(rng, "dense_1/bias", 2, scale=0.1),
    ]
    nodes = [
        helper.make_node("Cast", ["obs"], ["x"], name="convert_element_type", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "dense_0/kernel"], ["m0"], name="dot_general_0"),
        helper.make_node("Add", ["m0", "dense_0/bias"], ["z0"], name="add_0"),
        helper.make_node("Tanh", ["z0"], ["t0"], name="tanh_0"),
        helper.make_node("MatMul", ["t0", "dense_1/kernel"], ["m1"], name="dot_general_1"),
        helper.make_node("Add", ["m1", "dense_1/bias"], ["z1"], name="add_1"),
        helper.make_node("Tanh", ["z1"], ["action"], name="tanh_1"),
    ]
    return _finish(nodes, "jax2onnx_like", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", 6])],
                   [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["B", 2])], inits, opset=23, ir=10)


def write(model: onnx.ModelProto, directory, name: str):
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def sb3_multi_input_like(discrete_actions: int = 0) -> onnx.ModelProto:
    """SB3's MultiInputPolicy features: pos[B,3], vel[B,2] -> Flatten each -> Concat -> Gemm/Tanh x2 -> Gemm ->
    action[B,2]; with `discrete_actions`, the last Gemm gives that many Q-values and an ArgMax the action[B] (int64),
    as SB3's DQN exports. onnx2tf 1.29.24 converts it exact at batch 1 and wrong above it."""
    rng = np.random.default_rng(5)
    head = discrete_actions or 2
    inits = [_tensor(rng, "pi.0.weight", 16, 5), _tensor(rng, "pi.0.bias", 16, scale=0.1),
             _tensor(rng, "pi.2.weight", 16, 16), _tensor(rng, "pi.2.bias", 16, scale=0.1),
             _tensor(rng, "mu.weight", head, 16), _tensor(rng, "mu.bias", head, scale=0.1)]
    nodes = [
        helper.make_node("Flatten", ["pos"], ["pos_flat"], name="/features/pos/Flatten", axis=1),
        helper.make_node("Flatten", ["vel"], ["vel_flat"], name="/features/vel/Flatten", axis=1),
        helper.make_node("Concat", ["pos_flat", "vel_flat"], ["features"], name="/features/Concat", axis=1),
        helper.make_node("Gemm", ["features", "pi.0.weight", "pi.0.bias"], ["h0"], name="/pi/0/Gemm", transB=1),
        helper.make_node("Tanh", ["h0"], ["a0"], name="/pi/1/Tanh"),
        helper.make_node("Gemm", ["a0", "pi.2.weight", "pi.2.bias"], ["h1"], name="/pi/2/Gemm", transB=1),
        helper.make_node("Tanh", ["h1"], ["a1"], name="/pi/3/Tanh"),
        helper.make_node("Gemm", ["a1", "mu.weight", "mu.bias"], ["q_values" if discrete_actions else "action"],
                         name="/mu/Gemm", transB=1),
    ]
    action = helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])
    if discrete_actions:
        nodes.append(helper.make_node("ArgMax", ["q_values"], ["action"], name="/ArgMax", axis=1, keepdims=0))
        action = helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])
    return _finish(nodes, "sb3_multi_input_like", [helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["batch", 3]),
                                                   helper.make_tensor_value_info("vel", TensorProto.FLOAT, ["batch", 2])],
                   [action], inits)


def pixels_and_state_like() -> onnx.ModelProto:
    """image uint8[B,1,8,8] -> Cast -> Div 255 -> Flatten, state[B,4] -> Concat -> Gemm/Tanh x2 -> action[B,2].
    onnx2tf 1.29.24's conversion fails to reshape in XNNPack at a symbolic batch; at a fixed batch 1 it runs, its
    Cast and the inserted Transpose on builtin kernels."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(255, np.float32), "c255"), _tensor(rng, "W1", 32, 68),
             _tensor(rng, "b1", 32, scale=0.1), _tensor(rng, "W2", 2, 32), _tensor(rng, "b2", 2, scale=0.1)]
    nodes = [
        helper.make_node("Cast", ["image"], ["image_f"], name="/image/Cast", to=TensorProto.FLOAT),
        helper.make_node("Div", ["image_f", "c255"], ["image_scaled"], name="/image/Div"),
        helper.make_node("Flatten", ["image_scaled"], ["image_flat"], name="/image/Flatten", axis=1),
        helper.make_node("Concat", ["image_flat", "state"], ["features"], name="/features/Concat", axis=1),
        helper.make_node("Gemm", ["features", "W1", "b1"], ["h0"], name="/pi/0/Gemm", transB=1),
        helper.make_node("Tanh", ["h0"], ["a0"], name="/pi/1/Tanh"),
        helper.make_node("Gemm", ["a0", "W2", "b2"], ["h1"], name="/mu/Gemm", transB=1),
        helper.make_node("Tanh", ["h1"], ["action"], name="/mu/Tanh"),
    ]
    return _finish(nodes, "pixels_and_state_like", [helper.make_tensor_value_info("image", TensorProto.UINT8, ["batch", 1, 8, 8]),
                                                    helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", 4])],
                   [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])], inits)
