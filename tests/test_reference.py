"""The float64 reference is really float64 and really the same graph."""

import numpy as np
import onnx
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


def test_discrete_margins_come_from_the_argmax_logits():
    info = model.load(path("discrete_mlp"))
    feeds = observations.seeded(info, 16, 0)
    ref = reference.compute(info, feeds, 0)
    margins = ref.margins["action"]
    assert margins.shape == (16,) and np.all(margins >= 0) and margins.max() > 0
