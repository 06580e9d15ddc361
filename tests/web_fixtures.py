"""Policies built in the tests for the browser/node targets.

`softsign_mlp` uses Softsign, which onnxruntime-web's WebGPU EP does not
implement: ORT places that node on the CPU EP, so placement must show it as a
fallback while the Gemm nodes stay on WebGPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def softsign_mlp() -> onnx.ModelProto:
    """obs[B,5] -> Gemm -> Softsign -> Gemm -> Tanh -> action[B,2]."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (16, 5)).astype(np.float32), "fc0.weight"),
        numpy_helper.from_array(rng.normal(0, 0.1, (16,)).astype(np.float32), "fc0.bias"),
        numpy_helper.from_array(rng.normal(0, 0.25, (2, 16)).astype(np.float32), "head.weight"),
        numpy_helper.from_array(rng.normal(0, 0.1, (2,)).astype(np.float32), "head.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["obs", "fc0.weight", "fc0.bias"], ["h0"], name="fc0", transB=1),
        helper.make_node("Softsign", ["h0"], ["a0"], name="soft0"),
        helper.make_node("Gemm", ["a0", "head.weight", "head.bias"], ["head_out"], name="head", transB=1),
        helper.make_node("Tanh", ["head_out"], ["action"], name="squash"),
    ]
    graph = helper.make_graph(
        nodes, "softsign_mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="policy-matrix-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def softsign_only() -> onnx.ModelProto:
    """obs[B,4] -> Softsign -> action[B,4]: nothing in it that WebGPU implements."""
    graph = helper.make_graph(
        [helper.make_node("Softsign", ["obs"], ["action"], name="soft")], "softsign_only",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="policy-matrix-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def write(model: onnx.ModelProto, directory: Path, name: str) -> Path:
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path
