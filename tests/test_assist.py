"""Diagnosis (first divergent node), graph preparations and known messages, on real runtimes.

Unit tests check each rewrite against onnxruntime on the original graph and the
message table against messages the runtimes really printed; end-to-end tests run
`policy-matrix run --diagnose/--assist` as a user does and read results.json and
the report.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from assist_fixtures import fp16_overflow_mlp, jax2onnx_like, pixels_and_state_like, sb3_multi_input_like, sb3_pendulum_like, write
from web_fixtures import softsign_mlp

import targets
from matrix.inputs import examples
from matrix import messages
from matrix.assist import int8_weights, preparations
from matrix import results as schema
from matrix.assist.diagnose import expose_intermediates
from matrix.assist.preparations import Prepared
from matrix.report.report_text import md

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.tflite_env, pytest.mark.coreml_env]

RUN_FAST = ("--iters", "5", "--warmup", "1", "--n-obs", "64")


def ort_outputs(proto: onnx.ModelProto, obs: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: obs})


def observations(proto: onnx.ModelProto, batch: int = 1) -> np.ndarray:
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    shape = [batch] + [d.dim_value for d in dims[1:]]
    return (np.random.default_rng(0).normal(size=shape) * 3).astype(np.float32)


def prepared(proto: onnx.ModelProto, *steps: str) -> Prepared:
    result = Prepared(proto)
    for step in steps:
        assert result.apply(step), step
    onnx.checker.check_model(result.proto, full_check=True)
    return result


# --- rewrites: same numbers as the graph they replace --------------------------------------


def test_minmax_to_clip_fuses_the_clamp_into_one_clip_with_the_same_outputs():
    original = sb3_pendulum_like()
    result = prepared(sb3_pendulum_like(), "minmax-clip")
    ops = [node.op_type for node in result.proto.graph.node]
    assert "Min" not in ops and "Max" not in ops and ops.count("Clip") == 1
    assert "/Max" in result.steps[0] and "[-2, 2]" in result.steps[0]
    obs = observations(original, 16)
    np.testing.assert_array_equal(ort_outputs(result.proto, obs)[0], ort_outputs(original, obs)[0])


def test_simplify_folds_the_dead_shape_subgraph_at_batch_1():
    result = prepared(sb3_pendulum_like(), "simplify")
    ops = {node.op_type for node in result.proto.graph.node}
    assert not ops & {"Shape", "ConstantOfShape", "Expand"}, ops
    assert result.fixed_batch == 1
    obs = observations(sb3_pendulum_like(), 1)
    np.testing.assert_allclose(ort_outputs(result.proto, obs)[0], ort_outputs(sb3_pendulum_like(), obs)[0], rtol=1e-6)


def test_argmax_cut_returns_logits_and_the_host_argmax_gives_the_same_actions():
    original = examples.discrete_mlp()
    result = prepared(examples.discrete_mlp(), "argmax-cut")
    assert "ArgMax" not in {node.op_type for node in result.proto.graph.node}
    obs = observations(original, 32)
    arrays = {"outputs/q_values": ort_outputs(result.proto, obs)[0]}
    preparations._host_argmax(arrays, result.host_argmax)
    expected = ort_outputs(original, obs)[0]
    assert arrays["outputs/action"].dtype == expected.dtype
    np.testing.assert_array_equal(arrays["outputs/action"], expected)


def test_opset_conversion_takes_a_jax2onnx_graph_from_23_to_17_unchanged_in_numbers():
    result = prepared(jax2onnx_like(), "opset17")
    assert result.proto.opset_import[0].version == 17 and result.proto.ir_version == 8
    obs = observations(jax2onnx_like(), 8)
    np.testing.assert_allclose(ort_outputs(result.proto, obs)[0], ort_outputs(jax2onnx_like(), obs)[0], rtol=1e-6)


def _with_rank0_bias_softsign_and_allowzero() -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(0.25, np.float32), "b"),
        numpy_helper.from_array(np.array([-1, 3], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Gemm", ["obs", "w", "b"], ["h"], name="dense"),
        helper.make_node("Softsign", ["h"], ["s"], name="squash"),
        helper.make_node("Reshape", ["s", "shape"], ["action"], name="flatten", allowzero=1),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", 4])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["B", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("step, gone", [("gemm-bias-rank1", None), ("softsign", "Softsign"), ("reshape-allowzero", None)])
def test_targeted_rewrites_keep_the_numbers(step, gone):
    original = _with_rank0_bias_softsign_and_allowzero()
    result = prepared(_with_rank0_bias_softsign_and_allowzero(), step)
    assert gone is None or gone not in {node.op_type for node in result.proto.graph.node}
    assert re.search(r"dense|squash|flatten", result.steps[0])  # the node is named
    obs = observations(original, 5)
    np.testing.assert_allclose(ort_outputs(result.proto, obs)[0], ort_outputs(original, obs)[0], rtol=1e-6)


def _gemm(trans_a: int, trans_b: int, alpha: float, beta: float, bias: bool, b_computed: bool) -> onnx.ModelProto:
    """obs[B,3] -> one Gemm "dense" with these attributes -> action[B,2] (B computed by a node when `b_computed`)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    weights = rng.normal(size=(2, 3) if trans_b else (3, 2)).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(rng.normal(size=(2,)).astype(np.float32), "b")]
    nodes = [helper.make_node("Identity", ["w"], ["w_computed"], name="weights")] if b_computed else []
    a = "obs_t" if trans_a else "obs"
    if trans_a:
        nodes.append(helper.make_node("Transpose", ["obs"], ["obs_t"], name="obs_t", perm=[1, 0]))
    nodes.append(helper.make_node("Gemm", [a, "w_computed" if b_computed else "w", *(["b"] if bias else [])], ["action"],
                                  name="dense", transA=trans_a, transB=trans_b, alpha=alpha, beta=beta))
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["B", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, bias, b_computed", [
    (0, 1, 1.0, 1.0, True, False),  # torch's nn.Linear
    (1, 0, 0.5, 2.0, True, False), (0, 1, 1.0, 1.0, False, True), (0, 0, 2.0, 0.25, True, True),
])
def test_gemm_as_matmul_keeps_the_numbers_and_the_interface(trans_a, trans_b, alpha, beta, bias, b_computed):
    original = _gemm(trans_a, trans_b, alpha, beta, bias, b_computed)
    result = prepared(_gemm(trans_a, trans_b, alpha, beta, bias, b_computed), "gemm-matmul")
    assert "Gemm" not in {node.op_type for node in result.proto.graph.node}
    assert result.steps == ["Gemm -> MatMul + Add (the same product): dense"]
    assert [o.name for o in result.proto.graph.output] == ["action"]
    rows = observations(original, 5)  # [B, 3] either way: with transA the graph transposes obs itself first
    np.testing.assert_allclose(ort_outputs(result.proto, rows)[0], ort_outputs(original, rows)[0], rtol=1e-6, atol=1e-6)


