"""The float64 reference is really float64 and really the same graph."""

import numpy as np
import onnx
import pytest
import onnx.reference
from onnx import TensorProto, helper

from matrix.inputs import model, observations
from matrix.reference import reference
from matrix.inputs.examples import path


def test_reference_is_float64_and_close_to_ort_fp32():
    for name in ("continuous_mlp", "pixel_cnn"):
        info = model.load(path(name))
        feeds = observations.seeded(info, 32, 0)
        ref = reference.compute(info, feeds, 0)
        assert ref.outputs["action"].dtype == np.float64
        drift = np.abs(reference.dev_runtime(info, feeds, 0)["action"] - ref.outputs["action"]).max()
        assert 0 < drift < 1e-5, (name, drift)  # fp32 rounding shows, and stays small


def test_widening_covers_constants_and_casts():
    nodes = [
        helper.make_node("Constant", [], ["three"], value_float=3.0),  # exact in float32
        helper.make_node("Div", ["x", "three"], ["y0"]),
        helper.make_node("Cast", ["y0"], ["action"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 1])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    wide = reference.to_float64(proto)
    out = onnx.reference.ReferenceEvaluator(wide).run(None, {"x": np.array([[1.0]])})[0]
    assert out.dtype == np.float64 and out[0, 0] == 1 / 3  # exact in float64, not float32's 0.33333334


def _one_third_of_x(proto: onnx.ModelProto) -> np.ndarray:
    wide = reference.to_float64(proto)
    out = onnx.reference.ReferenceEvaluator(wide).run(None, {"x": np.array([[1.0]])})[0]
    assert out.dtype == np.float64 and out[0, 0] == 1 / 3  # exact in float64, not float32's 0.33333334


@pytest.mark.parametrize("maker", [
    [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("ConstantOfShape", ["shape"], ["zeros"])],
    [helper.make_node("RandomNormalLike", ["x"], ["zeros"], dtype=TensorProto.FLOAT, scale=0.0)],
    [helper.make_node("RandomUniform", [], ["zeros"], shape=[1, 1], low=0.0, high=0.0)],
], ids=["ConstantOfShape-without-value", "RandomNormalLike-dtype-float", "RandomUniform-default-dtype"])
def test_widening_covers_what_ops_make_of_a_given_dtype_or_of_their_float_default(maker):
    """Each was a valid model ORT runs and the tool refused (exit 2, "the float64 reference could not be computed:
    Input type mismatch"): ONNX's own expanded Attention tests (ConstantOfShape with no value: float32 zeros), a
    sampling policy's noise (RandomNormalLike dtype=FLOAT; RandomUniform's float default)."""
    nodes = [*maker,
             helper.make_node("Add", ["x", "zeros"], ["sum"]),  # Add, unlike Sum, refuses a float32 beside a float64
             helper.make_node("Constant", [], ["three"], value_float=3.0),
             helper.make_node("Div", ["sum", "three"], ["action"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 1])])
    _one_third_of_x(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_widening_covers_the_models_local_functions():
    """An exporter may keep a module as a local function (onnxscript, torch's dynamo exporter): its constants meet
    the call's float64 inputs."""
    third = helper.make_function("local", "Third", ["v"], ["w"], [
        helper.make_node("Constant", [], ["three"], value=helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])),
        helper.make_node("Div", ["v", "three"], ["w"])], [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Third", ["x"], ["action"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 1])])
    _one_third_of_x(helper.make_model(graph, functions=[third],
                                      opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))


def test_discrete_margins_come_from_the_argmax_logits():
    info = model.load(path("discrete_mlp"))
    feeds = observations.seeded(info, 16, 0)
    ref = reference.compute(info, feeds, 0)
    margins = ref.margins["action"]
    assert margins.shape == (16,) and np.all(margins >= 0) and margins.max() > 0
