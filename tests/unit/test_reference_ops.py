"""The float64 reference's own operators (matrix/reference/reference_ops.py) do as the spec and ONNX Runtime do,
where onnx.reference refuses: GatherElements along `axis=-1`, which torch writes for `gather(-1, ...)` (Stable-Baselines3's
PPO log_prob), DequantizeLinear below opset 19, the deprecated Scatter of opset 9-10 exports."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import variant_policies
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


def test_the_reference_dequantizes_a_qdq_model_below_opset_19_as_onnx_runtime_does(tmp_path):
    """Compared with ONNX Runtime running the graph as written (no optimization): its default fuses each
    DequantizeLinear-Gemm-QuantizeLinear into an int8 kernel whose signed weights saturate on x86 (measured:
    0.28 off this reference, and 0.28 off its own unoptimized run), which is the runtime's doing, for a cell."""
    path = variant_policies.user_qdq_int8(tmp_path)
    assert {n.op_type for n in onnx.load(path).graph.node} >= {"QuantizeLinear", "DequantizeLinear"}
    obs = np.random.default_rng(1).normal(size=(32, 17)).astype(np.float32)
    as_written = ort.SessionOptions()
    as_written.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), as_written, providers=["CPUExecutionProvider"])
    ref = reference.compute(model_loader.load(path), {"obs": obs}, batch=8)
    assert ref.outputs["action"].dtype == np.float64
    np.testing.assert_allclose(ref.outputs["action"], session.run(["action"], {"obs": obs})[0], atol=1e-5)


def test_int32_values_dequantize_exactly_in_float64():
    """A QDQ bias is int32: above 2**24 float32 would round it before the scale applies."""
    node = helper.make_node("DequantizeLinear", ["x", "scale", "zero"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])],
                              [helper.make_tensor("scale", TensorProto.DOUBLE, [], [0.5]),
                               helper.make_tensor("zero", TensorProto.INT32, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (out,) = reference.evaluator_for(model).run(None, {"x": np.array([2**24 + 1, -3], np.int32)})
    np.testing.assert_array_equal(out, [(2**24 + 1) / 2, -1.5])


def test_the_reference_scatters_with_the_deprecated_scatter_as_onnx_runtime_does(tmp_path):
    """An opset-10 export's Scatter: the whole run was refused, with no reference to judge any runtime against."""
    nodes = [helper.make_node("Scatter", ["obs", "where", "values"], ["action"], axis=1)]
    where = helper.make_tensor("where", TensorProto.INT64, [1, 2], [2, 0])
    values = helper.make_tensor("values", TensorProto.FLOAT, [1, 2], [10.0, -10.0])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, 3])], [where, values])
    path = tmp_path / "scatter.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)]), path)
    obs = np.array([[1.0, 2.0, 3.0]], np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})[0]
    ref = reference.compute(model_loader.load(path), {"obs": obs}, batch=1)
    np.testing.assert_array_equal(ref.outputs["action"], [[-10.0, 2.0, 10.0]])
    np.testing.assert_array_equal(ref.outputs["action"], expected)