def test_rewrites_that_do_not_apply_change_nothing():
    original = fp16_overflow_mlp()  # no ArgMax, Min/Max, Reshape, Softsign; rank-1 Gemm biases
    for step in preparations.REWRITES:
        result = Prepared(fp16_overflow_mlp())
        assert not result.apply(step) and result.proto == original and not result.steps
    assert preparations.candidates(original)[0][0] == "simplify"  # gemm-matmul only where a cause names it


def test_candidates_try_single_changes_before_all_of_them_together():
    names = [name for name, _ in preparations.candidates(sb3_pendulum_like())]
    assert names == ["minmax-clip", "simplify", "simplify + minmax-clip"]


# --- intermediates -------------------------------------------------------------------------


def test_exposed_intermediates_are_typed_outputs_ort_accepts():
    original = fp16_overflow_mlp()
    names = [out for node in original.graph.node for out in node.output]
    exposed = expose_intermediates(original, names)
    assert [o.name for o in exposed.graph.output] == ["action", "h0", "r0", "big", "small"]
    values = ort_outputs(exposed, observations(original, 3))
    assert all(v.shape[0] == 3 for v in values)


# --- known messages ------------------------------------------------------------------------

# Words printed by the real runtimes / converters (onnxruntime-web 1.30, onnx2torch 1.5.15).
SEEN = [
    ("ort-web-webgl", "RuntimeError: cannot resolve operator 'ArgMax' with opsets: ai.onnx v17", examples.discrete_mlp,
     "no ArgMax kernel", ["greedy"]),
    ("ort-web-webgl", "RuntimeError: cannot resolve operator 'ConstantOfShape' with opsets: ai.onnx v17", sb3_pendulum_like,
     "no ConstantOfShape kernel", ["/ConstantOfShape"]),
    ("coreml", "RuntimeError: NotImplementedError: onnx2torch has no Cast converter for schema version 23, only for 9, 13 "
     "(Converter is not implemented (OperationDescription(domain='', operation_type='Cast', version=23)))", jax2onnx_like,
     "converts Cast only at schema versions 9, 13, not 23", ["convert_element_type"]),
    ("ort-web-webgl", "Error: Invalid input shape of C", _with_rank0_bias_softsign_and_allowzero, "rank-0 bias", ["dense"]),
    ("ort-web-webgl", "Error: Uniform beta not found.", lambda: single_gemm(None), "without input C", ["dense"]),
    ("tflite", "RuntimeError: Select TensorFlow op(s), included in the given model, is(are) not supported by this "
     "interpreter. Make sure you apply/link the Flex delegate before inference. Node number 2 (FlexSoftsign) failed to "
     "prepare.", softsign_mlp, "lowered Softsign to a TensorFlow (Flex) op", ["soft0"]),
    ("ort-cpu", "Fail: [ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. "
     "Name:'flatten' Status Message: The input tensor cannot be reshaped", _with_rank0_bias_softsign_and_allowzero,
     "inside a Reshape node", ["flatten"]),
    ("coreml", 'NotImplementedError: "allowzero=1" is not implemented', _with_rank0_bias_softsign_and_allowzero,
     "allowzero=1", ["flatten"]),
    ("tract", 'RuntimeError: Translating node #4 "fc0" Gemm ToTypedTranslator Caused by: Output mismatch after rewiring '
     "expansion for output #0: expected batch,64,F16 got batch,64,F32", examples.discrete_mlp,
     "tract expands an fp16 Gemm", ["fc0"]),
]


