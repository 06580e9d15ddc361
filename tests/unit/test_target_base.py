"""What targets/base.py and targets/timing.py give every target: the timing loop, sessions that close
as context managers, and an artifact that carries what open() needs in typed fields."""

from __future__ import annotations

import sys

import pytest

import targets
from targets.base import BackendInfo, PrepareContext, Session
from targets.timing import time_calls


def test_the_timing_loop_warms_up_untimed_then_times_each_call():
    calls = []
    samples = time_calls(lambda: calls.append(len(calls)), warmup=3, iters=5)
    assert len(calls) == 8 and len(samples) == 5
    assert all(isinstance(ns, int) and ns > 0 for ns in samples)
    assert time_calls(lambda: None, warmup=0, iters=0) == []


class Recorded(Session):
    """A session that only records being closed: what the context manager must do to every target's."""

    closed = 0

    def run(self, feeds):
        raise RuntimeError("the runtime refused")

    def time(self, feeds, warmup, iters):
        return []

    def placement(self):
        return []

    def backend(self):
        return BackendInfo("cpu", "cpu")

    def close(self):
        self.closed += 1


def test_a_session_closes_when_its_block_ends_even_by_an_error():
    with Recorded() as session:
        pass
    assert session.closed == 1
    with pytest.raises(RuntimeError, match="refused"), Recorded() as failing:
        failing.run({})
    assert failing.closed == 1


@pytest.mark.parametrize("name", ["ort-cpu", "ort-node", "ort-web-webgl", "tract"])
def test_the_default_prepare_names_the_variant_and_the_cache_for_open(tmp_path, name):
    """What web targets read at open() (fp16 checks, fixed-batch copies) comes on the artifact, typed."""
    variant_file = tmp_path / "model.fp16.onnx"
    ctx = PrepareContext(onnx_variants={"fp16": variant_file}, calibration={}, batch_axes={}, workdir=tmp_path, cache_dir=tmp_path / "cache",
                         variant_seconds={"fp16": 1.5})
    artifact = targets.get(name).prepare(ctx, "fp16")
    assert (artifact.path, artifact.variant, artifact.cache_dir, artifact.conversion_s) == (variant_file, "fp16", ctx.cache_dir, 1.5)
    assert not hasattr(artifact, "extra")


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the Core ML helper really starts")
def test_core_ml_starts_no_prediction_process_where_it_cannot_predict():
    target = targets.get("coreml-cpu")
    target.start_runtime(1)
    assert target._started_helper is None

