"""CoreML targets: real conversions (every host), real prediction (macOS only).

Off macOS the Apple runtime cannot run, so these tests cover everything around
it: conversion of the bundled policies, the op inventory and its ONNX
provenance, the cache, converter failures in the converter's own words, the
prediction process's pipe, and the SKIP reasons. The tests marked darwin run
Core ML itself on the nightly macOS job.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import targets
from matrix.inputs.examples import path as example
from targets import coreml
from targets.coreml_conversion import conversion_key
from targets.paths import cache_dir
from targets.base import CellSkip, PrepareContext

pytestmark = [pytest.mark.coreml_env]

on_macos = sys.platform == "darwin"
macos_only = pytest.mark.skipif(not on_macos, reason="Core ML prediction needs macOS")
linux_only = pytest.mark.skipif(on_macos, reason="checks the off-macOS behaviour")

# MIL ops each bundled policy must become (fp32; fp16 adds the I/O casts).
EXPECTED_OPS = {
    "continuous_mlp": {"linear": 3, "tanh": 3},
    "discrete_mlp": {"linear": 3, "relu": 2, "reduce_argmax": 1},
    "pixel_cnn": {"conv": 2, "relu": 3, "reshape": 1, "linear": 2, "tanh": 1},
}


def context(model_path: Path, tmp_path: Path, cache: Path | None = None) -> PrepareContext:
    """A PrepareContext with observations drawn for the model's first input. Conversions land in the shared cache
    (POLICY_MATRIX_CACHE), keyed by content as the tool keys them (the ONNX bytes, the variant, the environment's
    pins and the conversion script): a model converts for real once, and again whenever any of those changes.
    Tests about the cache or about failures bring their own, so the converter runs on every `make test` too."""
    graph = onnx.load(model_path).graph
    value = graph.input[0]
    shape = [dim.dim_value or 16 for dim in value.type.tensor_type.shape.dim]
    feeds = {value.name: np.random.default_rng(0).normal(size=shape).astype(np.float32)}
    workdir = tmp_path / "cell"
    workdir.mkdir(exist_ok=True)
    return PrepareContext(onnx_variants={"fp32": model_path}, calibration=feeds, batch_axes={value.name: 0}, workdir=workdir,
                          cache_dir=cache or cache_dir())


def policy(tmp_path: Path, name: str, nodes: list, initializers: list, opset: int) -> Path:
    """A small obs[B,4] -> action[B,4] policy written to disk."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 4])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_bundled_policies_convert_with_an_op_inventory(tmp_path, name, variant):
    artifact = targets.get("coreml").prepare(context(example(name), tmp_path), variant)
    expected = dict(EXPECTED_OPS[name])
    if variant == "fp16":  # coremltools' fp16 pass casts the fp32 input and float outputs
        expected["cast"] = 2 if name != "discrete_mlp" else 1
    assert artifact.op_inventory == expected
    assert artifact.path.suffix == ".mlpackage" and (artifact.path / "Manifest.json").exists()
    assert artifact.size_bytes > 1000 and artifact.conversion_s > 0
    ops = artifact.conversion["ops"]
    onnx_nodes = {node.name: node.op_type for node in onnx.load(example(name)).graph.node}
    traced = [op for op in ops if not op["inserted_by"]]
    assert traced and all(onnx_nodes.get(op["onnx_node"]) == op["onnx_op"] for op in traced), ops
    assert {op["onnx_node"] for op in traced} == set(onnx_nodes)  # every ONNX node is accounted for
    assert (tmp_path / "cell" / "coreml_ops.json").exists()


def test_precision_is_stated_in_the_notes(tmp_path):
    ctx = context(example("continuous_mlp"), tmp_path)
    fp16 = targets.get("coreml").prepare(ctx, "fp16").notes
    fp32 = targets.get("coreml").prepare(ctx, "fp32").notes
    assert any("FLOAT16" in note and "default" in note for note in fp16), fp16
    assert any("FLOAT32" in note for note in fp32), fp32


