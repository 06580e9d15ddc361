"""Verdicts are the runtime's doing: regression tests on policies built the way real exporters build them.

Each test runs the real tool (the CLI as a user runs it, or the function that
makes the decision) on a policy from tests/policies.py.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnx.reference
import pytest
from conftest import load_results
from onnx import TensorProto, helper

import policies
from matrix.inputs import batch_axes, model, observations
from matrix.run import cells, variants
from matrix.judge import metrics
from matrix.reference import reference
from matrix.inputs.lint import lint
from matrix.results import ArtifactInfo, Cell, OutputParity
from matrix.judge.rules import Context, Tolerance, verdict
from targets.base import EMULATED_ITERS, Artifact
from targets.ort_cpu import OrtSession

pytestmark = [pytest.mark.slow, pytest.mark.tflite_env, pytest.mark.coreml_env]

FAST = ("--iters", "10", "--warmup", "2")


@pytest.fixture  # per test, so the module's end-to-end runs spread over pytest-xdist workers (tests/conftest.py)
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policies")
    return lambda name: policies.save(getattr(policies, name)(), folder, name)


def _cells(out) -> dict[str, dict]:
    return {cell["variant"]: cell for cell in load_results(out)["cells"]}


# --- variants the tool makes -------------------------------------------------------------------

def test_fp16_of_a_recurrent_cell_keeps_its_interface_and_passes(built, tmp_path, policy_matrix):
    info = model.load(built("gru_cell"))
    paths, errors = variants.produce_all(info, ["fp16"], tmp_path / "variants")
    assert not errors
    fp16 = onnx.load(str(paths["fp16"]))
    variants.validate(info.proto, fp16, "fp16")  # raises if names, shapes or dtypes moved
    assert {o.name: o.type.tensor_type.elem_type for o in fp16.graph.output} == {"action": 1, "h_next": 1}

    done = policy_matrix(["run", info.path, "--targets", "ort-cpu", "--precisions", "fp32,fp16", *FAST, "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    for cell in _cells(tmp_path / "report").values():
        assert cell["verdict"] == "PASS", cell["reasons"]
        state = next(c for c in cell["contract"] if c["name"] == "recurrent state h -> h_next")
        assert state["ok"] is True, state


def test_a_variant_whose_output_became_float16_is_refused_and_restored(built):
    original = policies.minmax_clip_mlp()
    changed = onnx.ModelProto()
    changed.CopyFrom(original)
    last = changed.graph.node[-1]
    last.output[0] = "action_fp32"
    changed.graph.node.append(helper.make_node("Cast", ["action_fp32"], ["action"], to=TensorProto.FLOAT16))
    changed.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(variants.VariantError, match="changed the model's outputs: action float16"):
        variants.validate(original, changed, "fp16")
    variants.validate(original, variants.restore_interface(original, changed), "fp16")


def test_fp16_of_a_min_max_clipped_policy_keeps_a_float32_action(built, tmp_path, policy_matrix):
    """SB3 Pendulum: onnxconverter-common declares the clipped action float16; the variant must not."""
    info = model.load(built("minmax_clip_mlp"))
    paths, errors = variants.produce_all(info, ["fp16"], tmp_path / "variants")
    assert not errors
    assert onnx.load(str(paths["fp16"])).graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    done = policy_matrix(["run", info.path, "--targets", "ort-cpu", "--precisions", "fp32,fp16", *FAST, "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    cells = _cells(tmp_path / "report")
    assert cells["fp16"]["verdict"] == "PASS", cells["fp16"]["reasons"]
    bounds = next(c for c in cells["fp32"]["contract"] if c["name"] == "action bounds")
    assert bounds["ok"] is True and "[-2, 2] (graph: final Min/Max clip)" in bounds["detail"]


def test_the_fp16_variant_keeps_constants_float16_can_hold(built, tmp_path, policy_matrix):
    """onnxconverter-common clamps constants to +-1e4 by default: a hidden layer scaled by 2e4 and back came out
    halved, and ort-cpu's and tract's fp16 cells FAILed at drift 0.74, the conversion's doing (the model in float16
    drifts ~5e-4). The variant clamps only what float16 cannot hold."""
    done = policy_matrix(["run", built("rescaled_hidden_layer"), "--targets", "ort-cpu,tract", "--variants", "fp16", *FAST,
                          "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    for cell in load_results(tmp_path / "report")["cells"]:
        assert cell["verdict"] == "PASS", (cell["target"], cell["reasons"])
    fp16 = onnx.load(str(next((tmp_path / "report" / "variants").rglob("fp16.onnx"))))
    scale = next(t for t in fp16.graph.initializer if t.name == "up")
    assert onnx.numpy_helper.to_array(scale) == np.float16(2e4)


def test_fp16_of_a_clamped_td3_actor_is_held_to_the_bounds_float16_states(built, tmp_path, policy_matrix):
    """torch's export of clamp(..., -0.3, 0.7): the fp16 variant clips at float16's 0.70020 and onnxruntime returns it;
    the cell FAILed the action contract ('[-0.3, 0.7002] leaves [-0.3, 0.7]') for the tool's rounding, at drift 2e-3."""
    observations = tmp_path / "far.npy"  # far enough out that the actor saturates at both bounds
    np.save(observations, np.random.default_rng(0).normal(0, 50, size=(64, 3)).astype(np.float32))
    done = policy_matrix(["run", built("td3_actor"), "--targets", "ort-cpu", "--variants", "fp32,fp16", "--obs", observations,
                          *FAST, "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    cells = _cells(tmp_path / "report")
    assert cells["fp16"]["verdict"] == "PASS", cells["fp16"]["reasons"]
    bounds = {cell: next(c for c in cells[cell]["contract"] if c["name"] == "action bounds") for cell in ("fp32", "fp16")}
    assert bounds["fp32"]["detail"] == "[-0.3, 0.7] within [-0.3, 0.7] (graph: final Clip)"
    assert bounds["fp16"]["detail"].startswith("[-0.30005, 0.7002] within [-0.3, 0.7] as float16 holds them")


def test_bounds_the_export_itself_breaks_are_the_model_s_lint_not_every_runtime_s_fail(built, tmp_path, policy_matrix):
    """SB3's PPO export returns the unsquashed Gaussian mean; with [-2, 2] in its metadata every cell of every runtime
    FAILed 'contract: action bounds: [-6.1, 4] leaves [-2, 2]', the same row on every target, for the export."""
    done = policy_matrix(["run", built("unsquashed_gaussian_mean"), "--targets", "ort-cpu", "--variants", "fp32,fp16",
                          *FAST, "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    results = load_results(tmp_path / "report")
    found = next(item for item in results["lints"] if item["id"] == "action-bounds")
    assert found["level"] == "warn" and "reference's action leaves [-2, 2] (metadata) on" in found["message"], found
    for cell in results["cells"]:
        assert cell["verdict"] == "PASS", cell["reasons"]
        bounds = next(c for c in cell["contract"] if c["name"] == "action bounds")
        assert bounds["ok"] is True and "no farther than the reference" in bounds["detail"], bounds
    assert "action-bounds" in (tmp_path / "report" / "index.html").read_text()


def test_an_index_the_model_returns_outside_its_action_n_is_the_model_s_lint_not_every_runtime_s_fail(built, tmp_path,
                                                                                                      policy_matrix):
    """An ArgMax over 4 logits with action_n = 3 in its metadata: every cell of every runtime FAILed 'contract: action
    bounds: index outside [0, 3)', the same row on every target, for the model's own count."""
    done = policy_matrix(["run", built("argmax_over_more_logits_than_action_n"), "--targets", "ort-cpu", "--variants",
                          "fp32", *FAST, "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    results = load_results(tmp_path / "report")
    found = next(item for item in results["lints"] if item["id"] == "action-bounds")
    assert found["level"] == "warn" and found["message"].startswith("the float64 reference returns action index 3, "
                                                                     "outside [0, 3) (metadata action_n = 3), on "), found
    [cell] = results["cells"]
    assert cell["verdict"] == "PASS", cell["reasons"]
    bounds = next(c for c in cell["contract"] if c["name"] == "action bounds")
    assert bounds["ok"] is True and "the reference's own index on each" in bounds["detail"], bounds


# A TD3 actor as its users write it, rescaled to [-0.3, 0.7] and clamped, exported by torch's TorchScript exporter
# (the dynamo exporter writes the same ops with the bounds as initializers: tests/policies.td3_actor).
TD3_EXPORT = """
import sys, torch
class Actor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        with torch.no_grad():
            self.net[-1].weight.mul_(8.0)
    def forward(self, obs):
        return torch.clamp(-0.3 + 0.5 * (torch.tanh(self.net(obs)) + 1.0) * 1.0, -0.3, 0.7)
torch.manual_seed(0)
torch.onnx.export(Actor().eval(), torch.zeros(1, 3), sys.argv[1], input_names=["obs"], output_names=["action"],
                  dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, opset_version=17, dynamo=False)
"""


def _td3_export(folder, python) -> None:
    import subprocess

    (folder / "export.py").write_text(TD3_EXPORT)
    subprocess.run([str(python), str(folder / "export.py"), str(folder / "td3.onnx")], check=True, capture_output=True,
                   timeout=300)


def test_fp16_of_a_torch_exported_td3_actor_is_not_failed_for_its_rounded_bounds(tmp_path, policy_matrix):
    from source_policies import cached_policies
    from targets import coreml_conversion, isolated_env

    python = isolated_env.env_python(coreml_conversion.ENV_NAME, coreml_conversion.REQUIREMENTS)
    if python is None:
        pytest.skip(coreml_conversion.environment_missing())  # torch lives in the Core ML converter's environment
    exported = cached_policies("td3-clamp", TD3_EXPORT, python, _td3_export)
    observations = tmp_path / "far.npy"
    np.save(observations, np.random.default_rng(0).normal(0, 50, size=(64, 3)).astype(np.float32))
    done = policy_matrix(["run", exported / "td3.onnx", "--targets", "ort-cpu", "--variants", "fp16", "--obs", observations,
                          *FAST, "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    fp16 = _cells(tmp_path / "report")["fp16"]
    assert fp16["verdict"] == "PASS", fp16["reasons"]
    bounds = next(c for c in fp16["contract"] if c["name"] == "action bounds")
    assert "0.7002] within [-0.3, 0.7] as float16 holds them" in bounds["detail"]


def test_int8_the_tool_cannot_make_is_reported_once_and_skips_its_cells(built, tmp_path, policy_matrix):
    path = built("gemm_add_mlp")  # weights in Constant nodes: dynamic quantization sees none of them
    done = policy_matrix(["run", path, "--targets", "ort-cpu,tract", "--precisions", "fp32,int8", *FAST, "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    results = load_results(tmp_path)
    assert list(results["variant_errors"]) == ["int8"] and "quantized nothing" in results["variant_errors"]["int8"]
    int8 = [cell for cell in results["cells"] if cell["variant"] == "int8"]
    assert len(int8) == 2 and all(c["verdict"] == "SKIP" and "the tool could not make the int8" in c["reasons"][0] for c in int8)
    assert (tmp_path / "index.html").read_text().count("The tool could not make the int8 variant") == 1
    assert "could not make the int8 variant" in (tmp_path / "summary.md").read_text()


def test_int8_cells_count_what_is_quantized_and_an_unquantized_one_is_never_recommended():
    from matrix.decide import decide as shipping
    from matrix.results import LatencyStats, RunResults

    counted = variants.quantization(policies.minmax_clip_mlp())
    assert counted == {"quantized_ops": 0, "float_ops": 3, "quantized_weights": 0, "float_weights": 3, "per_call_ops": 0}
    stats = [LatencyStats(batch=1, n=10, p50_us=5, p90_us=5, p99_us=5, mean_us=5, std_us=0, min_us=5)]
    parity = [OutputParity(output="action", kind="continuous", max_abs=1e-7, mean_abs=0, p99_abs=0, max_rel=0)]
    fp32 = Cell(host="h", target="t", variant="fp32", verdict="PASS", latency=stats, parity=parity,
                artifact=ArtifactInfo(size_bytes=1000, conversion_s=0))
    int8 = Cell(host="h", target="t", variant="int8", verdict="PASS", latency=stats, parity=parity,
                artifact=ArtifactInfo(size_bytes=1000, conversion_s=0, quantization=counted))
    judged, reasons = verdict(int8, Context(Tolerance(0.25)))
    assert judged == "WARN" and "nothing quantized" in reasons[0]
    int8.verdict = judged
    results = RunResults(tool_version="t", created="now", model={}, hosts=[], run_options={}, lints=[], cells=[int8, fp32])
    (decision,) = shipping.decide_all(results, [])
    assert decision.chosen.variant == "fp32" and decision.runner_up is None  # the faster-or-equal int8 is out
    assert shipping.decide_target("h", "t", [int8], [], "latency").closest.misses == ["int8 in name only: nothing quantized"]


# --- discrete actions ------------------------------------------------------------------------

def test_int8_flips_above_the_tie_margin_fail_below_min_agreement_and_warn_above(built, tmp_path, policy_matrix):
    path = built("close_call_discrete")
    done = policy_matrix(["run", path, "--targets", "ort-cpu", "--precisions", "int8", "--n-obs", "256", *FAST,
                          "--out", tmp_path / "a"])
    assert done.returncode == 1, done.stderr
    cell = _cells(tmp_path / "a")["int8"]
    parity = cell["parity"][0]
    assert parity["flips"] > 2 and parity["agreement"] < 0.99
    assert cell["verdict"] == "FAIL" and "below the minimum agreement 99%" in cell["reasons"][0]
    assert load_results(tmp_path / "a")["settings"]["tie_margin"] == 1e-3
    assert "flips / " in (tmp_path / "a" / "index.html").read_text()

    done = policy_matrix(["run", path, "--targets", "ort-cpu", "--precisions", "int8", "--n-obs", "256", "--min-agreement", "0.5",
                          *FAST, "--out", tmp_path / "b"])
    assert done.returncode == 0, done.stderr
    assert _cells(tmp_path / "b")["int8"]["verdict"] == "WARN"

    done = policy_matrix(["run", path, "--targets", "ort-cpu", "--precisions", "int8", "--n-obs", "256", "--tie-margin", "100",
                          *FAST, "--out", tmp_path / "c"])
    parity = _cells(tmp_path / "c")["int8"]["parity"][0]
    assert done.returncode == 0 and parity["flips"] == 0 and parity["near_ties"] > 2


@pytest.mark.parametrize("option", ["--tie-margin=-1", "--min-agreement=1.5"])
def test_bad_tie_margin_or_agreement_exits_2(built, tmp_path, option, policy_matrix):
    done = policy_matrix([built("close_call_discrete"), option, "--out", tmp_path])
    assert done.returncode == 2 and len(done.lines) == 1 and option.split("=")[0] in done.lines[0], done.lines[-5:]


# --- inputs, the reference and its audit trail -----------------------------------------------

def test_a_side_input_is_fed_whole_and_not_taken_for_a_batch(built, tmp_path, policy_matrix):
    info = model.load(built("side_input_policy"))
    assert batch_axes.fed_whole(info) == ["rng"]
    lints = {item.id: item for item in lint(info)}
    assert lints["symbolic-batch"].level == "ok" and "['rng']" in lints["side-inputs"].message

    done = policy_matrix(["run", info.path, "--targets", "ort-cpu", "--precisions", "fp32", *FAST, "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    assert np.load(tmp_path / "observations.npz")["rng"].shape == (1,)
    saved = np.load(tmp_path / "reference.npz")
    feeds = observations.read(tmp_path / "observations.npz")
    expected = np.tanh(feeds["rng"] * (feeds["obs"].astype(np.float64) @ _initializer(info, "fc_w") + _initializer(info, "fc_b")))
    assert saved["action"].shape == (128, 2) and np.allclose(saved["action"], expected, atol=1e-6)
    assert _cells(tmp_path)["fp32"]["verdict"] == "PASS"


def _initializer(info, name: str) -> np.ndarray:
    tensor = next(t for t in info.proto.graph.initializer if t.name == name)
    return onnx.numpy_helper.to_array(tensor).astype(np.float64)


def test_chunks_slice_only_the_batched_inputs():
    feeds = {"a": np.arange(6.0).reshape(6, 1), "shape": np.array([3, 2]), "scalar": np.array(2.0)}
    seen = []

    def run(chunk):
        seen.append({k: v.shape for k, v in chunk.items()})
        return {"y": chunk["a"] * chunk["scalar"]}

    out = observations.run_in_batches(run, feeds, 2, {"a": 0, "y": 0})
    assert seen == [{"a": (2, 1), "shape": (2,), "scalar": ()}] * 3 and out["y"].ravel().tolist() == [0, 2, 4, 6, 8, 10]
    only_whole = observations.run_in_batches(lambda f: {"y": f["shape"]}, {"shape": np.array([0, 7])}, 0, {})
    assert only_whole["y"].tolist() == [0, 7]


def test_reference_keeps_an_explicit_cast_to_float16():
    nodes = [helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["half"], ["action"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = onnx.reference.ReferenceEvaluator(reference.to_float64(proto)).run(None, {"x": np.array([[0.1]])})[0]
    assert out.dtype == np.float64 and out[0, 0] == float(np.float16(0.1)) != 0.1


def test_matching_non_finite_values_are_equal_and_others_are_not():
    ref = np.array([[np.nan, np.inf, -np.inf, 1.0]])
    same = metrics.parity("y", ref.astype(np.float32), ref, None, None, 1e-3)
    assert same.max_abs == 0.0
    wrong = metrics.parity("y", np.array([[np.nan, -np.inf, -np.inf, 1.0]], np.float32), ref, None, None, 1e-3)
    assert wrong.max_abs == np.inf
    nan_where_finite = metrics.parity("y", np.array([[np.nan, np.inf, -np.inf, np.nan]], np.float32), ref, None, None, 1e-3)
    assert nan_where_finite.max_abs == np.inf


def test_discrete_parity_of_a_rank_3_argmax():
    reference_actions = np.zeros((4, 3, 2), np.int64)
    actual = reference_actions.copy()
    actual[0, 1, 0] = 1
    margins = np.full((4, 3, 2), 0.5)
    result = metrics.parity("a", actual, reference_actions, None, margins, 1e-3)
    assert result.flips == 1 and result.agreement == pytest.approx(23 / 24)


# --- lints and the contract --------------------------------------------------------------------

def test_a_nan_initializer_is_a_lint_error(built):
    found = {item.id: item for item in lint(model.load(built("nan_initializer_mlp")))}
    assert found["finite-weights"].level == "error"
    assert found["finite-weights"].message == "initializer W1_w has 1 non-finite value"


def test_recurrent_state_is_detected(built):
    found = {item.id: item for item in lint(model.load(built("gru_cell")))}
    assert "h -> h_next" in found["recurrent-state"].message


# --- cells and stages --------------------------------------------------------------------------

def test_latency_is_time_boxed_and_says_how_many_calls_it_timed(built, tmp_path):
    info = model.load(built("gru_cell"))
    session = OrtSession(Artifact(path=info.path), ["CPUExecutionProvider"], 1)
    feeds = observations.take(observations.seeded(info, 8, 0), 1, info.batch_axes)
    spec = cells.CellSpec(target="ort-cpu", variant="fp32", observations="", onnx_variants={}, iters=10**8,
                          warmup=10**6, latency_budget_s=0.5)
    from matrix.run.worker import timed_batches, timed_calls

    started = time.perf_counter()
    samples, budget_spent = timed_calls(session, feeds, spec)
    assert time.perf_counter() - started < 5
    assert budget_spent and 10 < len(samples) < spec.iters
    # A budget the calls stay inside: exactly --iters, after a warm-up cut to a quarter of it (0.5 s of the 10**6 asked;
    # a 30 s budget here burned 7.5 s of warm-up)
    spec.iters, spec.latency_budget_s = 50, 2.0
    samples, budget_spent = timed_calls(session, feeds, spec)
    assert not budget_spent and len(samples) == 50
    # an emulated adapter's latency means nothing: a few calls, whatever --iters asks
    assert len(timed_calls(session, feeds, spec, emulated=True)[0]) == EMULATED_ITERS < spec.iters
    assert timed_batches([64, 1], emulated=True) == [1] and timed_batches([1, 64], emulated=False) == [1, 64]  # and its smallest batch only


def test_a_warn_about_the_actions_comes_before_a_fallback_warn():
    """The grid shows a cell's first reason: what the actions do (drift, batch sizes, behaviour) before where nodes ran."""
    from targets.base import PlacementRow

    parity = [OutputParity(output="action", kind="continuous", max_abs=0.2, mean_abs=0.1, p99_abs=0.2, max_rel=0.2)]
    placement = [PlacementRow("head", "Gemm", "XNNPACK", False), PlacementRow("clip", "Min", "CPU", True)]
    cell = Cell(host="h", target="tflite", variant="fp32", verdict="PASS", parity=parity, placement=placement)
    judged, reasons = verdict(cell, Context(Tolerance(0.25)))
    assert judged == "WARN" and reasons[0].startswith("action: drift 0.2") and reasons[1] == "1 node of 2 fell back to CPU"


def test_a_conversion_only_cell_is_converted_not_passed():
    cell = Cell(host="h", target="coreml", variant="fp32", verdict="SKIP", predicts=False,
                artifact=ArtifactInfo(size_bytes=10, conversion_s=1))
    assert verdict(cell, Context())[0] == "CONVERTED"


# --- tflite: each variant on its own artifact, int8 counted ------------------------------------

def _tflite_or_skip():
    import targets

    reason = targets.get("tflite").unavailable_reason()
    if reason:
        pytest.skip(f"tflite: {reason}")


def test_a_failed_tflite_int8_step_leaves_fp32_and_fp16_standing(built, tmp_path, policy_matrix):
    _tflite_or_skip()
    done = policy_matrix(["run", built("markup_names_mlp"), "--targets", "tflite", *FAST, "--out", tmp_path])
    assert done.returncode == 1, done.stderr
    cells = _cells(tmp_path)
    assert cells["fp32"]["verdict"] == "PASS" and cells["fp32"]["parity"][0]["max_abs"] < 1e-5, cells["fp32"]["reasons"]
    assert cells["fp16"]["verdict"] == "PASS", cells["fp16"]["reasons"]
    assert cells["int8"]["verdict"] == "FAIL" and "SavedModel" in cells["int8"]["reasons"][0]


def test_a_tflite_int8_file_with_nothing_quantized_warns_and_is_never_recommended(built, tmp_path, policy_matrix):
    _tflite_or_skip()
    from matrix import results

    done = policy_matrix(["run", built("side_input_policy"), "--targets", "tflite", "--precisions", "fp32,int8",
                          *FAST, "--out", tmp_path])
    cells = _cells(tmp_path)
    int8 = cells["int8"]
    assert int8["artifact"]["quantization"]["quantized_weights"] == 0, int8["artifact"]
    assert int8["verdict"] == "WARN" and "nothing quantized" in " ".join(int8["reasons"]), int8["reasons"]
    assert any("int8 in name only" in note for note in int8["artifact"]["notes"])
    decisions = results.load(tmp_path / "results.json").decision
    assert decisions and all(d.chosen.variant != "int8" for d in decisions if d.chosen), (decisions, done.stderr)
    assert all(d.runner_up is None or d.runner_up.variant != "int8" for d in decisions)


def test_coreml_conversion_only_cell_is_converted_and_notes_the_tools_workaround(built, tmp_path, policy_matrix):
    import targets

    if reason := targets.get("coreml").unavailable_reason():
        pytest.skip(f"coreml: {reason}")
    done = policy_matrix(["run", built("minmax_clip_mlp"), "--targets", "coreml", "--precisions", "fp32", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    cell = _cells(tmp_path)["fp32"]
    assert cell["verdict"] == "CONVERTED", cell["reasons"]
    assert any("broadcast_to converted as expand" in reason for reason in cell["reasons"])
    assert "CONVERTED 1" in done.stderr


def test_webgpu_backend_check_reads_the_placement_rows():
    """One source of truth: nodes the placement table puts on WebGPU mean the backend ran WebGPU."""
    from targets.base import PlacementRow
    from targets.ort_web import OrtWebWebgpu

    target = OrtWebWebgpu()
    probe = {"present": True, "isFallbackAdapter": True, "vendor": "google"}
    on_gpu = [PlacementRow("conv", "Conv", target.where_label, False), PlacementRow("cast", "Cast", "CPUExecutionProvider", True)]
    info = target.verify_backend(probe, [], True, on_gpu)
    assert info.actual == "webgpu" and "no WebGPU kernel for 1 node(s)" in info.detail
    on_cpu = [PlacementRow("conv", "Conv", "CPUExecutionProvider", True)]
    assert target.verify_backend(probe, [], True, on_cpu).actual == "webgpu"  # a total fallback: the rows say so
    assert target.verify_backend(probe, [], True, []).actual == "unknown"
