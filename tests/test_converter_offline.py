"""Converters run with network access disabled on purpose, so their own errors show (targets/tflite_convert.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import load_results, run_cli
from onnx import TensorProto, helper, numpy_helper

from targets.paths import cache_dir

pytestmark = [pytest.mark.tflite_env, pytest.mark.slow]


def deconv_policy() -> onnx.ModelProto:
    """A ConvTranspose on a 4D input whose last dim is 3: onnx2tf fetches sample images for it from the network."""
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(3, 2, 3, 3)).astype(np.float32), "deconv.weight")
    nodes = [helper.make_node("ConvTranspose", ["obs", "deconv.weight"], ["y"], name="deconv"),
             helper.make_node("Flatten", ["y"], ["action"], name="flat")]
    graph = helper.make_graph(nodes, "deconv", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 3, 8, 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, 100])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_onnx2tf_shows_its_own_error_not_a_download_failure(tmp_path, monkeypatch):
    # A cache of its own (the shared one's converter environments linked in): onnx2tf's refusal is cached by content,
    # and this test is about onnx2tf itself running offline, every session.
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "envs").symlink_to(cache_dir() / "envs")
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))
    onnx.save(deconv_policy(), str(tmp_path / "deconv.onnx"))
    done = run_cli("run", tmp_path / "deconv.onnx", "--targets", "tflite", "--precisions", "fp32", "--iters", "5",
                   "--warmup", "1", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    cell, = load_results(tmp_path / "out")["cells"]
    reason = " ".join(cell["reasons"])
    # Measured with onnx2tf 1.29.24: offline, its sample-image download ended the conversion with a ConnectionError.
    assert cell["verdict"] == "FAIL" and "axes don't match array" in reason, reason
    assert "Connection" not in reason and "github" not in reason
