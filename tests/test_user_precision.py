"""A policy its user already made fp16 or int8 before handing it over.

The float64 reference evaluates the graph's own arithmetic on its own weights; a runtime running an fp16 graph
rounds every activation to fp16, and one running a quantized graph quantizes activations with a float32 scale
whose rounding moves a value by a quantization step. Those are the model's precision, not the runtime's doing:
its as-given ("fp32") cell is judged at the tolerance of the precision it computes in, and the lint says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import variant_policies

from matrix.inputs import graph_facts, model
from matrix.inputs.examples import path as example
from matrix.inputs.lint import lint
from matrix.judge.judge import Judge
from matrix.judge.rules import DEFAULT_TOLERANCE

FAST = ("--n-obs", "16", "--iters", "5", "--warmup", "1", "--variants", "fp32")


def user_fp16(folder: Path) -> Path:
    """What onnxconverter-common's documented call makes of the bundled MLP: float16 weights, float32 I/O."""
    from onnxconverter_common import float16

    path = folder / "user_fp16.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(example("continuous_mlp")), keep_io_types=True), path)
    return path


def user_dynamic_int8(folder: Path) -> Path:
    """ONNX Runtime's dynamic quantization of the bundled MLP, as its docs show it (uint8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = folder / "user_int8.onnx"
    quantize_dynamic(example("continuous_mlp"), path, weight_type=QuantType.QUInt8)
    return path


def test_the_precision_a_model_computes_in_is_read_from_its_graph(tmp_path):
    assert graph_facts.computes_in(model.load(example("continuous_mlp")).proto) == ("fp32", "")
    assert graph_facts.computes_in(model.load(user_fp16(tmp_path)).proto)[0] == "fp16"
    precision, why = graph_facts.computes_in(model.load(user_dynamic_int8(tmp_path)).proto)
    assert (precision, why) == ("int8", "6 quantization ops (DynamicQuantizeLinear, MatMulInteger)")


def test_a_graph_fed_in_float16_computes_in_float16_without_a_weight():
    """ONNX's test_attention_4d_fp16: float16 inputs, no weights; judged at float32's tolerance, ORT's float16
    arithmetic (drift 3.4e-4) FAILed: the model's precision, not the runtime's doing."""
    graph = onnx.helper.make_graph([onnx.helper.make_node("Softmax", ["obs"], ["action"])], "half",
                                   [onnx.helper.make_tensor_value_info("obs", onnx.TensorProto.FLOAT16, ["batch", 4])],
                                   [onnx.helper.make_tensor_value_info("action", onnx.TensorProto.FLOAT16, ["batch", 4])])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    assert graph_facts.computes_in(proto) == ("fp16", "1 float16 input")


def test_an_as_given_cell_is_judged_at_the_tolerance_of_what_the_model_computes_in(tmp_path):
    info = model.load(user_fp16(tmp_path))
    judge = Judge(model_precisions={"": graph_facts.computes_in(info.proto)[0]})
    assert judge.context("ort-cpu", "fp32").tolerance.atol == DEFAULT_TOLERANCE["fp16"]
    assert judge.context("ort-cpu", "int8").tolerance.atol == DEFAULT_TOLERANCE["int8"]  # never tighter than its own
    found = {item.id: (item.level, item.message) for item in lint(info)}
    assert found["precision"][0] == "warn" and "computes in fp16" in found["precision"][1]
    assert {item.id: item.level for item in lint(model.load(example("continuous_mlp")))}["precision"] == "ok"


def test_each_model_of_a_run_is_judged_at_the_precision_it_computes_in(tmp_path):
    """One Judge per run, the precision a fact per model it reads by the cell's candidate: a user's fp16 candidate
    was judged at the first model's fp32 tolerance."""
    from matrix.run.orchestrate import RunConfig

    first, candidate = model.load(example("continuous_mlp")), model.load(user_fp16(tmp_path))
    judge = RunConfig(first, ["ort-cpu"], ["fp32"], tmp_path, candidates=[candidate]).judge()
    assert judge.context("ort-cpu", "fp32").tolerance.atol == DEFAULT_TOLERANCE["fp32"]
    assert judge.context("ort-cpu", "fp32", candidate="user_fp16.onnx").tolerance.atol == DEFAULT_TOLERANCE["fp16"]
    alone = RunConfig(candidate, ["ort-cpu"], ["fp32"], tmp_path, candidates=[first]).judge()
    assert alone.context("ort-cpu", "fp32").tolerance.atol == DEFAULT_TOLERANCE["fp16"]
    assert alone.context("ort-cpu", "fp32", candidate="continuous_mlp.onnx").tolerance.atol == DEFAULT_TOLERANCE["fp32"]


