"""Each precision variant is made on its own guarded step, in mixed precision where the converter
cannot make it whole, and cached by the hash of its bytes (matrix/run/variants.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnxconverter_common import float16
from assist_fixtures import fp16_overflow_mlp
from conftest import run_cli
from source_policies import TORCH_WHERE_FLAG_EXPORT, cached_policies, torch_script_exports
from variant_policies import skl2onnx_regressor, stateful_detector, weights_in_if_branches

from matrix.decide import decide
from matrix.inputs import examples
from matrix.run import guarded, variants
from matrix.assist import preparations
from matrix.judge import rules
from targets import coreml_conversion, isolated_env
from matrix.inputs import model as model_loader
from matrix import results as schema

LIMITS = guarded.Limits(300, None)

# Injected into the variant steps' interpreters (not this one): the fp16 converter dies by SIGSEGV, the way
# onnxruntime 1.32 died checking the fp16 variant of an attention policy.
CRASHING_FP16 = """
import os, signal
from onnxconverter_common import float16
def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGSEGV)
float16.convert_float_to_float16 = _die
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _load(proto: onnx.ModelProto, folder: Path, name: str = "policy") -> model_loader.ModelInfo:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(folder / f"{name}.onnx"))
    return model_loader.load(folder / f"{name}.onnx")


def _outputs(path: Path, feeds: dict) -> np.ndarray:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_a_crash_making_fp16_costs_fp16_only_and_is_named_once(tmp_path, cache, monkeypatch):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(CRASHING_FP16)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "inject"), *sys.path]))
    info = model_loader.load(examples.path("continuous_mlp"))
    made, errors = variants.produce_guarded(info, ["fp32", "fp16", "int8"], tmp_path / "run", LIMITS)
    assert set(made) == {"fp32", "int8"} and set(errors) == {"fp16"}
    assert errors["fp16"].startswith("making the fp16 variant did not finish: killed by signal 11 (SIGSEGV)"), errors
    assert errors["fp16"].count("SIGSEGV") == 1
    assert variants.quantization(onnx.load(str(made["int8"])))["quantized_ops"] > 0


def test_a_graph_starting_with_a_cast_gets_an_fp16_variant_with_that_cast_kept_in_fp32(tmp_path, cache):
    info = _load(skl2onnx_regressor(), tmp_path)
    with pytest.raises(variants.VariantError, match="not valid ONNX"):  # what the converter makes of it whole
        variants.validate(info.proto, float16.convert_float_to_float16(info.proto, keep_io_types=True), "fp16")
    made, errors = variants.produce_all(info, ["fp16"], tmp_path / "run")
    assert not errors
    fp16 = onnx.load(str(made["fp16"]))
    variants.validate(info.proto, fp16, "fp16")
    assert variants.kept_fp32(made["fp16"]) == ["Cast"]
    assert variants.notes("fp16", made["fp16"]) == [
        "fp16 variant with Cast kept in fp32 (mixed precision: the converter could not make the whole graph fp16)"]
    assert sum(t.data_type == onnx.TensorProto.FLOAT16 for t in fp16.graph.initializer) == 4  # the weights are fp16
    feeds = {"float_input": np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)}
    drift = np.abs(_outputs(made["fp16"], feeds) - _outputs(made["fp32"], feeds)).max()
    assert 0 < drift < 1e-2  # rounded weights, not another model


def test_a_whole_fp16_conversion_keeps_no_node_in_fp32(tmp_path, cache):
    made, errors = variants.produce_all(model_loader.load(examples.path("continuous_mlp")), ["fp16"], tmp_path)
    assert not errors and variants.kept_fp32(made["fp16"]) == [] and variants.notes("fp16", made["fp16"]) == []


def test_a_tampered_cached_variant_is_rebuilt_not_run(tmp_path, cache):
    info = model_loader.load(examples.path("continuous_mlp"))
    first, _ = variants.produce_all(info, ["fp16", "int8"], tmp_path / "first")
    other, _ = variants.produce_all(model_loader.load(examples.path("discrete_mlp")), ["fp16"], tmp_path / "other")
    for entry in cache.glob("variants/*/fp16-*.onnx"):  # every cached fp16 file now holds the discrete policy
        entry.write_bytes(other["fp16"].read_bytes())
    index = next(cache.glob("variants/*/int8.json"))
    index.write_text('{"sha256": "../../../elsewhere", "conversion_s": 0, "kept_fp32": []}')
    second, errors = variants.produce_all(info, ["fp16", "int8"], tmp_path / "second")
    assert not errors
    for variant in ("fp16", "int8"):
        assert second[variant].read_bytes() == first[variant].read_bytes()
    assert not list(cache.glob("variants/*/.*"))  # no staging file left behind


