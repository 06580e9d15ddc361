"""ort-web-wasm, ort-web-webgl, ort-web-webgpu and ort-node against the real runtimes.

Everything runs for real: headless Chromium (one per test session, as in a run),
onnxruntime-web from web_harness/node_modules, and node. `make setup` (`policy-matrix setup web`) installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from conftest import load_results
from web_fixtures import softsign_mlp, softsign_only, write

from matrix.inputs import examples
from matrix.reference import reference
from matrix.inputs import model as model_loader
from matrix.run import variants as core_variants
from targets import REGISTRY
from targets.base import Artifact
from targets import chromium, web_support
from targets.chromium import HarnessPage
from targets.web_support import HarnessServer, missing_npm_package

pytestmark = [pytest.mark.browser]

WEB_TARGETS = ("ort-node", "ort-web-wasm", "ort-web-webgl", "ort-web-webgpu")
EXAMPLES = ("continuous_mlp", "discrete_mlp", "pixel_cnn")
FP32_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def artifact(path: Path, cache_dir: Path, variant: str = "fp32") -> Artifact:
    return Artifact(path=path, variant=variant, cache_dir=cache_dir, batch_axes=model_loader.load(path).batch_axes)


def observations(path: Path, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    graph_input = onnx.load(str(path)).graph.input[0]
    shape = [dim.dim_value or batch for dim in graph_input.type.tensor_type.shape.dim]
    return {graph_input.name: np.random.default_rng(seed).normal(size=shape).astype(np.float32)}


def float64_reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The matrix's ground truth: the graph evaluated in float64 by the core."""
    return reference.compute(model_loader.load(path), feeds, 0).outputs


def max_drift(outputs: dict, reference: dict) -> float:
    return max(float(np.max(np.abs(outputs[name].astype(np.float64) - reference[name]))) for name in reference)


def test_targets_are_registered_available_and_versioned():
    for name in WEB_TARGETS:
        target = REGISTRY[name]
        assert target.unavailable_reason() is None, f"{name}: {target.unavailable_reason()}"
        assert "1.30.0" in target.runtime_version()


def test_a_missing_npm_package_says_run_setup_web():
    assert "policy-matrix setup web" in missing_npm_package("onnxruntime-not-a-package")


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("name", WEB_TARGETS)
def test_examples_match_float64_reference_with_latency_and_placement(name, example, cache_dir):
    target, path = REGISTRY[name], examples.path(example)
    if name == "ort-web-webgl" and example == "discrete_mlp":  # the exported file and its fixed-batch copy alike
        with target.open(artifact(path, cache_dir), threads=1) as session:
            with pytest.raises(RuntimeError, match="^cannot resolve operator 'ArgMax' with opsets: ai.onnx v17$"):
                session.run(observations(path, 1))
        return
    session = target.open(artifact(path, cache_dir), threads=1)
    try:
        for batch in (1, 7):
            feeds = observations(path, batch)
            outputs = session.run(feeds)
            assert set(outputs) == {"action"}
            assert outputs["action"].shape[0] == batch
            assert max_drift(outputs, float64_reference(path, feeds)) < FP32_TOLERANCE
        latencies = session.time(observations(path, 1), warmup=2, iters=10)
        assert len(latencies) == 10 and all(isinstance(ns, int) and ns > 0 for ns in latencies)
        rows = session.placement()
        assert [row.node for row in rows] == [node.name for node in onnx.load(str(path)).graph.node]
        assert not any(row.fallback for row in rows)
        info = session.backend()
        assert info.matches, info
        assert info.emulated == (name in ("ort-web-webgl", "ort-web-webgpu"))  # SwiftShader on this kind of host
    finally:
        session.close()


def test_webgpu_places_softsign_on_cpu_as_fallback(tmp_path, cache_dir):
    path = write(softsign_mlp(), tmp_path, "softsign_mlp")
    session = REGISTRY["ort-web-webgpu"].open(artifact(path, cache_dir), threads=1)
    try:
        feeds = observations(path, 3)
        assert max_drift(session.run(feeds), float64_reference(path, feeds)) < FP32_TOLERANCE
        rows = {row.node: row for row in session.placement()}
        assert list(rows) == ["fc0", "soft0", "head", "squash"]  # one row per node, de-duplicated
        assert rows["soft0"].fallback and rows["soft0"].where == "CPUExecutionProvider"
        assert not any(rows[node].fallback for node in ("fc0", "head", "squash"))
        assert session.backend().matches and "no WebGPU kernel for 1 node" in session.backend().detail
    finally:
        session.close()