@pytest.mark.slow
def test_a_users_fp16_candidate_passes_where_its_runtime_runs_it_right(tmp_path, policy_matrix):
    """Before: its as-given cell FAILed on ort-cpu at the first model's fp32 1e-4 (drift 6.5e-4, the same the
    first model's own fp16 variant PASSes with at 2e-2)."""
    out = tmp_path / "out"
    done = policy_matrix(["run", example("continuous_mlp"), "--candidate", user_fp16(tmp_path), "--targets", "ort-cpu",
                          *FAST, "--out", out])
    assert done.returncode == 0, done.stderr
    cells = {cell["candidate"]: cell for cell in json.loads((out / "results.json").read_text())["cells"]}
    assert cells[""]["verdict"] == "PASS" and cells[""]["tolerance"] == DEFAULT_TOLERANCE["fp32"]
    fp16 = cells["user_fp16.onnx"]
    assert fp16["verdict"] == "PASS" and fp16["tolerance"] == DEFAULT_TOLERANCE["fp16"], fp16["reasons"]
    assert fp16["parity"][0]["max_abs"] > DEFAULT_TOLERANCE["fp32"]  # its fp16 rounding, judged as such


@pytest.mark.slow
@pytest.mark.parametrize(("make", "targets"), [(user_fp16, "ort-cpu"), (user_dynamic_int8, "ort-cpu,tract")])
def test_a_users_fp16_or_int8_policy_passes_where_its_runtimes_run_it_right(tmp_path, policy_matrix, make, targets):
    """Before, at fp32's 1e-4: the fp16 graph FAILed on ort-cpu (4.8e-4, wasm the same), the int8 one on tract
    (2.8e-3: a quantization step where its float32 rounding of x / scale differs), though each ran the graph
    right. (tract refuses this fp16 graph's Gemm, in its own words, so it is not asked here.)"""
    out = tmp_path / "out"
    done = policy_matrix(["run", make(tmp_path), "--targets", targets, *FAST, "--out", out])
    results = json.loads((out / "results.json").read_text())
    for cell in results["cells"]:
        assert cell["verdict"] == "PASS", (cell["target"], cell["reasons"])
    assert done.returncode == 0, done.stderr
    assert any(item["id"] == "precision" and item["level"] == "warn" for item in results["lints"])


@pytest.mark.parametrize("make", [user_dynamic_int8, variant_policies.user_qdq_int8])
def test_an_int8_variant_that_quantizes_nothing_beyond_the_users_own_is_not_made(tmp_path, make):
    """ORT's dynamic quantization of an already-quantized model adds no quantized op: counted against nothing,
    its MatMulIntegers made the copy look quantized and it ran as "int8", the user's own model under a new name."""
    from matrix.run import variants

    paths, errors = variants.produce_all(model.load(make(tmp_path)), ["int8"], tmp_path / "variants")
    assert "int8" not in paths
    assert "quantized nothing beyond the model's own" in errors["int8"], errors


def float64_regressor(folder: Path) -> Path:
    """skl2onnx's regressor converted with DoubleTensorType (or torch's .double() module): float64 weights and I/O,
    which onnxconverter-common leaves as they are (it converts float32 only)."""
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(3, 2)), "coefficient")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["double_input", "coefficient"], ["variable"])], "regressor",
        [helper.make_tensor_value_info("double_input", TensorProto.DOUBLE, [None, 3])],
        [helper.make_tensor_value_info("variable", TensorProto.DOUBLE, [None, 2])], [weights])
    path = folder / "float64.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_an_fp16_variant_that_converts_nothing_is_not_made(tmp_path):
    """It ran as "fp16" with every weight still float64: the original under a new name."""
    from matrix.run import variants

    paths, errors = variants.produce_all(model.load(float64_regressor(tmp_path)), ["fp16"], tmp_path / "variants")
    assert "fp16" not in paths
    assert errors["fp16"] == ("fp16 conversion converted nothing to float16 (weights: 1 float64): this would be the "
                              "model as given named fp16")


def test_an_fp16_variant_of_an_fp16_model_is_not_made_in_the_tools_words(tmp_path):
    """onnxconverter-common refuses a graph with any float16 in it ("The model is already converted to float16, if
    convert again, ..."): the cell's SKIP said that, not what it means for the run. Not making it is the run's
    decision, not the tool failing: variants.py says which."""
    from matrix.run import variants

    paths, errors = variants.produce_all(model.load(user_fp16(tmp_path)), ["fp16"], tmp_path / "variants")
    assert "fp16" not in paths
    assert errors["fp16"] == ("not made: fp16 conversion converted nothing to float16 beyond the model's own (6 float16 "
                              "weight tensors, 1 float16 Cast node): the fp32 variant is that fp16 model as given")
    assert variants.split_errors(errors) == ({}, errors)


@pytest.mark.parametrize(("make", "evidence"), [
    (user_dynamic_int8, "6 quantization ops (DynamicQuantizeLinear, MatMulInteger)"),
    (variant_policies.user_qdq_int8, "18 quantization ops (DequantizeLinear, QuantizeLinear)")])
def test_an_fp16_variant_of_an_int8_model_is_not_made_as_its_int8_variant_is_not(tmp_path, make, evidence):
    """A QDQ model's fp16 variant SKIPped under 'the tool could not make the fp16 variant' after the mixed-precision
    search failed (DequantizeLinear takes float32 scales only before opset 19), while its int8 variant was 'not made';
    a dynamic int8 model got an 'fp16' variant: its float remainder halved around the user's int8 arithmetic."""
    from matrix.run import variants

    paths, errors = variants.produce_all(model.load(make(tmp_path)), ["fp16", "int8"], tmp_path / "variants")
    assert set(paths) == {"fp32"}
    assert errors["fp16"] == (f"not made: the model is already int8 ({evidence}), below fp16, so fp16 conversion is not "
                              "tried: the fp32 variant is that int8 model as given")
    assert errors["int8"].startswith("not made: ") and variants.split_errors(errors) == ({}, errors)