@pytest.mark.parametrize("target, message, build, cause, nodes", SEEN)
def test_known_messages_name_their_cause_and_nodes(target, message, build, cause, nodes):
    line = messages.explain(target, message, build())
    assert line is not None and cause in line
    assert line.endswith(", ".join(nodes))


def test_an_unknown_message_or_another_target_gets_no_invented_cause():
    assert messages.explain("ort-web-webgl", "something else entirely", sb3_pendulum_like()) is None
    assert messages.explain("tract", "cannot resolve operator 'ArgMax'", examples.discrete_mlp()) is None


# --- end to end ------------------------------------------------------------------------------


def test_fp16_overflow_names_the_scale_up_node_not_its_neighbours(tmp_path, policy_matrix):
    model = write(fp16_overflow_mlp(), tmp_path, "overflow")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-cpu", "--precisions", "fp32,fp16", "--diagnose",
                          "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr  # the fp16 cell FAILs on drift
    cells = {c.variant: c for c in schema.load(out / "results.json").cells}
    assert cells["fp32"].verdict == "PASS" and cells["fp32"].diagnosis is None  # only drifting cells are diagnosed
    diagnosis = cells["fp16"].diagnosis
    first = diagnosis.first
    assert (first.node, first.op_type, first.output) == ("scale_up", "Mul", "big")
    assert first.drift > first.threshold
    assert first.input_drifts["r0"] < first.threshold  # its input did not diverge: the node itself did
    drifts = {n.node: n for n in diagnosis.nodes}
    assert drifts["clip0"].drift < drifts["clip0"].threshold  # the neighbour before is clean
    assert "up truncated by the fp16 converter: 100000 became 65504" in first.cause  # beyond float16: clamped
    assert any(r.startswith("first divergent node: scale_up (Mul)") for r in cells["fp16"].reasons)
    html = (out / "index.html").read_text()
    section = html[html.index('<section id="diagnosis">'):]
    section = section[: section.index("</section>")]
    assert "<b>scale_up</b>" in section and "<svg" in section


def test_a_fixed_fp16_cell_ships_the_fp16_file_it_ran_and_its_size_meets_a_budget(tmp_path, policy_matrix):
    """An fp16 cell that PASSes after a rewrite ships the fp16 file the runtime ran (not the fp32 prepared graph the
    fp16 file was made from), and a size budget reads that file's size instead of calling it 'not measured'. The
    report folder is given relative, as users type it: `--out report` made every attempt 'could not be tried:
    ValueError: ... is not in the subpath of 'report''."""
    model = write(fp16_overflow_mlp(), tmp_path, "overflow")
    out = tmp_path / "report"  # policy_matrix runs in tmp_path
    done = policy_matrix(["run", model, "--targets", "ort-cpu", "--precisions", "fp16", "--assist",
                          "--budget", "ort-cpu=size:50kB", "--out", "report", *RUN_FAST])
    cell = schema.load(out / "results.json").cells[0]
    fixed = next(fix for fix in cell.fixes if fix.verdict == "PASS")
    chosen = schema.load(out / "results.json").decision[0].chosen
    assert chosen is not None and chosen.fix == fixed.preparation, done.stderr
    shipped = out / chosen.prepared_onnx
    assert chosen.prepared_onnx == fixed.prepared_onnx and chosen.size_bytes == shipped.stat().st_size
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in onnx.load(str(shipped)).graph.initializer)


def test_tract_fp16_of_a_gemm_mlp_is_explained_and_runs_as_matmul_add(tmp_path, policy_matrix):
    """tract 0.23 cannot open the fp16 variant of torch's nn.Linear export (Gemm with a bias): 'Output mismatch after
    rewiring expansion ... expected F16 got F32'. The cell says why, and --assist's gemm-matmul makes it run."""
    done = policy_matrix(["run", examples.path("discrete_mlp"), "--targets", "tract", "--precisions", "fp16", "--assist",
                          "--out", tmp_path / "report", *RUN_FAST])
    [cell] = schema.load(tmp_path / "report" / "results.json").cells
    assert cell.verdict == "FAIL" and any(r.startswith("cause: tract expands an fp16 Gemm") for r in cell.reasons), done.stderr
    fixed = next(fix for fix in cell.fixes if fix.preparation == "gemm-matmul")
    assert fixed.verdict == "PASS", fixed.reasons
    shipped = onnx.load(str(tmp_path / "report" / fixed.prepared_onnx))
    assert "Gemm" not in {node.op_type for node in shipped.graph.node}
    assert [(v.name, v.type.tensor_type.elem_type) for v in shipped.graph.output] == [("action", onnx.TensorProto.INT64)]


def test_a_fix_closest_to_the_budgets_is_named_with_its_fix_and_its_p99_measured(tmp_path, policy_matrix):
    """Nothing fits 1 B: the closest is the fixed fp16 cell, said with its preparation (the as-exported file FAILs),
    and its only miss is the size: its p99 was measured with the fix, so a p99 budget reads it."""
    model = write(fp16_overflow_mlp(), tmp_path, "overflow")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-cpu", "--precisions", "fp16", "--assist",
                          "--budget", "ort-cpu=p99:1s", "--budget", "ort-cpu=size:1B", "--out", out, *RUN_FAST])
    closest = schema.load(out / "results.json").decision[0].closest
    assert closest is not None and closest.fix and closest.p99_us is not None, done.stderr
    assert [miss.split(":")[0] for miss in closest.misses] == ["size ≤ 1 B"], closest.misses
    assert f"closest: overflow.onnx fp16 after {closest.fix} -> {closest.prepared_onnx} (" in done.stderr, done.stderr


