"""The tool's own steps on the user's model (variants, preparations, float64 intermediates)
run in guarded processes: a limit ends the step, never the runner, and says why."""

from __future__ import annotations

import pytest
from assist_fixtures import sb3_pendulum_like, write

from matrix.inputs import examples
from matrix.run import guarded, variants
from matrix.assist import preparations
from matrix.inputs import model as model_loader

MLP = model_loader.load(examples.path("continuous_mlp"))


def test_variants_made_in_the_guarded_steps_are_the_in_process_ones(tmp_path):
    made, errors = variants.produce_guarded(MLP, ["fp16", "int8"], tmp_path / "guarded", guarded.Limits(300, None))
    here, here_errors = variants.produce_all(MLP, ["fp16", "int8"], tmp_path / "here")
    assert errors == here_errors == {}
    assert {k: v.read_bytes() for k, v in made.items()} == {k: v.read_bytes() for k, v in here.items()}
    assert set(made) == {"fp32", "fp16", "int8"}


def test_a_variant_step_past_the_memory_cap_costs_its_variants_not_fp32(tmp_path, monkeypatch):
    # A cache of its own: the step converts under the cap instead of copying a cached variant (its interpreter
    # and imports come from the fork server already made, so copying fits in any cap). A cap below what the
    # step inherits fails its first allocations in Python's words; at 64 MiB onnxruntime's quantizer
    # can get far enough to crash on a failed allocation instead (SIGSEGV: still its variant's error only).
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))
    made, errors = variants.produce_guarded(MLP, ["fp16", "int8"], tmp_path, guarded.Limits(300, 1 << 20))
    assert set(made) == {"fp32"} and set(errors) == {"fp16", "int8"}  # fp32 is the loaded model, copied: nothing runs
    # Each names why in the words the failure left: the cap's, or the signal a failed allocation ended in.
    for error in errors.values():
        assert "out of memory (limit 1 MiB)" in error or "killed by signal 11 (SIGSEGV)" in error, errors


def test_a_variant_step_past_the_timeout_is_stopped(tmp_path, monkeypatch):
    # A cache of its own: converting takes far longer than the timeout, where a forked step copying a
    # cached variant could finish within it.
    monkeypatch.setenv("POLICY_MATRIX_CACHE", str(tmp_path / "cache"))
    made, errors = variants.produce_guarded(MLP, ["fp16"], tmp_path, guarded.Limits(0.01, None))
    assert set(made) == {"fp32"} and errors["fp16"] == "making the fp16 variant did not finish: timed out after 0.01 s (--timeout)"


@pytest.mark.parametrize("build", [sb3_pendulum_like, examples.discrete_mlp])  # the second has a host argmax
def test_preparations_made_in_the_guarded_step_are_the_in_process_ones(tmp_path, build):
    info = model_loader.load(write(build(), tmp_path, "policy"))
    expected = preparations.candidates(info.proto)
    found = preparations._guarded_candidates(info, tmp_path / "candidates", guarded.Limits(300, None))
    assert [(n, p.steps, p.fixed_batch, p.host_argmax, p.error) for n, p in found] == \
           [(n, p.steps, p.fixed_batch, p.host_argmax, p.error) for n, p in expected]
    assert [p.proto.SerializeToString(deterministic=True) for _, p in found] == \
           [p.proto.SerializeToString(deterministic=True) for _, p in expected]