def test_a_qdq_models_variants_are_said_as_decisions_not_as_the_tools_failure(tmp_path, policy_matrix):
    out = tmp_path / "out"
    done = policy_matrix(["run", variant_policies.user_qdq_int8(tmp_path), "--targets", "ort-cpu", *FAST[:-1],
                          "fp32,fp16,int8", "--out", out])
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["variant_errors"] == {} and set(results["variants_not_made"]) == {"fp16", "int8"}
    for said in (done.stderr, (out / "index.html").read_text(), (out / "summary.md").read_text()):
        assert "could not make" not in said.lower() and "already int8" in said


def test_a_variant_with_nothing_to_make_is_said_as_a_decision_not_as_the_tools_failure(tmp_path, policy_matrix):
    """An fp16 model's own fp16 variant SKIPped under a red 'The tool could not make the fp16 variant — the tool's
    problem' (terminal, report, summary), though not converting a model already fp16 is a decision. The precision
    lint promised 'the int8 variant converts it further' whether or not the run made it."""
    out = tmp_path / "out"
    done = policy_matrix(["run", user_fp16(tmp_path), "--targets", "ort-cpu", *FAST[:-1], "fp32,fp16", "--out", out])
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["variant_errors"] == {}
    assert results["variants_not_made"]["fp16"].startswith("not made: fp16 conversion converted nothing")
    cells = {cell["variant"]: cell for cell in results["cells"]}
    assert cells["fp16"]["verdict"] == "SKIP"
    assert cells["fp16"]["reasons"][0].startswith("not run: the fp16 variant is not made: fp16 conversion"), cells["fp16"]
    for said in (done.stderr, (out / "index.html").read_text(), (out / "summary.md").read_text()):
        assert "could not make" not in said.lower() and "converted nothing to float16 beyond" in said
    precision = next(item["message"] for item in results["lints"] if item["id"] == "precision")
    assert precision == ("computes in fp16 as given (6 float16 weight tensors, 1 float16 Cast node): its fp32 cell runs "
                         "it as it is and is judged at fp16's default tolerance")


@pytest.mark.slow
def test_a_candidates_precision_is_said_in_the_lints_and_on_its_cells(tmp_path, policy_matrix):
    """The first model's precision had a lint; a user's fp16 candidate, judged at fp16 as well, had none, and its
    fp16 cell SKIPped in onnxconverter-common's words."""
    out = tmp_path / "out"
    done = policy_matrix(["run", example("continuous_mlp"), "--candidate", user_fp16(tmp_path), "--targets", "ort-cpu",
                          *FAST[:-1], "fp32,fp16", "--out", out])
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    precision = [(item["level"], item["message"]) for item in results["lints"] if item["id"] == "precision"]
    assert precision == [("ok", "computes in float32 as given"),
                         ("warn", "candidate user_fp16.onnx: computes in fp16 as given (6 float16 weight tensors, 1 float16 "
                                  "Cast node): its fp32 cell runs it as it is and is judged at fp16's default tolerance")]
    cells = {(cell["candidate"], cell["variant"]): cell for cell in results["cells"]}
    assert "judged at fp16's tolerance: user_fp16.onnx computes in fp16 as given" in cells["user_fp16.onnx", "fp32"]["notes"]
    assert not any("computes in" in note for note in cells["", "fp32"]["notes"] + cells["user_fp16.onnx", "fp16"]["notes"])
    assert "converted nothing to float16 beyond the model's own" in cells["user_fp16.onnx", "fp16"]["reasons"][0]
    assert results["variant_errors"] == {}  # a candidate's variant not made is not the tool failing either


def test_a_users_tolerance_wins_over_the_models_precision_and_the_note_says_so(tmp_path, policy_matrix):
    """--tolerance '*:fp32=0.5' on a user's int8 model judged its cell at 0.5, and the note said 'judged at int8's
    tolerance' (0.25): the note says what was used."""
    out = tmp_path / "out"
    done = policy_matrix(["run", user_dynamic_int8(tmp_path), "--targets", "ort-cpu", "--tolerance", "*:fp32=0.5",
                          *FAST, "--out", out])
    assert done.returncode == 0, done.stderr
    cell = json.loads((out / "results.json").read_text())["cells"][0]
    assert (cell["tolerance"], cell["rtol"]) == (0.5, 1e-2)
    assert [note for note in cell["notes"] if note.startswith("judged at")] == [
        "judged at atol 0.5 (given for *:fp32) and int8's rtol 0.01: the model computes in int8 as given"]
    judge = Judge(model_precisions={"": "int8"})
    assert judge.precision_note("ort-cpu", "fp32") == "judged at int8's tolerance: the model computes in int8 as given"
