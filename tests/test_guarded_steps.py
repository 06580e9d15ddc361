"""The tool's own steps on the user's model (variants, preparations, float64 intermediates)
run in guarded processes: a limit ends the step, never the runner, and says why."""

from __future__ import annotations

import pytest
from assist_fixtures import sb3_pendulum_like, write

from matrix import examples, guarded, preparations, variants
from matrix import model as model_loader

MLP = model_loader.load(examples.path("continuous_mlp"))


def test_variants_made_in_the_guarded_step_are_the_in_process_ones(tmp_path):
    made, errors = variants.produce_guarded(MLP, ["fp16", "int8"], tmp_path, guarded.Limits(300, None))
    assert (made, errors) == variants.produce_all(MLP, ["fp16", "int8"])
    assert set(made) == {"fp32", "fp16", "int8"}


def test_a_variant_step_past_the_memory_cap_leaves_every_variant_unmade_with_why(tmp_path):
    made, errors = variants.produce_guarded(MLP, ["fp16", "int8"], tmp_path, guarded.Limits(300, 64 << 20))
    assert made == {} and set(errors) == {"fp32", "fp16", "int8"}
    assert all(e.startswith("making the variants did not finish: out of memory (limit 64 MiB)") for e in errors.values()), errors


def test_a_variant_step_past_the_timeout_is_stopped(tmp_path):
    made, errors = variants.produce_guarded(MLP, ["fp16"], tmp_path, guarded.Limits(0.05, None))
    assert made == {} and errors["fp16"] == "making the variants did not finish: timed out after 0.05 s (--timeout)"


@pytest.mark.parametrize("build", [sb3_pendulum_like, examples.discrete_mlp])  # the second has a host argmax
def test_preparations_made_in_the_guarded_step_are_the_in_process_ones(tmp_path, build):
    info = model_loader.load(write(build(), tmp_path, "policy"))
    expected = preparations.candidates(info.proto)
    found = preparations._guarded_candidates(info, tmp_path / "candidates", guarded.Limits(300, None))
    assert [(n, p.steps, p.fixed_batch, p.host_argmax, p.error) for n, p in found] == \
           [(n, p.steps, p.fixed_batch, p.host_argmax, p.error) for n, p in expected]
    assert [p.proto.SerializeToString(deterministic=True) for _, p in found] == \
           [p.proto.SerializeToString(deterministic=True) for _, p in expected]
