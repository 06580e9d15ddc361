"""The tflite targets, for real: onnx2tf converts in its own environment, LiteRT runs.

Needs `make setup-tflite` (the onnx2tf environment) and ai-edge-litert; a
missing piece FAILs these tests with what to run, it never skips them.
Converted files land in the shared cache (POLICY_MATRIX_CACHE), so a second
`make test` converts nothing; the test of onnx2tf's refusal (cached too) keeps a
cache of its own, so onnx2tf refuses it every session.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

import targets
from matrix.inputs import examples, model, observations
from targets.paths import cache_dir
from targets import tflite, tflite_conversion
from targets.base import PrepareContext
from targets.tflite_provenance import BUILTIN, XNNPACK

pytestmark = [pytest.mark.tflite_env]

POLICIES = ["continuous_mlp", "discrete_mlp", "pixel_cnn"]
FP32_TOLERANCE = 1e-5  # max abs drift vs ORT CPU fp32
VARIANT_TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "int8": 0.1}


@pytest.fixture(scope="module", autouse=True)
def tflite_available():
    reason = targets.get("tflite").unavailable_reason()
    assert reason is None, reason


def context(onnx_path: Path, workdir: Path, n_obs: int = 64, cache: Path | None = None) -> PrepareContext:
    info = model.load(onnx_path)
    return PrepareContext(
        onnx_variants={"fp32": onnx_path},
        calibration=observations.seeded(info, n_obs, seed=0),
        batch_axes=info.batch_axes,
        workdir=workdir,
        cache_dir=cache or cache_dir(),
    )


def ort_outputs(onnx_path: Path, feeds) -> dict:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def run_cell(target_name: str, policy: str, variant: str, workdir: Path):
    target = targets.get(target_name)
    ctx = context(examples.path(policy), workdir)
    artifact = target.prepare(ctx, variant)
    session = target.open(artifact, threads=1)
    return ctx, artifact, session


def max_drift(got: dict, expected: dict) -> float:
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    return max(float(np.max(np.abs(got[k].astype(np.float64) - expected[k]))) for k in expected)


@pytest.mark.parametrize("target_name", ["tflite", "tflite-noxnn"])
@pytest.mark.parametrize("policy", POLICIES)
def test_fp32_matches_onnxruntime(target_name, policy, tmp_path):
    ctx, _, session = run_cell(target_name, policy, "fp32", tmp_path)
    feeds = ctx.calibration
    got, expected = session.run(feeds), ort_outputs(ctx.fp32_model, feeds)
    if policy == "discrete_mlp":  # integer actions: the same choices
        assert np.array_equal(got["action"], expected["action"])
        assert got["action"].dtype == expected["action"].dtype
    else:
        assert max_drift(got, expected) < FP32_TOLERANCE


@pytest.mark.parametrize("variant", ["fp16", "int8"])
@pytest.mark.parametrize("policy", ["continuous_mlp", "pixel_cnn"])
def test_reduced_precision_stays_close(policy, variant, tmp_path):
    ctx, artifact, session = run_cell("tflite", policy, variant, tmp_path)
    drift = max_drift(session.run(ctx.calibration), ort_outputs(ctx.fp32_model, ctx.calibration))
    assert 0 < drift < VARIANT_TOLERANCE[variant]  # > 0: it really is a different artifact
    fp32 = targets.get("tflite").prepare(ctx, "fp32")
    assert artifact.size_bytes < fp32.size_bytes


def test_full_integer_int8_is_calibrated_and_maps_renamed_outputs(tmp_path):
    ctx, artifact, session = run_cell("tflite-int8-full", "continuous_mlp", "int8", tmp_path)
    assert artifact.op_inventory.get("QUANTIZE") and artifact.op_inventory.get("DEQUANTIZE")
    got = session.run(ctx.calibration)  # the converter named this output output_0; we map it back
    assert 0 < max_drift(got, ort_outputs(ctx.fp32_model, ctx.calibration)) < 0.3
    assert targets.get("tflite-int8-full").variant_skip_reason("fp32")


@pytest.mark.parametrize("batch", [1, 2, 7, 64])
def test_dynamic_batch_resizes(batch, tmp_path):
    ctx, _, session = run_cell("tflite", "pixel_cnn", "fp32", tmp_path)
    feeds = observations.take(ctx.calibration, batch, ctx.batch_axes)
    assert session.run(feeds)["action"].shape == (batch, 3)
    assert max_drift(session.run(feeds), ort_outputs(ctx.fp32_model, feeds)) < FP32_TOLERANCE


def test_image_policy_keeps_nchw_and_says_layout_changed(tmp_path):
    _, artifact, session = run_cell("tflite", "pixel_cnn", "fp32", tmp_path)
    assert any("kept NCHW" in note for note in artifact.notes)
    assert session.inputs == {"obs": session.inputs["obs"]}
    assert artifact.op_inventory["CONV_2D"] == 2


def test_xnnpack_placement_marks_argmax_fallback(tmp_path):
    _, _, session = run_cell("tflite", "discrete_mlp", "fp32", tmp_path)
    rows = session.placement()
    by_op = {(row.node, row.op_type): row for row in rows}
    assert by_op[("greedy", "ARG_MAX")].where == BUILTIN
    assert by_op[("greedy", "ARG_MAX")].fallback
    assert by_op[("fc0", "FULLY_CONNECTED")].where == XNNPACK
    assert not by_op[("fc0", "FULLY_CONNECTED")].fallback
    assert {"fc0", "act0", "fc1", "act1", "q", "greedy"} <= {row.node for row in rows}
    backend = session.backend()
    assert backend.matches and backend.actual == XNNPACK and "ARG_MAX" in backend.detail


def test_without_xnnpack_everything_runs_on_builtin_kernels(tmp_path):
    _, _, session = run_cell("tflite-noxnn", "discrete_mlp", "fp32", tmp_path)
    rows = session.placement()
    assert rows and all(row.where == BUILTIN and not row.fallback for row in rows)
    assert session.backend().matches


def test_time_reports_nanoseconds_per_call(tmp_path):
    ctx, _, session = run_cell("tflite", "continuous_mlp", "fp32", tmp_path)
    samples = session.time(observations.take(ctx.calibration, 64, ctx.batch_axes), warmup=5, iters=50)
    assert len(samples) == 50 and all(isinstance(s, int) and 0 < s < 50_000_000 for s in samples)


def test_conversion_is_cached_by_content(tmp_path):
    target = targets.get("tflite")
    first = target.prepare(context(examples.path("continuous_mlp"), tmp_path / "a"), "fp32")
    started = time.perf_counter()
    again = target.prepare(context(examples.path("continuous_mlp"), tmp_path / "b"), "fp32")
    assert time.perf_counter() - started < 2.0  # no onnx2tf run
    assert again.path == first.path and again.conversion_s == first.conversion_s > 0
    assert any("(cached)" in note for note in again.notes)
    assert again.op_inventory == {"FULLY_CONNECTED": 3, "RESHAPE": 3, "TANH": 3}


def test_calibration_set_is_part_of_the_full_int8_key(tmp_path):
    onnx_path = examples.path("continuous_mlp")
    one, other = context(onnx_path, tmp_path, n_obs=64), context(onnx_path, tmp_path, n_obs=32)
    assert tflite_conversion.cache_key(onnx_path, "full", one.calibration) != tflite_conversion.cache_key(onnx_path, "full", other.calibration)
    assert tflite_conversion.cache_key(onnx_path, "dynamic", {}) != tflite_conversion.cache_key(onnx_path, "full", one.calibration)


def tiny_model(path: Path, nodes, initializers=()) -> Path:
    graph = helper.make_graph(
        nodes, path.stem,
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 4])],
        list(initializers),
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, str(path))
    return path


def test_flex_op_converts_but_fails_to_open_with_litert_words(tmp_path):
    """onnx2tf lowers Softsign to a Select-TF (Flex) op; LiteRT has no Flex delegate."""
    path = tiny_model(tmp_path / "softsign.onnx", [helper.make_node("Softsign", ["obs"], ["action"], name="squash")])
    target = targets.get("tflite")
    artifact = target.prepare(context(path, tmp_path), "fp32")
    assert "FlexSoftsign" in artifact.op_inventory
    assert any("Flex" in note for note in artifact.notes)
    with pytest.raises(RuntimeError, match="Select TensorFlow op"):
        target.open(artifact, threads=1)


def test_unconvertible_op_fails_with_onnx2tf_words(tmp_path):
    like = numpy_helper.from_array(np.zeros(1, np.float64), "like")
    path = tiny_model(tmp_path / "castlike.onnx", [
        helper.make_node("CastLike", ["obs", "like"], ["wide"], name="widen"),
        helper.make_node("Cast", ["wide"], ["action"], name="narrow", to=TensorProto.FLOAT),
    ], [like])
    ctx = context(path, tmp_path, cache=tmp_path / "cache")  # its own: onnx2tf refuses it every session
    with pytest.raises(RuntimeError, match="CastLike OP is not yet implemented") as converted:
        targets.get("tflite").prepare(ctx, "fp32")
    assert "cached" not in str(converted.value)
    with pytest.raises(RuntimeError) as cached:
        targets.get("tflite-noxnn").prepare(ctx, "fp16")  # another cell of the same conversion
    assert str(cached.value) == f"{converted.value} (onnx2tf's words when it converted this model, cached)"


def test_missing_environment_says_how_to_build_it(tmp_path, monkeypatch):
    pins = tmp_path / "onnx2tf.txt"
    pins.write_text(tflite.REQUIREMENTS.read_text() + "# a change that would need a new environment\n")
    monkeypatch.setattr(tflite, "REQUIREMENTS", pins)
    assert "policy-matrix setup tflite" in targets.get("tflite").unavailable_reason()


def test_whole_run_through_the_cli(tmp_path):
    out = tmp_path / "report"
    done = run_cli("run", examples.path("continuous_mlp"), "--targets", "ort-cpu,tflite,tflite-noxnn",
                   "--iters", "50", "--warmup", "5", "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    cells = json.loads((out / "results.json").read_text())["cells"]
    tflite_cells = {(c["target"], c["variant"]): c for c in cells if c["target"].startswith("tflite")}
    assert len(tflite_cells) == 6 and all(c["verdict"] == "PASS" for c in tflite_cells.values())
    assert tflite_cells[("tflite", "fp32")]["backend"]["actual"] == XNNPACK
    assert tflite_cells[("tflite", "fp32")]["artifact"]["op_inventory"]["FULLY_CONNECTED"] == 3


@pytest.mark.parametrize("target_name, variant", [("tflite", "fp32"), ("tflite-int8-full", "int8")])
def test_exporter_style_node_names_come_back_unchanged(target_name, variant, tmp_path):
    """PyTorch names nodes "/actor/fc/Gemm"; onnx2tf respells a leading "/" (int8) and ":"."""
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "actor.fc.weight")
    path = tiny_model(tmp_path / "torch_style.onnx", [
        helper.make_node("Gemm", ["obs", "actor.fc.weight"], ["/actor/fc/Gemm_output_0"], name="/actor/fc/Gemm", transB=1),
        helper.make_node("Tanh", ["/actor/fc/Gemm_output_0"], ["action"], name="/actor/Tanh:0"),
    ], [weight])
    target = targets.get(target_name)
    session = target.open(target.prepare(context(path, tmp_path), variant), threads=1)
    nodes = {row.node for row in session.placement()}
    assert {"/actor/fc/Gemm", "/actor/Tanh:0"} <= nodes, nodes


def test_a_bound_the_full_integer_output_grid_rounds_is_no_broken_contract(tmp_path, policy_matrix):
    """A TD3 actor clamped to [-0.3012, 0.6988]: LiteRT's full-integer file clips on int8 and dequantizes with step
    1/255, whose nearest point to -0.3012 is -77/255 = -0.30196; driving Pendulum, the cell FAILed 'action bounds:
    [-0.3019, 0.6941] leaves [-0.3012, 0.6988]' at drift 0.012, for the tool's own calibrated conversion."""
    import policies

    path = policies.save(policies.td3_actor(-0.3012, 0.6988), tmp_path, "td3")
    observations = tmp_path / "obs.npy"  # spread enough that the actor reaches both bounds, calibration too
    np.save(observations, np.random.default_rng(0).normal(0, 2, size=(64, 3)).astype(np.float32))
    done = policy_matrix(["run", path, "--targets", "tflite-int8-full", "--variants", "int8", "--obs", observations,
                          "--iters", "5", "--warmup", "1", "--out", tmp_path / "out"])
    cell = json.loads((tmp_path / "out" / "results.json").read_text())["cells"][0]
    assert cell["verdict"] != "FAIL", (cell["reasons"], done.stderr)
    step = cell["artifact"]["output_steps"]["action"]
    bounds = next(c for c in cell["contract"] if c["name"] == "action bounds")
    assert bounds["ok"] is True and f"as its integer output grid (step {step:.3g}) holds them" in bounds["detail"], bounds
