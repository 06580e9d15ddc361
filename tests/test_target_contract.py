"""Every registered target x every bundled policy through the same contract suite.

A new target gets these tests by registering itself. A target that cannot run
here is skipped with its own reason; a known runtime limitation is listed in
EXPECTED_FAILURES with the words its FAIL reason must contain.
"""

import numpy as np
import pytest
from conftest import EXAMPLES

import targets
from matrix.run import cells, variants
from matrix.inputs import model, observations
from matrix.reference import reference
from matrix.inputs.examples import path as example
from matrix.run.orchestrate import Services
from matrix.judge.judge import Evidence, Judge
from matrix.judge.rules import DEFAULT_TOLERANCE

pytestmark = [pytest.mark.browser, pytest.mark.tflite_env, pytest.mark.coreml_env]

# (target, example, variant) -> (words the FAIL reason must contain, when the failure applies).
EXPECTED_FAILURES = {
    # WebGL: no ArgMax, no CPU fallback.
    ("ort-web-webgl", "discrete_mlp", "fp32"): ("cannot resolve operator 'ArgMax'", lambda cell: True),
    # WebGL: no float16 tensors, no quantized ops; the backend's own words, measured in the cell (onnxruntime-web 1.30).
    ("ort-web-webgl", "continuous_mlp", "fp16"): ("unsupported data type: FLOAT16", lambda cell: True),
    ("ort-web-webgl", "continuous_mlp", "int8"): ("cannot resolve operator 'DynamicQuantizeLinear'", lambda cell: True),
    # WebGPU without shader-f16 (SwiftShader): onnxruntime-web runs fp16 anyway and gets it wrong.
    ("ort-web-webgpu", "continuous_mlp", "fp16"): ("above tolerance", lambda cell: "no shader-f16" in cell.backend.detail),
    # tract 0.23 cannot type the fp16 variant's Gemm (float32 I/O with casts around fp16 weights).
    ("tract", "continuous_mlp", "fp16"): ("ToTypedTranslator", lambda cell: True),
    # ORT's CUDA EP default use_tf32=1 computes Gemm/Conv in TF32 on compute capability >= 8.0
    # (measured on an H200: 8.4e-4 / 1.4e-3); older GPUs run plain fp32 and pass.
    **{("ort-cuda-tf32", name, "fp32"): ("above tolerance", lambda cell: "use_tf32=1" in cell.backend.detail
                                         and cell.max_drift > DEFAULT_TOLERANCE["fp32"])
       for name in ("continuous_mlp", "pixel_cnn")},
}


def expected_failure(cell, example_name: str) -> str | None:
    words, applies = EXPECTED_FAILURES.get((cell.target, example_name, cell.variant), (None, None))
    return words if words and applies(cell) else None


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Per example: model, observations, reference and ONNX variants, made once."""
    ready = {}
    for name in EXAMPLES:
        info = model.load(example(name))
        feeds = observations.seeded(info, 24, 0)
        folder = tmp_path_factory.mktemp(name)
        observations.save(feeds, folder / "observations.npz")
        paths, errors = variants.produce_all(info, list(DEFAULT_TOLERANCE), folder)
        ready[name] = dict(info=info, folder=folder, ref=reference.compute(info, feeds, 0),
                           base=reference.dev_runtime(info, feeds, 0), paths=paths, errors=errors)
    return ready


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    running = Services(tmp_path_factory.mktemp("services"))
    yield running
    running.stop_all()


def run_cell(prepared, services, target, name, variant):
    ready = prepared[name]
    spec = cells.CellSpec(
        target=target.name, variant=variant, observations=str(ready["folder"] / "observations.npz"),
        onnx_variants={k: str(v) for k, v in ready["paths"].items()}, variant_errors=ready["errors"],
        batch_sizes=[1, 8], warmup=2, iters=10, batch_axes=ready["info"].batch_axes,
    )
    outcome = cells.execute(ready["folder"] / f"{target.name}-{variant}", spec, services.env_for(target), 600, lambda _: None)
    evidence = Evidence(ready["info"], ready["ref"], ready["base"])
    return Judge().cell(outcome, evidence, host="test", target=target.name, variant=variant, predicts=target.predicts)


def _skip_if_unavailable(target, variant):
    reason = target.unavailable_reason() or target.variant_skip_reason(variant)
    if reason:
        pytest.skip(f"{target.name} {variant}: {reason}")


def _skip_if_skipped(cell):
    """A target may find only when it opens that a cell cannot run on this host (CellSkip)."""
    if cell.verdict == "SKIP":
        pytest.skip(f"{cell.target} {cell.variant}: {' '.join(cell.reasons)}")


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("target", targets.REGISTRY.values(), ids=list(targets.REGISTRY))
def test_fp32_meets_the_contract(prepared, services, target, name):
    _skip_if_unavailable(target, "fp32")
    cell = run_cell(prepared, services, target, name, "fp32")
    _skip_if_skipped(cell)
    expected = expected_failure(cell, name)
    if expected:
        assert cell.verdict == "FAIL" and expected in " ".join(cell.reasons), cell.reasons
        return
    assert cell.verdict in (("PASS", "WARN") if target.predicts else ("CONVERTED",)), cell.reasons
    assert cell.artifact and cell.artifact.size_bytes > 0
    if not target.predicts:
        return
    for parity in cell.parity:
        if parity.kind == "continuous":
            assert parity.max_abs < 1e-5, parity
        else:
            assert parity.flips == 0 and parity.agreement > 0.9, parity
    assert all(check.ok is not False for check in cell.contract), cell.contract
    timed = [1] if cell.backend and cell.backend.emulated else [1, 8]  # an emulated adapter: the smallest batch only
    assert [s.batch for s in cell.latency] == timed and all(s.p50_us > 0 for s in cell.latency)
    assert cell.placement, "a predicting target must say where nodes ran"
    assert cell.backend and cell.backend.requested == cell.backend.actual


@pytest.mark.parametrize("variant", ["fp16", "int8"])
@pytest.mark.parametrize("target", targets.REGISTRY.values(), ids=list(targets.REGISTRY))
def test_lower_precisions_complete_with_a_verdict(prepared, services, target, variant):
    _skip_if_unavailable(target, variant)
    cell = run_cell(prepared, services, target, "continuous_mlp", variant)
    _skip_if_skipped(cell)
    expected = expected_failure(cell, "continuous_mlp")
    if expected:
        assert cell.verdict == "FAIL" and expected in " ".join(cell.reasons), cell.reasons
        return
    assert cell.error is None, cell.error
    assert cell.verdict in (("PASS", "WARN") if target.predicts else ("CONVERTED",)), cell.reasons
    if target.predicts:
        drift = cell.max_drift
        assert drift is not None and np.isfinite(drift) and drift > 1e-6  # lower precision shows