def test_assist_tries_fixes_on_every_settings_value_each_under_its_own_settings(tmp_path, policy_matrix):
    """With --settings every cell names its settings (threads=1 included): --assist tried none of them and the
    decision still said 'try --assist'. Each runs its fixes with its own settings, in a folder of its own."""
    model = write(fp16_overflow_mlp(), tmp_path, "overflow")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-cpu", "--precisions", "fp16", "--assist",
                          "--settings", "ort-cpu:threads=1,2", "--out", out, *RUN_FAST])
    results = schema.load(out / "results.json")
    fixed = {cell.configuration.settings_label: next(f for f in cell.fixes if f.verdict == "PASS") for cell in results.cells}
    assert sorted(fixed) == ["threads=1", "threads=2"], done.stderr
    assert fixed["threads=1"].prepared_onnx != fixed["threads=2"].prepared_onnx
    two = next(c for c in results.cells if c.configuration.settings_label == "threads=2")
    spec = (out / Path(fixed["threads=2"].prepared_onnx).parts[0] / Path(fixed["threads=2"].prepared_onnx).parts[1])
    assert any('"threads": "2"' in p.read_text() for p in spec.rglob("spec.json")), two.fixes
    assert results.decision[0].chosen is not None and results.decision[0].chosen.fix, done.stderr


def test_diagnose_follows_every_settings_value_each_under_its_own_settings(tmp_path, policy_matrix):
    """With --settings no cell has the target's defaults, and --diagnose silently diagnosed none of them. Each is
    diagnosed under its own settings, in a folder of its own."""
    model = write(fp16_overflow_mlp(), tmp_path, "overflow")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-cpu", "--precisions", "fp16", "--diagnose",
                          "--settings", "ort-cpu:threads=1,2", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cells = {cell.configuration.settings_label: cell for cell in schema.load(out / "results.json").cells}
    assert sorted(cells) == ["threads=1", "threads=2"], done.stderr
    for label, cell in cells.items():
        assert cell.diagnosis and cell.diagnosis.first, (label, cell.reasons)
        assert any(r.startswith("first divergent node:") for r in cell.reasons), cell.reasons
    specs = [p.read_text() for p in (out / "diagnosis").rglob("spec.json")]
    assert len(specs) == 2 and any('"threads": "2"' in spec for spec in specs), specs


def test_with_a_candidate_the_first_model_is_diagnosed_and_fixed_and_the_candidate_says_it_is_not(tmp_path, policy_matrix):
    """With --candidate, --assist tried nothing at all (its filter read the last cell, a candidate's, for every cell),
    and a candidate's cells, never diagnosed or prepared, said nothing about it. The first model's cells are
    diagnosed and fixed; a candidate's cells say that they were not, and how to have them."""
    model = write(fp16_overflow_mlp(), tmp_path, "overflow")
    student = tmp_path / "student.onnx"
    student.write_bytes(model.read_bytes())
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--candidate", student, "--targets", "ort-cpu", "--precisions", "fp16",
                          "--diagnose", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr  # both fp16 cells FAIL on drift as exported
    first, candidate = sorted(schema.load(out / "results.json").cells, key=lambda c: c.candidate)
    assert first.diagnosis and any(f.verdict == "PASS" for f in first.fixes), done.stderr
    assert candidate.candidate == "student.onnx" and candidate.diagnosis is None and candidate.fixes == []
    rerun = "run it with student.onnx as the model"
    assert f"diagnosis: not made for a candidate (--diagnose follows the first model's graph through its float64 " \
           f"intermediates); {rerun}" in candidate.reasons
    assert f"fix: none tried on a candidate (--assist prepares the first model's graph); {rerun}" in candidate.reasons


