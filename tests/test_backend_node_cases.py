"""ONNX's own backend node tests through the matrix: the tool must neither crash nor blame a correct runtime.

Each case is a model with fixed inputs and the outputs ONNX expects. It runs
as a user would run it (`policy-matrix run --obs inputs.npz`, in the test process) on ort-cpu (and
tract where installed); the saved float64 reference must equal ONNX's expected
outputs and the correct runtime must not FAIL. The test data ships inside
older onnx wheels: the onnx2tf environment's onnx has it (`make setup`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import load_results
from onnx import numpy_helper

from targets.paths import cache_dir

pytestmark = [pytest.mark.slow, pytest.mark.tflite_env]

# Chosen for what broke the tool: side inputs (a Gemm's C, a Reshape's shape, Clip's scalar
# bounds, RNN weights) that were sliced, rank-3 ArgMax parity, an explicit Cast to fp16, a float32 made
# by default in a function's expansion (ConstantOfShape without a value) that the float64 reference refused.
CASES = [
    "test_gemm_default_vector_bias", "test_gemm_default_scalar_bias", "test_gemm_all_attributes", "test_matmul_2d",
    "test_matmul_3d", "test_add_bcast", "test_sub_bcast", "test_clip", "test_reshape_reduced_dims",
    "test_reshape_negative_dim", "test_reduce_mean_default_axes_keepdims_example", "test_argmax_keepdims_random",
    "test_argmax_no_keepdims_random", "test_cast_FLOAT_to_FLOAT16", "test_gru_defaults", "test_lstm_defaults",
    "test_conv_with_strides_padding", "test_softmax_axis_1", "test_logsoftmax_axis_1", "test_attention_3d_causal_expanded",
]


def node_test_data() -> Path | None:
    found = sorted(cache_dir().glob("envs/*/lib/python*/site-packages/onnx/backend/test/data/node"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def data() -> Path:
    folder = node_test_data()
    if folder is None:
        pytest.skip("ONNX backend node test data not found: `make setup` builds the onnx2tf environment that has it")
    return folder


def _case(folder: Path, tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """The case's model, its inputs as an .npz keyed by input name, and the expected outputs."""
    model_path = tmp_path / "model.onnx"
    shutil.copyfile(folder / "model.onnx", model_path)
    graph = onnx.load(str(model_path)).graph
    initializers = {t.name for t in graph.initializer}
    inputs = [v.name for v in graph.input if v.name not in initializers]
    data_set = folder / "test_data_set_0"

    def tensors(prefix: str) -> list[np.ndarray]:
        files = sorted(data_set.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        return [numpy_helper.to_array(onnx.load_tensor(str(file))) for file in files]

    feeds = dict(zip(inputs, tensors("input")))
    np.savez(tmp_path / "inputs.npz", **feeds)
    expected = dict(zip([v.name for v in graph.output], tensors("output")))
    return model_path, tmp_path / "inputs.npz", expected


@pytest.mark.parametrize("name", CASES)
def test_backend_node_case_runs_and_the_reference_is_right(data, tmp_path, name, policy_matrix):
    model_path, inputs, expected = _case(data / name, tmp_path)
    out = tmp_path / "out"
    done = policy_matrix(["run", model_path, "--obs", inputs, "--targets", "ort-cpu,tract", "--precisions", "fp32",
                          "--iters", "3", "--warmup", "1", "--out", out])
    assert "Traceback" not in "\n".join(done.lines), done.lines
    reference = np.load(out / "reference.npz")
    for output, value in expected.items():
        got = reference[output]
        assert got.shape == value.shape, (output, got.shape, value.shape)
        if value.dtype.kind == "f":
            assert np.allclose(got, value.astype(np.float64), rtol=1e-5, atol=1e-6, equal_nan=True), output
        else:
            assert np.array_equal(got, value), output
    cells = {cell["target"]: cell for cell in load_results(out)["cells"]}
    assert cells["ort-cpu"]["verdict"] in ("PASS", "WARN"), cells["ort-cpu"]["reasons"]
    tract = cells["tract"]
    if tract["verdict"] == "FAIL":  # tract may refuse a model (its own words), never fail on the tool's account
        assert tract["error"] and tract["error"]["stage"] in ("prepare", "open", "first run"), tract["reasons"]
    else:
        assert tract["verdict"] in ("PASS", "WARN", "SKIP"), tract["reasons"]


@pytest.mark.browser
def test_pow_passes_on_webgl_and_webgpu_on_its_relative_error(data, tmp_path, policy_matrix):
    """test_pow's largest output is about 1357: the software WebGL/WebGPU adapters drift ~6e-4 there, a relative
    error below 1e-6 that atol + rtol·|ref| passes (an absolute 1e-4 alone FAILed both)."""
    model_path, inputs, _ = _case(data / "test_pow", tmp_path)
    done = policy_matrix(["run", model_path, "--obs", inputs, "--targets", "ort-web-webgl,ort-web-webgpu", "--precisions",
                          "fp32", "--iters", "3", "--warmup", "1", "--out", tmp_path / "out"])
    assert "Traceback" not in "\n".join(done.lines), done.lines
    for cell in load_results(tmp_path / "out")["cells"]:
        (parity,) = cell["parity"]
        assert cell["verdict"] in ("PASS", "WARN") and parity["tolerance_used"] <= 1, (cell["target"], cell["reasons"])
        assert parity["max_rel"] < 1e-5, (cell["target"], parity)
