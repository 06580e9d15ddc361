"""Graphs whose precision variants the converters get wrong, built the way their exporters write them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from matrix.inputs.examples import path as example

OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def skl2onnx_regressor() -> onnx.ModelProto:
    """skl2onnx's MLPRegressor: a leading Cast of the float input, unnamed batch dims ([?, 6]), MatMul + Add
    layers (SB3's legacy torch export also starts with a float Cast): onnxconverter-common's whole fp16
    conversion leaves the Cast's float32 output feeding float16 weights."""
    rng = np.random.default_rng(7)
    w1, b1 = rng.normal(0, 0.4, (6, 16)).astype(np.float32), rng.normal(0, 0.1, 16).astype(np.float32)
    w2, b2 = rng.normal(0, 0.25, (16, 2)).astype(np.float32), rng.normal(0, 0.1, 2).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["float_input"], ["cast_input"], to=TensorProto.FLOAT, name="Cast"),
        helper.make_node("MatMul", ["cast_input", "coefficient"], ["mul_result"], name="MatMul"),
        helper.make_node("Add", ["mul_result", "intercepts"], ["add_result"], name="Add"),
        helper.make_node("Relu", ["add_result"], ["next_activations"], name="Relu"),
        helper.make_node("MatMul", ["next_activations", "coefficient1"], ["mul_result1"], name="MatMul1"),
        helper.make_node("Add", ["mul_result1", "intercepts1"], ["variable"], name="Add1"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w1, "coefficient"), (b1, "intercepts"), (w2, "coefficient1"), (b2, "intercepts1")]]
    return _model(helper.make_graph(
        nodes, "mlp_regressor", [helper.make_tensor_value_info("float_input", TensorProto.FLOAT, [None, 6])],
        [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 2])], inits))


def weights_in_if_branches() -> onnx.ModelProto:
    """Weights as Constant nodes inside If branches (as tf2onnx and torch's scripted exports write control
    flow): a count that reads only the main graph's initializers sees no weight at all."""
    def branch(name: str, seed: int) -> onnx.GraphProto:
        weight = np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32)
        return helper.make_graph(
            [helper.make_node("Constant", [], [f"{name}_w"], value=numpy_helper.from_array(weight, f"{name}_w")),
             helper.make_node("MatMul", ["obs", f"{name}_w"], [f"{name}_y"])],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 3])])

    nodes = [
        helper.make_node("ReduceSum", ["obs"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["total"], ["sum"], keepdims=0),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.float32))),
        helper.make_node("Greater", ["sum", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["action"], then_branch=branch("then", 1), else_branch=branch("else", 2)),
    ]
    return _model(helper.make_graph(
        nodes, "if_policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 3])]))


def stateful_detector() -> onnx.ModelProto:
    """silero-vad's interface: audio `input [batch, samples]` (both symbolic) and `state [2, batch, 8]` ->
    `output [batch, 1]`, `stateN [2, batch, 8]`. onnxsim at batch 1 fixes every symbolic dim, not only the batch."""
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["level"], axes=[1], keepdims=1, name="level"),
        helper.make_node("Unsqueeze", ["level", "axis0"], ["level3"], name="lift"),
        helper.make_node("Add", ["state", "level3"], ["carried"], name="carry"),
        helper.make_node("Mul", ["carried", "decay"], ["stateN"], name="decay"),
        helper.make_node("ReduceMean", ["stateN"], ["pooled"], axes=[0, 2], keepdims=0, name="pool"),
        helper.make_node("Unsqueeze", ["pooled", "axis1"], ["pooled2"], name="column"),
        helper.make_node("Sigmoid", ["pooled2"], ["output"], name="speech"),
    ]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "axis0"), numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array([0.9, 0.5], np.float32).reshape(2, 1, 1), "decay")]
    return _model(helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 8])], inits))


def user_qdq_int8(folder: Path) -> Path:
    """The bundled MLP as a user quantizes it with ONNX Runtime's static QDQ quantization at the model's own
    opset (17): QuantizeLinear/DequantizeLinear pairs around float Gemms, int32 biases dequantized too."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    source = example("continuous_mlp")
    rows = np.random.default_rng(0).normal(size=(16, 1, 17)).astype(np.float32)

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.rows = iter(rows)

        def get_next(self):
            return next(({"obs": row} for row in self.rows), None)

    path = folder / "qdq.onnx"
    quantize_static(source, path, Calibration(), quant_format=QuantFormat.QDQ)
    return path