def test_assist_that_finds_no_fix_says_what_it_tried_where_it_said_try_assist(tmp_path, policy_matrix):
    """No preparation changes an fp16 cell's rounding: --assist ran and found nothing, yet the decision still said
    '(try --assist)'. It now names what it tried, on the console, in summary.md (ship table and the cell's Why) and
    the report."""
    out = tmp_path / "report"
    done = policy_matrix(["run", examples.path("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp16",
                          "--tolerance", "ort-cpu:fp16=1e-12,rtol=0", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    tried = ", ".join(fix.preparation for fix in schema.load(out / "results.json").cells[0].fixes)
    said = f"(--assist found no fix: tried on fp16: {tried})"
    summary = (out / "summary.md").read_text()
    assert tried and "try --assist" not in done.stderr + summary, done.stderr
    assert done.stderr.count(said) == 1 and f"fix: none found by --assist (tried: {tried})" in summary
    assert said in (out / "index.html").read_text()


def test_diagnosis_follows_tensors_the_fp16_converter_renamed(tmp_path, policy_matrix):
    """onnxconverter-common wraps the Min/Max clip in Casts and renames its outputs, leaving stale
    value_info behind: the diagnosis must still run and compare those nodes under their original names."""
    model = write(sb3_pendulum_like(), tmp_path, "pendulum")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-cpu", "--precisions", "fp16", "--tolerance", "ort-cpu:fp16=1e-6",
                          "--diagnose", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr  # fp16 rounding is far above 1e-6: the cell FAILs and is diagnosed
    diagnosis = schema.load(out / "results.json").cells[0].diagnosis
    assert not diagnosis.note, diagnosis.note
    assert diagnosis.first is not None and diagnosis.first.op_type == "Gemm"
    compared = {n.node: n.output for n in diagnosis.nodes}
    assert compared["/Max"] == "above_low" and compared["/Min"] == "action"  # renamed in the variant, still compared


def test_webgpu_fp16_without_shader_f16_diverges_at_its_first_gemm(tmp_path, policy_matrix):
    if targets.get("ort-web-webgpu").unavailable_reason():
        pytest.skip(targets.get("ort-web-webgpu").unavailable_reason())
    out = tmp_path / "report"
    done = policy_matrix(["run", examples.path("continuous_mlp"), "--targets", "ort-web-webgpu", "--precisions", "fp16",
                          "--diagnose", "--out", out, *RUN_FAST])
    cell = schema.load(out / "results.json").cells[0]
    if "no shader-f16" not in cell.backend.detail:
        pytest.skip(f"this adapter runs fp16 natively ({cell.backend.detail}): nothing to diagnose")
    assert done.returncode == 1 and cell.verdict == "FAIL", cell.reasons
    first = cell.diagnosis.first
    assert (first.node, first.op_type) == ("fc0", "Gemm") and first.drift > first.threshold
    assert max(first.input_drifts.values()) < first.threshold and "shader-f16" in first.cause


def _web_ready():
    return targets.get("ort-web-webgl").unavailable_reason()


def _fixes_section(out) -> str:
    html = (out / "index.html").read_text()
    section = html[html.index('<section id="fixes">'):]
    return section[: section.index("</section>")]


@pytest.mark.skipif(_web_ready() is not None, reason=str(_web_ready()))
def test_webgl_sb3_pattern_fails_as_exported_and_passes_simplified_with_clip(tmp_path, policy_matrix):
    model = write(sb3_pendulum_like(), tmp_path, "pendulum")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-web-webgl", "--precisions", "fp32", "--assist",
                          "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr  # the cell as exported still FAILs: a fix does not change its verdict
    cell = schema.load(out / "results.json").cells[0]
    assert "ConstantOfShape" in cell.error.message
    assert any(r.startswith("cause:") and "/ConstantOfShape" in r for r in cell.reasons)
    fixes = {f.preparation: f for f in cell.fixes}
    assert fixes["simplify"].verdict == "FAIL" and "'Max'" in fixes["simplify"].reasons[0]  # measured: Min/Max remain
    fixed = fixes["simplify + minmax-clip"]
    assert fixed.verdict == "PASS" and fixed.drift < 1e-5 and fixed.p50_us > 0 and fixed.batch == 1
    prepared_model = onnx.load(str(out / fixed.prepared_onnx))
    assert {n.op_type for n in prepared_model.graph.node} == {"Gemm", "Tanh", "Clip"}
    section = _fixes_section(out)
    assert "simplify + minmax-clip" in section and fixed.prepared_onnx in section
    (decision,) = schema.load(out / "results.json").decision  # the fix counts: it is what ships on WebGL
    assert decision.chosen.fix == "simplify + minmax-clip" and decision.chosen.prepared_onnx == fixed.prepared_onnx
    assert f"decision ort-web-webgl: ship pendulum.onnx fp32 after simplify + minmax-clip -> {fixed.prepared_onnx}" in done.stderr
    assert "budget" not in next(line for line in done.stderr.splitlines() if line.startswith("decision "))


@pytest.mark.skipif(_web_ready() is not None, reason=str(_web_ready()))
def test_webgl_discrete_policy_runs_after_the_argmax_head_cut(tmp_path, policy_matrix):
    out = tmp_path / "report"
    done = policy_matrix(["run", examples.path("discrete_mlp"), "--targets", "ort-web-webgl", "--precisions", "fp32", "--assist",
                          "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cell = schema.load(out / "results.json").cells[0]
    assert "ArgMax" in cell.error.message
    fix = cell.fixes[0]
    assert (fix.preparation, fix.verdict) == ("argmax-cut", "PASS")
    assert fix.host_step == "action = argmax(q_values, axis=1) as int64, on the host"
    assert "argmax(q_values" in _fixes_section(out)


def single_gemm(bias: np.ndarray | None) -> onnx.ModelProto:
    """obs[B,3] -> one Gemm named "dense" -> action[B,2]: with a rank-0 bias (jax2onnx) or none."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.random.default_rng(2).normal(size=(3, 2)).astype(np.float32), "w")]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
    node = helper.make_node("Gemm", ["obs", "w"] + (["b"] if bias is not None else []), ["action"], name="dense")
    graph = helper.make_graph([node], "single_gemm", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["B", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.skipif(_web_ready() is not None, reason=str(_web_ready()))
@pytest.mark.parametrize("bias, message, fix", [
    (np.array(0.5, np.float32), "Invalid input shape of C", "gemm-bias-rank1"),
    (None, "Uniform beta not found", "gemm-zero-bias"),
])
def test_webgl_gemm_bias_failures_are_explained_and_fixed(tmp_path, bias, message, fix, policy_matrix):
    model = write(single_gemm(bias), tmp_path, "gemm")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-web-webgl", "--precisions", "fp32", "--assist",
                          "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cell = schema.load(out / "results.json").cells[0]
    assert message in cell.error.message
    assert any(r.startswith("cause:") and fix in r and r.endswith("node: dense") for r in cell.reasons)
    passing = [f.preparation for f in cell.fixes if f.verdict == "PASS"]
    assert passing == [fix]


@pytest.mark.skipif(targets.get("tflite").unavailable_reason() is not None, reason=str(targets.get("tflite").unavailable_reason()))
def test_tflite_flex_softsign_runs_in_litert_after_the_softsign_rewrite(tmp_path, policy_matrix):
    model = write(softsign_mlp(), tmp_path, "softsign")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "tflite", "--precisions", "fp32", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cell = schema.load(out / "results.json").cells[0]
    assert "FlexSoftsign" in cell.error.message
    assert any(r.startswith("cause:") and r.endswith("node: soft0") for r in cell.reasons)
    assert [(f.preparation, f.verdict) for f in cell.fixes] == [("softsign", "PASS")]
    assert cell.fixes[0].drift < 1e-5


@pytest.mark.skipif(targets.get("coreml").unavailable_reason() is not None, reason=str(targets.get("coreml").unavailable_reason()))
def test_coreml_conversion_of_an_opset23_export_works_after_conversion_to_17(tmp_path, policy_matrix):
    model = write(jax2onnx_like(), tmp_path, "jax_policy")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "coreml", "--precisions", "fp32", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cell = schema.load(out / "results.json").cells[0]
    assert "operation_type='Cast', version=23" in cell.error.message
    assert cell.fixes[0].preparation == "opset17" and cell.fixes[0].verdict == "CONVERTED"  # `coreml` converts, never predicts
    assert "opset 23 -&gt; 17" in _fixes_section(out)  # the step, escaped like every string in the report


def test_a_model_saved_at_an_ir_version_the_runtime_predates_names_both_versions_and_assist_lowers_it(tmp_path, policy_matrix):
    """onnx 1.23 saves IR 14 whatever the opset, and onnxruntime-node/-web 1.30 read IR 13 at most: the cell said
    only "Unsupported model IR version: 14, max supported IR version: 13". Its cause names both versions and the IR
    the model's opsets need, and --assist's opset17 (opset 17's IR 8) makes it PASS."""
    proto = examples.continuous_mlp()
    proto.ir_version = 14
    model = write(proto, tmp_path, "ir14")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-node", "--precisions", "fp32", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cell = schema.load(out / "results.json").cells[0]
    assert "Unsupported model IR version: 14, max supported IR version: 13" in cell.error.message
    assert ("cause: this onnxruntime reads ONNX files up to IR version 13 and the model is saved at IR 14, while its "
            "opsets (ai.onnx 17) need only IR 8: set the model's ir_version to 8 before saving") in cell.reasons
    assert [(f.preparation, f.verdict) for f in cell.fixes] == [("opset17", "PASS")], cell.reasons


def test_a_candidates_known_message_is_explained_from_the_candidates_own_graph(tmp_path, policy_matrix):
    """A candidate at opset 21 saved at IR 14 was told its opsets were the first model's ("ai.onnx 17 need only
    IR 8"): the cause read the first model's graph. Its cause reads its own: opset 21 needs IR 10. The job
    summary's Why said the runtime's message alone: the cause is there too."""
    from onnx import version_converter

    proto = version_converter.convert_version(examples.continuous_mlp(), 21)
    proto.ir_version = 14
    candidate = write(proto, tmp_path, "ir14")
    out = tmp_path / "report"
    done = policy_matrix(["run", examples.path("continuous_mlp"), "--candidate", candidate, "--targets", "ort-node",
                          "--precisions", "fp32", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    cell = next(c for c in schema.load(out / "results.json").cells if c.candidate)
    assert ("cause: this onnxruntime reads ONNX files up to IR version 13 and the model is saved at IR 14, while its "
            "opsets (ai.onnx 21) need only IR 10: set the model's ir_version to 10 before saving") in cell.reasons, cell.reasons
    assert md("cause: this onnxruntime reads ONNX files up to IR version 13") in (out / "summary.md").read_text()


def _quantized_mlp(tmp_path: Path, how: str) -> Path:
    """The bundled MLP quantized by onnxruntime.quantization as a user does: dynamic with signed weights (QInt8),
    or static QDQ at its defaults (S8S8)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    source, out = examples.path("continuous_mlp"), tmp_path / f"{how}.onnx"
    if how == "dynamic":
        quantize_dynamic(source, out, weight_type=QuantType.QInt8)
        return out
    name, width = examples.continuous_mlp().graph.input[0].name, observations(examples.continuous_mlp()).shape[1]

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.rows = iter({name: np.random.default_rng(i).normal(size=(1, width)).astype(np.float32)} for i in range(16))

        def get_next(self):
            return next(self.rows, None)

    quantize_static(source, out, Calibration(), quant_format=QuantFormat.QDQ)
    return out


@pytest.mark.parametrize("how", ["dynamic", "qdq"])
def test_unsigned_weights_compute_what_the_signed_ones_did(how, tmp_path):
    """u8-weights stores each signed weight as uint8 + 128 and its zero point + 128: the reference evaluator (which
    computes the integer ops exactly) gives the same outputs for both graphs."""
    from matrix.reference import reference

    original = onnx.load(_quantized_mlp(tmp_path, how))
    result = prepared(onnx.load(_quantized_mlp(tmp_path, how)), "u8-weights")
    assert not int8_weights.signed_weights(result.proto) and len(int8_weights.signed_weights(original)) == 3
    obs = {original.graph.input[0].name: observations(original, 32)}
    same = [reference.evaluator_for(proto).run(None, obs)[0] for proto in (original, result.proto)]
    np.testing.assert_array_equal(*same)


@pytest.mark.skipif(not int8_weights.saturating_cpu(), reason="this CPU has VNNI (or is not x86-64): onnxruntime's u8s8 kernels do not saturate here")
@pytest.mark.parametrize("how", ["dynamic", "qdq"])
def test_signed_int8_weights_on_an_x86_cpu_without_vnni_name_the_saturation_and_unsigned_weights_pass(how, tmp_path, policy_matrix):
    """A user's int8 MLP (onnxruntime.quantization, signed weights) FAILed on ort-cpu by ~0.3 while tract agreed with
    the reference: onnxruntime's u8s8 kernels (VPMADDUBSW) saturate on x86-64 without VNNI. The cell names that cause
    and the fix onnxruntime's quantization guide gives, and --assist's u8-weights (the same weights as uint8, zero
    points + 128: the same numbers) makes it PASS. --diagnose found "no single node" for the QDQ model, as if
    nothing drifted: exposing its tensors stopped the fusion that drifts, which the note now says."""
    model = _quantized_mlp(tmp_path, how)
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "ort-cpu,tract", "--precisions", "fp32", "--diagnose", "--assist", "--out", out,
                          "--iters", "5", "--warmup", "1"])  # the default 128 rows: 64 saturate less (0.24, a WARN)
    assert done.returncode == 1, done.stderr
    cell, tract = sorted(schema.load(out / "results.json").cells, key=lambda c: c.target)
    assert tract.verdict == "PASS" and not any(r.startswith("cause:") for r in tract.reasons), tract.reasons
    cause = next((r for r in cell.reasons if r.startswith("cause: onnxruntime's x86-64 kernels")), None)
    assert cause is not None and "without VNNI" in cause and "weight_type=QuantType.QUInt8" in cause, cell.reasons
    assert [(f.preparation, f.verdict) for f in cell.fixes if f.verdict == "PASS"][:1] == [("u8-weights", "PASS")], cell.reasons
    if how == "qdq":  # onnxruntime fuses QDQ pairs only where their tensors are not outputs: exposed, nothing drifts
        assert "stops the runtime fusing the nodes around it" in cell.diagnosis.note, cell.diagnosis
    else:  # the saturated MatMulInteger's int32 output is cast to float: that Cast is the first float tensor off
        assert cell.diagnosis.first.op_type == "Cast", cell.diagnosis


@pytest.mark.skipif(not int8_weights.saturating_cpu(), reason="this CPU has VNNI (or is not x86-64): onnxruntime's u8s8 kernels do not saturate here")
def test_a_user_int8_candidate_drifting_on_ort_cpu_names_the_saturation_too(tmp_path, policy_matrix):
    """The same int8 model as a --candidate beside its fp32 original (how a user weighs shipping it) FAILed on
    ort-cpu by ~0.3 with no cause: only the first model's cells were read for it. --assist prepares the first
    model only, so the cause says how to reach u8-weights for this one."""
    candidate = _quantized_mlp(tmp_path, "dynamic")
    out = tmp_path / "report"
    done = policy_matrix(["run", examples.path("continuous_mlp"), "--candidate", candidate, "--targets", "ort-cpu",
                          "--precisions", "fp32", "--diagnose", "--out", out, "--iters", "5", "--warmup", "1"])
    assert done.returncode == 1, done.stderr
    first, cell = sorted(schema.load(out / "results.json").cells, key=lambda c: c.candidate)
    cause = next((r for r in cell.reasons if r.startswith("cause: onnxruntime's x86-64 kernels")), "")
    assert cell.verdict == "FAIL" and cause.endswith("(--assist's u8-weights stores the same weights unsigned, "
                                                     "with dynamic.onnx as the model)"), cell.reasons  # it prepares the first model
    assert not any(r.startswith("cause:") for r in first.reasons), first.reasons


@pytest.mark.skipif(targets.get("tflite").unavailable_reason() is not None, reason=str(targets.get("tflite").unavailable_reason()))
def test_drift_that_only_batches_above_1_have_is_said_with_the_batch_it_appears_at(tmp_path, policy_matrix):
    """onnx2tf converts SB3's two-input Flatten+Concat exact at batch 1 and wrong above it: the cell said only its
    drift. Its reasons now say that one observation is right alone and wrong in a batch (the worker runs batches
    1, 2 and 7 besides the parity batch), and --assist's simplify (a fixed batch 1) makes it PASS; ort-cpu, right
    at every batch, says nothing of the kind."""
    model = write(sb3_multi_input_like(), tmp_path, "multi_input")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "tflite,ort-cpu", "--precisions", "fp32", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    tflite, ort_cpu = sorted(schema.load(out / "results.json").cells, key=lambda c: c.target, reverse=True)
    said = next((r for r in tflite.reasons if r.startswith("batch handling: action: observation 0 drifts")), "")
    assert re.search(r"drifts [\d.e+-]+ alone \(batch 1\) and [\d.e+-]+ in the batch of 64 \(batch 2: [\d.e+-]+, batch 7: ", said), tflite.reasons
    assert ("--assist's simplify makes one" in said) and ("simplify", "PASS") in [(f.preparation, f.verdict) for f in tflite.fixes]
    assert ort_cpu.verdict == "PASS" and not any(r.startswith("batch handling") for r in ort_cpu.reasons)


@pytest.mark.skipif(targets.get("tflite").unavailable_reason() is not None, reason=str(targets.get("tflite").unavailable_reason()))
def test_a_discrete_action_that_flips_only_in_a_batch_says_so(tmp_path, policy_matrix):
    """The same conversion with a DQN head (Q-values, ArgMax): observation 0's action agrees alone and flips in the
    batch (46 of 64 rows flip). The batch evidence read float outputs only, so the cell said its flips and not why."""
    model = write(sb3_multi_input_like(discrete_actions=4), tmp_path, "multi_input_dqn")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "tflite", "--precisions", "fp32", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    (tflite,) = schema.load(out / "results.json").cells
    said = next((r for r in tflite.reasons if r.startswith("batch handling: action: ")), "")
    assert re.match(r"batch handling: action: observation 0 agrees alone \(batch 1\) and flips in the batch of 64 \(flips "
                    r"above the tie margin: batch 2: \d+ flips?, batch 7: [1-7] flips?\)", said), tflite.reasons
    assert tflite.verdict == "FAIL" and tflite.parity[0].kind == "discrete" and tflite.parity[0].flips


@pytest.mark.skipif(targets.get("tflite").unavailable_reason() is not None, reason=str(targets.get("tflite").unavailable_reason()))
def test_a_fix_that_makes_a_cell_warn_is_said_as_the_fix_the_decision_ships(tmp_path, policy_matrix):
    """A Dict policy's image + state on tflite FAILs in XNNPack's reshape; simplify's fixed batch 1 runs it, a WARN
    (its Cast on builtin kernels). The cell said 'fix: none found by --assist (tried: simplify)' while the decision
    shipped it 'after simplify': the cell says the fix and its WARN."""
    model = write(pixels_and_state_like(), tmp_path, "pixels_and_state")
    out = tmp_path / "report"
    done = policy_matrix(["run", model, "--targets", "tflite", "--precisions", "fp32", "--assist", "--out", out, *RUN_FAST])
    assert done.returncode == 1, done.stderr
    results = schema.load(out / "results.json")
    cell = results.cells[0]
    assert cell.verdict == "FAIL" and [(f.preparation, f.verdict) for f in cell.fixes] == [("simplify", "WARN")], cell.reasons
    assert results.decision[0].chosen.fix == "simplify", results.decision
    said = next((r for r in cell.reasons if r.startswith("fix: ")), "")
    assert said.startswith("fix: simplify makes it WARN (") and cell.fixes[0].reasons[0] in said, cell.reasons


@pytest.mark.skipif(targets.get("tflite").unavailable_reason() is not None, reason=str(targets.get("tflite").unavailable_reason()))
def test_under_env_drift_at_batch_sizes_the_loop_never_runs_warns_naming_them(tmp_path, policy_matrix):
    """The episodes run at batch 1, where onnx2tf's conversion of the two-input Flatten+Concat is exact, so the
    return decided and the cell PASSed with drift 0.5 on the visited states, measured in a batch: a user who
    steps several environments in one call ships those actions. The cell WARNs with the batch sizes, the summary
    says why; ort-cpu, right at every batch, PASSes."""
    model = write(sb3_multi_input_like(), tmp_path, "multi_input")
    (tmp_path / "pos_vel_env.py").write_text(Path(__file__).with_name("pos_vel_env.py").read_text())
    out = tmp_path / "report"
    done = policy_matrix([model, "--targets", "tflite,ort-cpu", "--precisions", "fp32", "--env", "pos_vel_env:PosVel",
                          "--episodes", "4", "--out", out, *RUN_FAST])
    assert done.returncode == 0, done.stderr
    tflite, ort_cpu = sorted(schema.load(out / "results.json").cells, key=lambda c: c.target, reverse=True)
    assert tflite.verdict == "WARN", tflite.reasons
    number = r"[\d.e+-]+"
    assert re.fullmatch(rf"batch sizes: action: beyond tolerance atol 0.0001 \+ rtol 1e-05·\|ref\| at batch 2, 7 and 64 "
                        rf"\(observation 0 drifts {number} alone, {number} in the batch of 64; the rows of batch 2: {number}, "
                        rf"of 7: {number}\), within it at batch 1, where the episodes ran and the return decided: .*",
                        tflite.reasons[0]), tflite.reasons
    assert f"- **WARN** {md(tflite.host)} tflite fp32: {md(tflite.reasons[0])}" in (out / "summary.md").read_text()
    assert ort_cpu.verdict == "PASS", ort_cpu.reasons