def test_int8_stores_int8_weights_and_is_smaller(tmp_path):
    ctx = context(example("pixel_cnn"), tmp_path)
    fp16 = targets.get("coreml").prepare(ctx, "fp16")
    int8 = targets.get("coreml").prepare(ctx, "int8")
    assert int8.op_inventory["constexpr_affine_dequantize"] == 4  # two conv + two linear weights
    dequantized = [op for op in int8.conversion["ops"] if op["mil_op"] == "constexpr_affine_dequantize"]
    assert {op["onnx_op"] for op in dequantized} == {"Conv", "Gemm"}
    assert int8.size_bytes < 0.7 * fp16.size_bytes


def test_int64_actions_come_back_as_int64(tmp_path):
    artifact = targets.get("coreml").prepare(context(example("discrete_mlp"), tmp_path), "fp32")
    assert artifact.conversion["outputs"]["action"]["dtype"] == "int64"
    assert any("int32 inside Core ML" in note for note in artifact.notes)


def test_conversions_are_cached_by_content(tmp_path):
    ctx = context(example("continuous_mlp"), tmp_path, cache=tmp_path / "cache")
    first = targets.get("coreml").prepare(ctx, "fp32")
    started = time.perf_counter()
    again = targets.get("coreml").prepare(ctx, "fp32")
    assert time.perf_counter() - started < 1.0  # no converter process was started
    assert again.path == first.path and any("cache" in note for note in again.notes)
    assert not any("cache" in note for note in first.notes)
    # Another model's bytes name another entry. Read from the key the entry is named by, as tests/test_tflite.py reads
    # its own: converting a second model here cost a torch process (~9 CPU s) to show one path differs.
    other = context(example("discrete_mlp"), tmp_path)
    key = conversion_key(ctx.fp32_model, "fp32", ctx.batch_axes)
    assert first.path == tmp_path / "cache" / "coreml" / key / "model.mlpackage"
    assert conversion_key(other.fp32_model, "fp32", other.batch_axes) != key


def test_an_op_the_converter_lacks_fails_in_its_own_words(tmp_path):
    # onnx2torch 1.5.15 has no Cast converter for opset 23.
    path = policy(tmp_path, "cast23", [helper.make_node("Cast", ["obs"], ["action"], name="recast", to=TensorProto.FLOAT)], [], 23)
    ctx = context(path, tmp_path, cache=tmp_path / "cache")
    with pytest.raises(RuntimeError, match="Converter is not implemented.*Cast.*version=23") as converted:
        targets.get("coreml").prepare(ctx, "fp32")
    assert "cached" not in str(converted.value)
    with pytest.raises(RuntimeError) as cached:
        targets.get("coreml").prepare(ctx, "fp32")
    assert str(cached.value) == f"{converted.value} (the converter's words when it converted this model, cached)"


def test_min_max_clipping_converts_through_the_broadcast_to_alias(tmp_path):
    # onnx2torch lowers a two-input Min/Max to torch.broadcast_to, which coremltools 9 lacks.
    bounds = [numpy_helper.from_array(np.full(4, value, np.float32), name) for name, value in (("low", -1), ("high", 1))]
    nodes = [helper.make_node("Max", ["obs", "low"], ["floored"], name="floor"),
             helper.make_node("Min", ["floored", "high"], ["action"], name="ceil")]
    artifact = targets.get("coreml").prepare(context(policy(tmp_path, "clip", nodes, bounds, 17), tmp_path), "fp32")
    assert artifact.op_inventory["reduce_max"] == 1 and artifact.op_inventory["reduce_min"] == 1
    mapped = {op["onnx_node"] for op in artifact.conversion["ops"]}
    assert {"floor", "ceil"} <= mapped


@linux_only
def test_prediction_targets_skip_off_macos(tmp_path):
    artifact = targets.get("coreml").prepare(context(example("continuous_mlp"), tmp_path), "fp16")
    for name in ("coreml-cpu", "coreml-gpu", "coreml-ne", "coreml-all"):
        target = targets.get(name)
        assert target.predicts and target.unavailable_reason() == "CoreML prediction needs macOS"
        with pytest.raises(CellSkip, match="needs macOS"):
            target.open(artifact, 1)
    assert targets.get("ort-coreml").unavailable_reason() == "ORT's CoreML execution provider needs macOS"
    assert not targets.get("coreml").predicts and targets.get("coreml").unavailable_reason() is None