def test_two_runs_sharing_one_cache_both_get_their_variants(tmp_path, cache):
    info = model_loader.load(examples.path("pixel_cnn"))
    answers = {}

    def run(name: str) -> None:
        answers[name] = variants.produce_guarded(info, ["fp16", "int8"], tmp_path / name, LIMITS)

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (a, a_errors), (b, b_errors) = answers["a"], answers["b"]
    assert not a_errors and not b_errors
    assert {k: v.read_bytes() for k, v in a.items()} == {k: v.read_bytes() for k, v in b.items()}
    assert a["int8"].parent != b["int8"].parent  # each run's cells use the run's own copy
    assert not list(cache.glob("variants/*/.*"))


def test_the_int8_count_looks_inside_subgraphs_and_constant_nodes():
    counted = variants.quantization(weights_in_if_branches())
    assert counted == {"quantized_ops": 0, "float_ops": 2, "quantized_weights": 0, "float_weights": 2, "per_call_ops": 0}


def test_a_preparation_that_changes_the_interface_is_listed_as_refused_and_never_run(tmp_path, cache):
    """onnxsim at batch 1 on silero-vad's interface: every symbolic dim becomes 1, the state's leading 2 too."""
    info = _load(stateful_detector(), tmp_path)
    failing = schema.Cell(host="h", target="ort-cpu", variant="fp32", verdict="FAIL")
    attempts = preparations.try_fixes(failing, info, None, None, tmp_path / "fixes", tmp_path, {}, LIMITS)
    assert [(a.preparation, a.verdict) for a in attempts] == [("simplify", "SKIP")]
    assert attempts[0].reasons == ["refused as a fix: it changes the model's interface (input input [batch, samples] -> [1, 1]; "
                                   "input state [2, batch, 8] -> [1, 1, 8]; output stateN [2, batch, 8] -> [2, 1, 8])"]
    assert attempts[0].steps and not attempts[0].prepared_onnx  # what it did is shown; nothing is offered


@pytest.mark.parametrize("build", [examples.continuous_mlp, examples.discrete_mlp, fp16_overflow_mlp])
def test_a_batch_fixed_to_the_fed_batch_or_a_host_argmax_is_no_interface_change(build):
    for name, prepared in preparations.candidates(build()):
        assert preparations.interface_change(build(), prepared) == "", name


@pytest.mark.slow
def test_assist_offers_keeping_the_diagnosed_node_in_fp32_and_checks_it_through_the_target(tmp_path, policy_matrix):
    policy = tmp_path / "overflow.onnx"
    onnx.save(fp16_overflow_mlp(), str(policy))
    done = policy_matrix(["run", policy, "--targets", "ort-cpu", "--precisions", "fp16", "--diagnose", "--assist",
                          "--iters", "5", "--warmup", "1", "--n-obs", "64", "--out", tmp_path / "out"])
    assert done.returncode == 1, done.stderr
    cell = schema.load(tmp_path / "out" / "results.json").cells[0]
    assert cell.verdict == "FAIL" and cell.diagnosis.first.node == "scale_up"
    kept = cell.fixes[0]
    assert kept.preparation == "keep scale_up in fp32" and kept.verdict in ("PASS", "WARN"), kept
    assert kept.drift < cell.tolerance < max(p.max_abs for p in cell.parity)  # measured through ort-cpu: the overflow is gone
    fp16 = onnx.load(str(tmp_path / "out" / kept.prepared_onnx))
    assert next(n for n in fp16.graph.node if n.name == "scale_up").input[1] == "up"  # its 1e5 constant stays float32
    assert next(t for t in fp16.graph.initializer if t.name == "up").data_type == onnx.TensorProto.FLOAT


@pytest.mark.slow
def test_a_run_whose_fp16_step_dies_skips_only_the_fp16_cells_and_says_why_once(tmp_path, cache, monkeypatch):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(CRASHING_FP16)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "inject"), *sys.path]))
    done = run_cli("run", examples.path("continuous_mlp"), "--targets", "ort-cpu", "--precisions", "fp32,fp16,int8",
                   "--iters", "5", "--warmup", "1", "--batch-sizes", "1", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    results = schema.load(tmp_path / "out" / "results.json")
    assert {c.variant: c.verdict for c in results.cells} == {"fp32": "PASS", "fp16": "SKIP", "int8": "PASS"}
    assert list(results.variant_errors) == ["fp16"] and "SIGSEGV" in results.variant_errors["fp16"]
    assert done.stderr.count("SIGSEGV") == 1


# SB3's documented export (torch.onnx.export, dynamo=False) of an actor whose forward starts with `obs.float()`,
# as SB3's preprocess_obs does: the legacy exporter writes that as a leading Cast.
SB3_STYLE_EXPORT = """
import sys, torch
class Actor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1), torch.nn.Tanh())
    def forward(self, obs):
        return self.mu(obs.float())
torch.manual_seed(0)
torch.onnx.export(Actor(), torch.zeros(1, 3), sys.argv[1], input_names=["obs"], output_names=["action"],
                  dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, opset_version=17, dynamo=False)
"""


def _sb3_style_export(folder: Path, python: Path) -> None:
    (folder / "export.py").write_text(SB3_STYLE_EXPORT)
    subprocess.run([str(python), str(folder / "export.py"), str(folder / "actor.onnx")], check=True, capture_output=True,
                   timeout=300)


@pytest.mark.coreml_env  # torch lives in the Core ML converter's environment
def test_an_sb3_style_torch_export_gets_an_fp16_variant_with_its_leading_cast_kept_in_fp32(tmp_path, monkeypatch):
    python = isolated_env.env_python(coreml_conversion.ENV_NAME, coreml_conversion.REQUIREMENTS)
    if python is None:
        pytest.skip(coreml_conversion.environment_missing())
    exported = cached_policies("sb3-style", SB3_STYLE_EXPORT, python, _sb3_style_export)  # torch runs once per script
    shutil.copy(exported / "actor.onnx", tmp_path / "actor.onnx")
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))  # the variant is made here, not found cached
    info = model_loader.load(tmp_path / "actor.onnx")
    assert info.proto.graph.node[0].op_type == "Cast"
    made, errors = variants.produce_all(info, ["fp16"], tmp_path / "run")
    assert not errors
    assert variants.kept_fp32(made["fp16"]) == [info.proto.graph.node[0].name]
    feeds = {"obs": np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)}
    assert 0 < np.abs(_outputs(made["fp16"], feeds) - _outputs(made["fp32"], feeds)).max() < 1e-2


