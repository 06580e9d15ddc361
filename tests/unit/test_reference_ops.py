"""The float64 reference evaluates GatherElements as the spec (and ONNX Runtime) do, where onnx.reference
itself refuses: torch writes `axis=-1` for `gather(-1, ...)`, as in Stable-Baselines3's PPO log_prob."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from matrix.inputs import model as model_loader
from matrix.reference import reference


def log_prob_policy(tmp_path, axis: int):
    """logits -> (argmax action, log-softmax gathered at the action): the shape SB3's export writes."""
    nodes = [
        helper.make_node("LogSoftmax", ["obs"], ["log_p"], axis=-1),
        helper.make_node("ArgMax", ["obs"], ["action"], axis=-1, keepdims=1),
        helper.make_node("GatherElements", ["log_p", "action"], ["log_prob"], axis=axis),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch", 1]),
                               helper.make_tensor_value_info("log_prob", TensorProto.FLOAT, ["batch", 1])])
    path = tmp_path / "policy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("axis", [-1, 1])
def test_the_reference_gathers_along_a_negative_axis_as_onnx_runtime_does(tmp_path, axis):
    path = log_prob_policy(tmp_path, axis)
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["log_prob"], {"obs": obs})[0]
    ref = reference.compute(model_loader.load(path), {"obs": obs}, batch=1)
    assert ref.outputs["log_prob"].shape == (5, 1)
    np.testing.assert_allclose(ref.outputs["log_prob"], expected, atol=1e-6)


def test_indices_smaller_than_the_data_on_other_axes_and_negative_indices():
    data = np.arange(12, dtype=np.float64).reshape(3, 4)
    indices = np.array([[-1], [0]])  # two rows of three, one column of four: the output has the indices' shape
    node = helper.make_node("GatherElements", ["data", "indices"], ["out"], axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("data", TensorProto.DOUBLE, [3, 4]),
                                            helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 1])],
                              [helper.make_tensor_value_info("out", TensorProto.DOUBLE, [2, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (out,) = reference.evaluator_for(model).run(None, {"data": data, "indices": indices})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"data": data, "indices": indices})[0]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out, [[3.0], [4.0]])