@linux_only
def test_prediction_process_answers_with_core_ml_own_refusal(tmp_path):
    """The pipe to coreml_predict.py works end to end; off macOS coremltools itself refuses to predict."""
    ctx = context(example("continuous_mlp"), tmp_path)
    artifact = targets.get("coreml").prepare(ctx, "fp16")
    session = coreml.CoremlSession(artifact, "CPU_AND_NE", frozenset({"ANE"}))
    try:
        assert session.backend().requested == session.backend().actual == "CPU_AND_NE"
        with pytest.raises(RuntimeError, match="only supported on macOS"):
            session.run(ctx.calibration)
    finally:
        session.close()
    assert session.helper.server.process.returncode == 0


@pytest.mark.parametrize("units, accelerators", [("CPU_ONLY", {"CPU"}), ("CPU_AND_NE", {"ANE"}), ("ALL", {"ANE", "GPU"})])
def test_compute_plan_rows_become_one_row_per_onnx_node(tmp_path, units, accelerators):
    """MLComputePlan rows (as coreml_predict.py reports them, one per MIL op) -> PlacementRows."""
    artifact = targets.get("coreml").prepare(context(example("continuous_mlp"), tmp_path), "int8")
    session = coreml.CoremlSession.__new__(coreml.CoremlSession)  # no process: the mapping alone
    session.compute_units, session.accelerators = units, frozenset(accelerators)
    session.ops = {out: op for op in artifact.conversion["ops"] for out in op["outputs"]}
    ops = artifact.conversion["ops"]
    # Put every op on the ANE except fc1's weight decompression (CPU) and one op Core ML cannot place.
    plan = [{"operator": op["mil_op"], "outputs": op["outputs"], "supported": [],
             "preferred": "CPU" if op["mil_op"].startswith("constexpr") and op["onnx_node"] == "fc1" else "ANE"}
            for op in ops]
    plan[-1]["preferred"] = None
    rows = {row.node: row for row in session.placement_rows(plan)}
    onnx_nodes = {node.name: node.op_type for node in onnx.load(example("continuous_mlp")).graph.node}
    assert set(onnx_nodes) <= set(rows) and all(rows[n].op_type == t for n, t in onnx_nodes.items())
    assert set(rows["fc1"].where.split("+")) == {"CPU", "ANE"}
    inserted = [row for node, row in rows.items() if node.endswith("(MIL)")]
    assert inserted and all(row.op_type == "cast" for row in inserted)  # the fp16 I/O casts
    if units == "CPU_ONLY":
        assert rows["fc1"].fallback and rows["fc0"].fallback  # ANE was not asked for
    else:
        assert rows["fc1"].fallback and not rows["fc0"].fallback
    last = ops[-1]
    unplaced = rows[last["onnx_node"] or f"{last['outputs'][0]} (MIL)"]
    assert "unknown" in unplaced.where.split("+")


@macos_only
@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_core_ml_cpu_matches_onnxruntime(tmp_path, name):
    ctx = context(example(name), tmp_path)
    artifact = targets.get("coreml-cpu").prepare(ctx, "fp32")
    session = targets.get("coreml-cpu").open(artifact, 1)
    expected = ort.InferenceSession(str(example(name)))
    try:
        for batch in (1, 7, 16):  # the flexible (RangeDim) batch really flexes
            feeds = {k: v[:batch] for k, v in ctx.calibration.items()}
            want = dict(zip([o.name for o in expected.get_outputs()], expected.run(None, feeds)))
            got = session.run(feeds)
            for output, value in want.items():
                assert got[output].dtype == value.dtype and got[output].shape == value.shape
                np.testing.assert_allclose(got[output], value, atol=1e-4)
        assert len(session.time(ctx.calibration, 2, 5)) == 5
        rows = session.placement()
        assert rows and not any(row.fallback for row in rows) and any(row.where == "CPU" for row in rows)
    finally:
        session.close()


@macos_only
def test_ort_coreml_ep_is_really_used():
    target = targets.get("ort-coreml")
    if target.unavailable_reason():
        pytest.skip(target.unavailable_reason())
    from targets.base import Artifact

    session = target.open(Artifact(path=example("continuous_mlp")), 1)
    assert session.backend().matches
    assert any(row.where == "CoreMLExecutionProvider" for row in session.placement())