def test_webgpu_session_that_ran_only_on_wasm_is_a_total_fallback(tmp_path, cache_dir):
    path = write(softsign_only(), tmp_path, "softsign_only")
    session = REGISTRY["ort-web-webgpu"].open(artifact(path, cache_dir), threads=1)
    try:
        session.run(observations(path, 2))
        info = session.backend()
        assert (info.requested, info.actual) == ("webgpu", "webgpu") and "no node" in info.detail
        assert all(row.fallback for row in session.placement())
    finally:
        session.close()


def test_webgpu_without_an_adapter_fails_with_the_reason(monkeypatch, cache_dir):
    monkeypatch.setattr(chromium, "CHROMIUM_FLAGS", [f for f in chromium.CHROMIUM_FLAGS if f != "--enable-unsafe-webgpu"])
    target = REGISTRY["ort-web-webgpu"]
    path = examples.path("continuous_mlp")
    try:
        session = target.open(artifact(path, cache_dir), threads=1)
        try:
            info = session.backend()
            assert not info.matches and "adapter" in info.detail
            with pytest.raises(RuntimeError, match="adapter"):
                session.run(observations(path, 1))
        finally:
            session.close()
    finally:
        chromium.drop_page(target.bundle)  # the browser without WebGPU goes with its flags


def test_webgl_runs_fixed_batch_copies_named_with_the_exported_files_own_error(cache_dir):
    """The exported (dynamic-batch) file is tried first; WebGL's own words on it are what the cell shows."""
    path = examples.path("continuous_mlp")
    session = REGISTRY["ort-web-webgl"].open(artifact(path, cache_dir), threads=1)
    try:
        for batch in (2, 1, 64, 2):
            feeds = observations(path, batch, seed=batch)
            assert max_drift(session.run(feeds), float64_reference(path, feeds)) < FP32_TOLERANCE
        prepared = session.preparation()
    finally:
        session.close()
    assert prepared.name == "a fixed batch of 1, 2 and 64"
    assert prepared.exported_error.startswith("input tensor[0] check failed: expected shape '[,17]' but got [2,17]")
    assert sorted(prepared.files) == ["fixed-batch-1.onnx", "fixed-batch-2.onnx", "fixed-batch-64.onnx"]
    assert all(onnx.load(str(f)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == int(n[12:-5])
               for n, f in prepared.files.items())


def test_a_dynamic_batch_policys_webgl_cell_names_the_fixed_batch_preparation(tmp_path, policy_matrix):
    done = policy_matrix(["run", examples.path("continuous_mlp"), "--targets", "ort-web-webgl,ort-web-wasm", "--precisions", "fp32",
                          "--batch-sizes", "1", "--iters", "5", "--warmup", "1", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    results = load_results(tmp_path)
    webgl, wasm = results["cells"]
    assert webgl["verdict"] == "PASS" and wasm["verdict"] == "PASS" and not [r for r in wasm["reasons"] if r.startswith("workaround")]  # wasm runs the export
    reason, = [r for r in webgl["reasons"] if r.startswith("workaround")]  # beside it: the synthetic-inputs note
    assert reason.startswith("workaround: a fixed batch of 1, 2, 7 and 128 (the exported file fails: input tensor[0] "
                             "check failed: expected shape '[,17]' but got [1,17]); saved as cells/ort-web-webgl-fp32/fixed-batch-1.onnx"), reason
    saved = tmp_path / "cells" / "ort-web-webgl-fp32" / "fixed-batch-1.onnx"
    assert onnx.load(str(saved)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    decision = next(d for d in results["decision"] if d["target"] == "ort-web-webgl")
    assert decision["chosen"]["fix"] == "a fixed batch of 1, 2, 7 and 128"
    assert decision["chosen"]["prepared_onnx"] == "cells/ort-web-webgl-fp32/"  # one copy per batch size, there


@pytest.fixture(scope="module")
def variants(cache_dir) -> dict[str, Path]:
    """The core's own precision variants of continuous_mlp."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLICY_MATRIX_CACHE", str(cache_dir))
        paths, errors = core_variants.produce_all(model_loader.load(examples.path("continuous_mlp")), ["fp16", "int8"], cache_dir / "run-variants")
    assert not errors
    return paths


@pytest.mark.parametrize("name", WEB_TARGETS)
@pytest.mark.parametrize("variant", ["fp16", "int8"])
def test_reduced_precision_runs_or_fails_in_the_backends_own_words(name, variant, variants, cache_dir):
    target = REGISTRY[name]
    assert target.variant_skip_reason(variant) is None
    if name == "ort-web-webgl":  # measured: no float16 tensors, no quantized ops; said by the backend, in this run
        words = {"fp16": "unsupported data type: FLOAT16", "int8": "cannot resolve operator 'DynamicQuantizeLinear'"}[variant]
        with target.open(artifact(variants[variant], cache_dir, variant), threads=1) as session:
            with pytest.raises(RuntimeError, match=words):
                session.run(observations(variants["fp32"], 4))
        return
    session = target.open(artifact(variants[variant], cache_dir, variant), threads=1)
    if (name, variant) == ("ort-web-webgpu", "fp16") and "no shader-f16" in session.backend().detail:
        # Measured on SwiftShader: onnxruntime-web runs fp16 without shader-f16 and gets it
        # wrong. The matrix must show that drift (a FAIL), not hide it.
        try:
            feeds = observations(variants["fp32"], 4)
            assert max_drift(session.run(feeds), float64_reference(variants["fp32"], feeds)) > 2e-2
        finally:
            session.close()
        return
    try:
        feeds = observations(variants["fp32"], 4)
        tolerance = {"fp16": 1e-2, "int8": 0.3}[variant]
        assert max_drift(session.run(feeds), float64_reference(variants["fp32"], feeds)) < tolerance
        fallbacks = {row.op_type for row in session.placement() if row.fallback}
        if name == "ort-web-webgpu":  # integer kernels are missing on WebGPU and run on wasm
            assert {"DynamicQuantizeLinear", "MatMulInteger"} <= fallbacks
        else:
            assert not fallbacks
    finally:
        session.close()


def test_page_is_cross_origin_isolated_and_server_serves_only_the_harness(tmp_path):
    page = HarnessPage("ort.wasm.min.mjs")
    try:
        assert page.versions["crossOriginIsolated"] is True
    finally:
        page.close()
    (tmp_path / "secret.onnx").write_bytes(b"x")
    server = HarnessServer()
    try:
        with urllib.request.urlopen(f"{server.origin}/harness/index.html") as reply:
            assert reply.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
            assert reply.headers["Cross-Origin-Opener-Policy"] == "same-origin"
        for path in ("/harness/../../pyproject.toml", "/ort/../package.json", f"/models/{tmp_path}/secret.onnx", "/"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(f"{server.origin}{path}")
        published = server.publish(tmp_path / "secret.onnx")
        with urllib.request.urlopen(published) as reply:
            assert reply.read() == b"x"
    finally:
        server.stop()


def _own_browsers(flag: str) -> list[psutil.Process]:
    """This process's Chromium main processes launched with `flag` (their helpers are their children)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:  # a child that ended (a zombie not yet reaped, or gone) has no command line to read
            command = process.cmdline()
        except psutil.Error:
            continue
        if flag in command and not any(a.startswith("--type=") for a in command):
            found.append(process)
    return found


@pytest.fixture
def harness_copy(tmp_path, monkeypatch) -> Path:
    """A temporary copy of the harness's page, served instead of the shipped one (which stays as it is)."""
    shutil.copytree(web_support.HARNESS_DIR / "page", tmp_path / "page")
    monkeypatch.setattr(web_support, "HARNESS_DIR", tmp_path)
    return tmp_path / "page"


@pytest.mark.parametrize("broken, words", [
    ("tensors.mjs", "harness.mjs or a module it imports could not be fetched; /harness/tensors.mjs answered HTTP 404"),
    ("harness.mjs", "Uncaught Error: no harness today (/harness/harness.mjs:1)"),
    ("index.html", "/harness/index.html answered HTTP 404"),
])
def test_a_harness_that_fails_to_load_fails_its_page_at_once_in_the_pages_words(harness_copy, broken, words):
    """Before: the page waited for window.harness until Playwright's 30 s timeout, for each cell of the target, and
    said only 'Timeout 30000ms exceeded'."""
    if broken == "harness.mjs":
        (harness_copy / broken).write_text("throw new Error('no harness today');\n" + (harness_copy / broken).read_text())
    else:
        (harness_copy / broken).unlink()
    with pytest.raises(RuntimeError) as failed:
        HarnessPage("ort.wasm.min.mjs")
    assert str(failed.value) == f"the web harness did not load: {words}"


def test_an_ort_bundle_that_throws_as_it_is_imported_is_named(tmp_path, monkeypatch):
    (tmp_path / "ort.wasm.min.mjs").write_text("throw new Error('not this bundle');\n")
    monkeypatch.setattr(web_support, "ORT_WEB_DIST", tmp_path)
    with pytest.raises(RuntimeError) as failed:
        HarnessPage("ort.wasm.min.mjs")
    assert str(failed.value) == "onnxruntime-web's ort.wasm.min.mjs did not load in the page: not this bundle"


def test_a_dead_browser_costs_only_its_cells(monkeypatch, cache_dir):
    marker = "--window-size=801,601"  # tells this test's browser from the others open in this process
    monkeypatch.setattr(chromium, "CHROMIUM_FLAGS", [*chromium.CHROMIUM_FLAGS, marker])
    target, path = REGISTRY["ort-web-wasm"], examples.path("continuous_mlp")
    session = target.open(artifact(path, cache_dir), threads=1)
    try:
        session.run(observations(path, 1))
        (browser,) = _own_browsers(marker)
        assert "--remote-debugging-pipe" in browser.cmdline()  # driven over a pipe: no DevTools port to reach
        assert not any(a.startswith("--remote-debugging-port") for a in browser.cmdline())
        browser.kill()
        browser.wait(timeout=30)
        with pytest.raises(Exception):  # the cell in flight errors out instead of hanging
            session.run(observations(path, 1))
    finally:
        session.close()
    try:
        session = target.open(artifact(path, cache_dir), threads=1)  # the next cell gets a fresh browser
        feeds = observations(path, 2)
        assert max_drift(session.run(feeds), float64_reference(path, feeds)) < FP32_TOLERANCE
        session.close()
    finally:
        chromium.drop_page(target.bundle)
    assert not _own_browsers(marker)


def test_the_next_web_target_reuses_the_browser_in_a_context_of_its_own(monkeypatch):
    """A worker moving on to its next web target keeps the browser (no second launch) and closes the
    previous target's context; the last page's close ends the browser."""
    marker = "--window-size=803,603"  # tells this test's browser from the others open in this process
    monkeypatch.setattr(chromium, "CHROMIUM_FLAGS", [*chromium.CHROMIUM_FLAGS, marker])
    wasm, webgl = REGISTRY["ort-web-wasm"], REGISTRY["ort-web-webgl"]
    try:
        wasm.start_runtime(1)
        (browser,) = _own_browsers(marker)
        assert not wasm.emulated()
        wasm.stop_runtime()
        webgl.start_runtime(1)
        assert _own_browsers(marker) == [browser]
        page = chromium.shared_page(webgl.bundle)
        assert page.browser.contexts == [page.context]
    finally:
        chromium.drop_page(webgl.bundle)
    browser.wait(timeout=30)
    assert not _own_browsers(marker)


def test_a_page_is_its_browsers_only_renderer_and_playwrights_features_still_apply(monkeypatch):
    """No renderer beside the page's: the address bar's popup Chromium pre-renders for every window and a spare
    renderer held more than the page itself, and no network service process (targets/chromium.py). Chromium obeys
    only the last --disable-features and --enable-features, so ours must hold Playwright's own (an upgraded
    Playwright with a longer list fails here)."""
    marker = "--window-size=805,605"  # tells this test's browser from the others open in this process
    monkeypatch.setattr(chromium, "CHROMIUM_FLAGS", [*chromium.CHROMIUM_FLAGS, marker])
    wasm = REGISTRY["ort-web-wasm"]
    try:
        wasm.start_runtime(1)
        (browser,) = _own_browsers(marker)
        for switch, ours in (("--disable-features=", chromium.UNUSED_FEATURES), ("--enable-features=", chromium.IN_PROCESS_FEATURES)):
            lists = [a.split("=", 1)[1].split(",") for a in browser.cmdline() if a.startswith(switch)]
            assert len(lists) > 1, f"Playwright passed no {switch} of its own: read its list again"
            assert set(lists[0]) <= set(lists[-1]) and set(ours) <= set(lists[-1])
        assert not [p for p in browser.children(recursive=True) if "--utility-sub-type=network.mojom.NetworkService" in p.cmdline()]
        targets = chromium.shared_page(wasm.bundle).browser.new_browser_cdp_session().send("Target.getTargets")
        assert [t["type"] for t in targets["targetInfos"]] == ["page"], targets  # no omnibox popup pages
        deadline = time.monotonic() + 30  # a renderer that ended may be listed until its zygote reaps it
        while len(renderers := _renderers(browser)) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(renderers) == 1, [r.cmdline()[-3:] for r in renderers]
    finally:
        chromium.drop_page(wasm.bundle)


def _renderers(browser: psutil.Process) -> list[psutil.Process]:
    found = []
    for process in browser.children(recursive=True):
        try:
            if "--type=renderer" in process.cmdline():
                found.append(process)
        except psutil.Error:  # ended between the listing and the read
            continue
    return found


def test_matrix_reports_the_softsign_fallback_as_warn(tmp_path, policy_matrix):
    """End to end through the CLI: the node falls back, the cell is a WARN, and the report shows it."""
    from conftest import load_results

    path = write(softsign_mlp(), tmp_path, "softsign_mlp")
    done = policy_matrix(["run", path, "--targets", "ort-web-wasm,ort-web-webgpu", "--precisions", "fp32",
                          "--iters", "10", "--out", tmp_path / "report"])
    assert done.returncode == 0, done.stderr
    cells = {c["target"]: c for c in load_results(tmp_path / "report")["cells"]}
    assert cells["ort-web-wasm"]["verdict"] == "PASS"
    webgpu = cells["ort-web-webgpu"]
    assert webgpu["verdict"] == "WARN" and any(reason.startswith("1 node of") and reason.endswith("fell back to CPUExecutionProvider")
                                               for reason in webgpu["reasons"])
    assert [r["node"] for r in webgpu["placement"] if r["fallback"]] == ["soft0"]
    assert '<span class="fell-back" title="soft0 in ort-web-webgpu fp32' in (tmp_path / "report" / "index.html").read_text()


DRIVER_ONCE = """
import os
from targets.chromium import NODE_COMPILE_CACHE_ENV, playwright_driver
playwright = playwright_driver()
assert NODE_COMPILE_CACHE_ENV not in os.environ  # set only while the driver started
print(playwright.chromium.name)
playwright.stop()
"""


@pytest.mark.parametrize("writable", [True, False])
def test_the_playwright_driver_keeps_its_compiled_code_in_the_cache_and_runs_without_it(tmp_path, writable):
    """The driver's node writes V8's code cache under the run's cache folder, keyed by node's version, for
    the next driver to read; where that folder cannot be made (a file in its place) the driver runs uncached."""
    cache = tmp_path / "cache"
    folder = cache / "node-compile-cache"
    if not writable:
        cache.mkdir()
        folder.write_text("a file where the folder goes")
    env = {key: value for key, value in os.environ.items() if key != chromium.NODE_COMPILE_CACHE_ENV}
    child = subprocess.run([sys.executable, "-c", DRIVER_ONCE], env={**env, "POLICY_MATRIX_CACHE": str(cache)},
                           capture_output=True, text=True, timeout=120, cwd=Path(chromium.__file__).parent.parent)
    assert child.returncode == 0 and child.stdout.strip() == "chromium", child.stderr
    if writable:
        (keyed,) = folder.iterdir()
        assert keyed.name.startswith("v") and any(keyed.iterdir()), keyed  # e.g. v26.13.1-x64-310b2ce3-0/
    else:
        assert folder.read_text() == "a file where the folder goes"


@pytest.mark.skipif(not Path(chromium.DEBIAN_HEADLESS_SHELL).exists() or chromium.managed_headless_shell()
                    or chromium._may_hold_managed_chromium(),
                    reason="Debian's chromium-headless-shell is not installed, or a Playwright-managed Chromium comes first")
def test_the_headless_shell_runs_the_pages_where_installed_and_the_runtime_line_says_so(monkeypatch):
    """Chromium's headless shell before the full browser (targets/chromium.py), named as such in the report."""
    monkeypatch.delenv(chromium.BROWSER_PATH_ENV, raising=False)
    for cached in (chromium.chromium_executable, chromium.chromium_version):
        cached.cache_clear()
    try:
        assert chromium.chromium_executable() == chromium.DEBIAN_HEADLESS_SHELL
        assert "Chromium headless shell 1" in REGISTRY["ort-web-wasm"].runtime_version()
    finally:
        for cached in (chromium.chromium_executable, chromium.chromium_version):
            cached.cache_clear()