@pytest.mark.coreml_env  # torch lives in the Core ML converter's environment
def test_an_fp16_variant_keeps_no_shape_the_converter_copied_from_torchs_guess(tmp_path, monkeypatch):
    """torch declares the flag policy's action [batch, Whereaction_dim_1]; the converter copies that guess onto the
    Cast it inserts before the output (and adds its own unk__ dims), and tract, which takes every declared shape as
    a fact, refused the variant ("Impossible to unify Sym(Whereaction_dim_1) with Val(1)") though the fp32 loads."""
    import tract

    python = isolated_env.env_python(coreml_conversion.ENV_NAME, coreml_conversion.REQUIREMENTS)
    if python is None:
        pytest.skip(coreml_conversion.environment_missing())
    exported = cached_policies("torch-where-flag", TORCH_WHERE_FLAG_EXPORT, python,
                               torch_script_exports("where_flag_policy", TORCH_WHERE_FLAG_EXPORT))
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))  # the variant is made here, not found cached
    info = model_loader.load(exported / "where_flag_policy.onnx")
    assert info.proto.graph.output[0].type.tensor_type.shape.dim[1].dim_param == "Whereaction_dim_1"
    made, errors = variants.produce_all(info, ["fp16"], tmp_path / "run")
    assert not errors
    tract.onnx().load(str(made["fp16"])).into_model().into_runnable()
    declared = {v.name for v in info.proto.graph.value_info}
    assert {v.name for v in onnx.load(str(made["fp16"])).graph.value_info} <= declared
    converted = tmp_path / "converted.onnx"
    onnx.save(float16.convert_float_to_float16(info.proto, keep_io_types=True), str(converted))
    for flag in (True, False):
        feeds = {"obs": np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32), "deterministic": np.array(flag)}
        np.testing.assert_array_equal(_outputs(made["fp16"], feeds), _outputs(converted, feeds))


def test_a_cell_that_ran_a_fixed_batch_copy_ships_as_that_fix_not_as_the_export():
    note = rules.workaround_note("a fixed batch of 1", "input tensor[0] check failed: expected shape '[,17]' but got [1,17]",
                                   ["cells/ort-web-webgl-fp32/fixed-batch-1.onnx"])
    cell = schema.Cell(host="h", target="ort-web-webgl", variant="fp32", verdict="PASS",
                       artifact=schema.ArtifactInfo(size_bytes=100, conversion_s=0, notes=["converted by x", note]))
    chosen = decide.decide_target("h", "ort-web-webgl", [cell], [], "latency").chosen
    assert (chosen.fix, chosen.prepared_onnx) == ("a fixed batch of 1", "cells/ort-web-webgl-fp32/fixed-batch-1.onnx")
    assert decide.shipped_as(chosen, "policy.onnx") == "policy.onnx fp32 after a fixed batch of 1 -> cells/ort-web-webgl-fp32/fixed-batch-1.onnx"
    assert rules.verdict(cell, rules.Context()) == ("PASS", [note])  # the reason the cell shows beside its PASS


def test_a_fixed_batch_copy_per_batch_size_ships_as_the_folder_holding_them():
    """'after a fixed batch of 1, 2 and 64 -> cells/…/fixed-batch-1.onnx' named the batch-1 copy as what ships."""
    saved = [f"cells/ort-web-webgl-fp32/fixed-batch-{n}.onnx" for n in (1, 2, 64)]
    note = rules.workaround_note("a fixed batch of 1, 2 and 64", "input tensor[0] check failed", saved)
    assert rules.workaround(["converted by x", note]) == ("a fixed batch of 1, 2 and 64", "cells/ort-web-webgl-fp32/")
