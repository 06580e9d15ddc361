"""The runtime version as an axis: target@version labels, the Versions view and compare's release line.

Pure logic on a saved real shard (ort-cpu, continuous_mlp) and on labels; no runtime is installed here.
"""

from __future__ import annotations

import pytest

from saved import FIXTURES
from matrix import results as schema
from matrix import runtime_versions
from matrix.decide.compare import compare
from matrix.errors import InputError
from matrix.results import Placement
from matrix.run.selection import select_targets

KNOWN = ["ort-cpu", "ort-node", "ort-web-wasm", "ort-web-webgl", "tflite"]


@pytest.fixture
def shard() -> schema.RunResults:
    return schema.load(FIXTURES / "shard_continuous_mlp.json")


# --- labels ------------------------------------------------------------------------------------------

def test_a_release_rides_along_with_names_and_globs():
    assert select_targets("ort-cpu@1.20.1,ort-cpu,ort-web-*@1.22.0", "", KNOWN) == [
        "ort-cpu@1.20.1", "ort-cpu", "ort-web-wasm@1.22.0", "ort-web-webgl@1.22.0"]
    assert select_targets("ort-web-*@1.22.0,ort-web-wasm", "*-webgl@1.22.0", KNOWN) == ["ort-web-wasm@1.22.0", "ort-web-wasm"]


def test_an_unknown_name_with_a_release_is_still_an_unknown_target():
    with pytest.raises(InputError, match="unknown target 'nope'"):
        select_targets("nope@1.2.3", "", KNOWN)


@pytest.mark.parametrize("label", ["ort-cpu@", "ort-cpu@1", "ort-cpu@1.20", "ort-web-wasm@^1.22.0", "ort-cpu@latest", "ort-cpu@1.2.3/..", "ort-cpu@../../x",
                                   "ort-cpu@1.2 3", "ort-cpu@1..2", f"ort-cpu@1.{'9' * 70}"])
def test_a_malformed_release_is_bad_input(label):
    import targets
    from targets.versions import BadRelease

    with pytest.raises(BadRelease, match="is not a release number"):
        targets.get(label)


@pytest.mark.parametrize("label", ["ort-cpu@1.20.1", "ort-web-wasm@1.22.0-dev.20250409-89f8206ba4", "tract@0.23.0",
                                   "onnx@1.2.3rc1", "onnx@1.2.3.post1"])
def test_release_numbers_pass_the_syntax_check(label):
    from targets.versions import check_version

    assert check_version(label) == label.partition("@")[2]


def test_a_target_without_releases_cannot_be_pinned():
    import targets
    from targets.versions import BadRelease

    with pytest.raises(BadRelease, match="coreml cannot be pinned.*ort-cpu"):
        targets.get("coreml@9.0.0")


def test_a_pinned_target_is_the_same_target_under_its_label():
    import targets

    pinned, default = targets.get("ort-cpu@1.20.1"), targets.get("ort-cpu")
    assert (pinned.name, default.name) == ("ort-cpu@1.20.1", "ort-cpu")
    assert type(pinned) is type(default) and pinned.knobs == default.knobs
    assert pinned.runtime_version() == "onnxruntime 1.20.1 (requested)"  # outside its worker only the request is known


def test_a_release_below_the_floor_is_a_skip_without_asking_the_registry():
    import targets
    from targets import versions

    reason = versions.install_problem(targets.get("ort-cpu@1.18.1"))
    assert reason.startswith("not run:") and "onnxruntime >= 1.19.0" in reason and "numpy 2" in reason


def test_a_worker_that_imported_another_release_refuses_the_cell(monkeypatch):
    """The worker's own check, run here where the project's onnxruntime is imported: never a silent default run."""
    import onnxruntime

    import targets
    from targets import versions
    from targets.base import CellSkip

    monkeypatch.setenv(versions.PINNED_ENV, "ort-cpu@1.20.1")
    with pytest.raises(CellSkip, match=f"loaded onnxruntime {onnxruntime.__version__}, not 1.20.1"):
        versions.check_loaded(targets.get("ort-cpu@1.20.1"))
    versions.check_loaded(targets.get("ort-cpu"))  # the default has nothing to check
    monkeypatch.setenv(versions.PINNED_ENV, f"ort-cpu@{onnxruntime.__version__}")
    versions.check_loaded(targets.get(f"ort-cpu@{onnxruntime.__version__}"))  # the release it asked for: runs


def test_pip_and_npm_spell_one_release_their_own_way():
    from targets.versions import NpmRelease, PipRelease

    assert PipRelease("x", "0.0.0", "").same_release("1.22.0rc1", "1.22.0-rc1")
    assert not PipRelease("x", "0.0.0", "").same_release("1.32.0", "1.20.1")
    assert not NpmRelease("x", "0.0.0", "").same_release("1.22.1", "1.22.0")


@pytest.mark.parametrize("text, release", [
    ("onnxruntime 1.20.1", "1.20.1"),
    ("onnxruntime-web 1.22.0, Chromium 156.0.8078.114", "1.22.0"),
    ("onnxruntime-node 1.30.0, node v20.20.2", "1.30.0"),
    ("onnxruntime-web 1.22.0-dev.20250409-89f8206ba4, Chromium 156.0", "1.22.0-dev.20250409-89f8206ba4"),
])
def test_the_release_is_read_from_the_runtime_version(text, release):
    assert runtime_versions.release_number(text) == release


def test_installer_words_are_the_reason_line():
    from targets.versions import _meaningful_line

    npm = ("npm error code ETARGET\nnpm error notarget No matching version found for onnxruntime-web@0.0.99.\n"
           "npm error notarget In most cases you or one of your dependencies are requesting a package version that doesn't exist.\n"
           "npm error A complete log of this run can be found in: /root/.npm/_logs/x.log\n")
    assert _meaningful_line(npm, ("npm error code",), first=True) == "npm error notarget No matching version found for onnxruntime-web@0.0.99."
    pip = ("ERROR: Could not find a version that satisfies the requirement onnxruntime==0.0.99 (from versions: 1.15.0)\n"
           "ERROR: No matching distribution found for onnxruntime==0.0.99\n")
    assert _meaningful_line(pip) == "ERROR: No matching distribution found for onnxruntime==0.0.99"


# --- compare ------------------------------------------------------------------------------------------

def test_a_regression_names_the_release_that_changed(shard):
    current = shard.model_copy(deep=True)
    cell = next(c for c in current.cells if c.variant == "fp32")
    cell.runtime_version = "onnxruntime 1.33.0"
    for stats in cell.latency:
        stats.p50_us = stats.p90_us = stats.p99_us = stats.p99_us * 3
    found = compare(shard, current)
    assert found and all(r.detail.startswith("ort-cpu 1.32.0 -> 1.33.0: batch ") for r in found)
    assert {r.kind for r in found} == {"latency"}


def test_the_same_release_adds_nothing_to_the_line(shard):
    current = shard.model_copy(deep=True)
    cell = next(c for c in current.cells if c.variant == "fp32")
    for stats in cell.latency:
        stats.p50_us = stats.p90_us = stats.p99_us = stats.p99_us * 3
    assert all(r.detail.startswith("batch ") for r in compare(shard, current))


def test_a_changed_browser_under_the_same_release_is_named_whole():
    assert runtime_versions.version_change("ort-web-wasm@1.22.0", "onnxruntime-web 1.22.0, Chromium 155.0",
                                           "onnxruntime-web 1.22.0, Chromium 156.0") == \
        "ort-web-wasm onnxruntime-web 1.22.0, Chromium 155.0 -> onnxruntime-web 1.22.0, Chromium 156.0"
    assert runtime_versions.version_change("ort-cpu", "", "onnxruntime 1.32.0") == ""


# --- the Versions view ------------------------------------------------------------------------------

def _with_release(shard: schema.RunResults, version: str, slower: float, moved_node: str | None) -> schema.RunResults:
    """The shard plus a copy of its fp32 cell as ort-cpu@VERSION: `slower` x the p50, one node moved."""
    results = shard.model_copy(deep=True)
    cell = next(c for c in results.cells if c.variant == "fp32").model_copy(deep=True)
    cell.target, cell.runtime_version = f"ort-cpu@{version}", f"onnxruntime {version}"
    for stats in cell.latency:
        stats.p50_us *= slower
    if moved_node:
        cell.placement = [Placement(node=r.node, op_type=r.op_type, where="XnnpackExecutionProvider" if r.node == moved_node else r.where,
                                    fallback=r.fallback) for r in cell.placement]
    results.cells.append(cell)
    return results


def test_each_release_is_compared_with_the_default(shard):
    node = next(c for c in shard.cells if c.variant == "fp32").placement[0].node
    rows = runtime_versions.comparisons(_with_release(shard, "1.20.1", 2.0, node))
    assert len(rows) == 1
    row = rows[0]
    assert (row.target, row.variant, row.reference.target, row.other.target) == ("ort-cpu", "fp32", "ort-cpu", "ort-cpu@1.20.1")
    assert set(row.latency_ratios) == {s.batch for s in row.reference.latency}
    assert all(ratio == pytest.approx(2.0) for ratio in row.latency_ratios.values())
    assert row.moved == [(node, "CPUExecutionProvider", "XnnpackExecutionProvider")] and row.only_in_one == 0


def test_a_run_without_pinned_releases_has_no_versions_view(shard):
    assert runtime_versions.comparisons(shard) == []


def test_the_report_shows_the_versions_section_escaped(shard):
    from matrix.report.report import render_html

    results = _with_release(shard, "1.20.1", 1.5, None)
    results.cells[-1].runtime_version = "onnxruntime 1.20.1 <script>alert(1)</script>"
    html = render_html(results)
    section = html[html.index('id="versions"'):]
    section = section[:section.index("</section>")]
    assert "ort-cpu@1.20.1" in section and "1.50×" in section
    assert "<script>alert" not in section and "&lt;script&gt;" in section
    assert 'id="versions"' not in render_html(shard)


def test_settings_of_a_target_apply_to_its_pinned_releases():
    import targets
    from matrix.run import grid

    selected = [targets.get("ort-cpu@1.20.1"), targets.get("ort-cpu"), targets.get("tract")]
    built = grid.build(grid.parse(["ort-cpu:threads=1,2"]), selected)
    assert built.for_target("ort-cpu@1.20.1") == built.for_target("ort-cpu") == [{"threads": "1"}, {"threads": "2"}]
    assert built.for_target("tract") == [{}]
    only_pinned = grid.build(grid.parse(["ort-cpu@1.20.1:opt=basic"]), selected)
    assert only_pinned.for_target("ort-cpu@1.20.1") == [{"opt": "basic"}] and only_pinned.for_target("ort-cpu") == [{}]


def test_a_skipped_release_has_no_placement_to_compare(shard):
    results = _with_release(shard, "99.0.0", 1.0, None)
    skipped = results.cells[-1]
    skipped.verdict, skipped.placement, skipped.latency, skipped.parity = "SKIP", [], [], []
    row = runtime_versions.comparisons(results)[0]
    assert not row.placement_compared and row.latency_ratios == {}
    assert runtime_versions.quality(skipped) == "–" and runtime_versions.quality(row.reference).endswith("e-07")


# --- compare pairs by runtime and release ------------------------------------------------------------

def _as(shard: schema.RunResults, label: str, runtime_version: str, slower: float = 1.0) -> schema.RunResults:
    """The shard with its fp32 cell alone, under `label`, reporting `runtime_version`, `slower` x its latency."""
    results = shard.model_copy(deep=True)
    cell = next(c for c in results.cells if c.variant == "fp32")
    cell.target, cell.runtime_version = label, runtime_version
    for stats in cell.latency:
        stats.p50_us, stats.p90_us = stats.p50_us * slower, stats.p90_us * slower
    results.cells = [cell]
    return results


def test_a_pinned_baseline_is_compared_with_a_plain_cell_of_the_same_release(shard):
    baseline = _as(shard, "ort-web-wasm@1.22.0", "onnxruntime-web 1.22.0, Chromium 156.0")
    current = _as(shard, "ort-web-wasm", "onnxruntime-web 1.22.0, Chromium 156.0", slower=3.0)
    found = compare(baseline, current)
    assert found and {r.kind for r in found} == {"latency"}
    assert all(r.target == "ort-web-wasm" and r.detail.startswith("as ort-web-wasm@1.22.0 in the baseline: batch ") for r in found)


def test_the_same_release_is_preferred_over_the_same_label(shard):
    """Baseline: the default (1.32.0) and a pinned 1.20.1; current: the new default (1.33.0) and 1.32.0 pinned."""
    baseline = _as(shard, "ort-cpu", "onnxruntime 1.32.0")
    baseline.cells += _as(shard, "ort-cpu@1.20.1", "onnxruntime 1.20.1").cells
    current = _as(shard, "ort-cpu", "onnxruntime 1.33.0")
    current.cells += _as(shard, "ort-cpu@1.32.0", "onnxruntime 1.32.0").cells
    pairs = [(old.target, new.target) for old, new in runtime_versions.paired_cells(baseline.cells, current.cells)]
    assert pairs == [("ort-cpu", "ort-cpu@1.32.0")]  # 1.32.0 with 1.32.0; 1.20.1 and 1.33.0 have no counterpart


def test_a_label_whose_release_changed_is_still_its_own_pair(shard):
    baseline, current = _as(shard, "ort-cpu", "onnxruntime 1.32.0"), _as(shard, "ort-cpu", "onnxruntime 1.33.0")
    assert [(o.runtime_version, n.runtime_version) for o, n in runtime_versions.paired_cells(baseline.cells, current.cells)] == [
        ("onnxruntime 1.32.0", "onnxruntime 1.33.0")]


# --- tolerance and budget keys name releases --------------------------------------------------------

def test_a_release_key_wins_over_its_targets_key_which_covers_every_release():
    from matrix.judge.rules import Tolerances

    tolerances = Tolerances.parse(["ort-cpu:fp32=1e-3", "ort-cpu@1.20.1:fp32=5e-2", "ort-web-wasm@1.22.0=0.1"])
    assert tolerances.get("ort-cpu@1.20.1", "fp32").atol == 5e-2
    assert tolerances.get("ort-cpu@1.21.0", "fp32").atol == 1e-3
    assert tolerances.get("ort-cpu", "fp32").atol == 1e-3
    assert tolerances.get("ort-web-wasm@1.22.0", "fp16").atol == 0.1
    assert tolerances.get("ort-web-wasm", "fp16") == Tolerances().get("ort-web-wasm", "fp16")


def test_release_keys_are_checked_then_checked_as_their_target():
    assert runtime_versions.release_key("ort-cpu@1.20.1:fp32", "--tolerance") == "ort-cpu:fp32"
    assert runtime_versions.release_key("ort-cpu@1.20.1", "--tolerance") == "ort-cpu"
    with pytest.raises(InputError, match="not a release number"):
        runtime_versions.release_key("ort-cpu@latest:fp32", "--tolerance")


def test_a_budget_on_a_target_covers_its_releases_and_one_on_a_release_only_that():
    from matrix.decide.decide import parse_budgets

    plain, pinned = parse_budgets(["ort-cpu=p50:200us", "ort-cpu@1.20.1=size:1MB"])
    assert plain.applies_to("ort-cpu") and plain.applies_to("ort-cpu@1.20.1") and not plain.applies_to("ort-node")
    assert pinned.applies_to("ort-cpu@1.20.1") and not pinned.applies_to("ort-cpu") and not pinned.applies_to("ort-cpu@1.21.0")


def test_the_versions_table_shows_each_releases_return_delta_and_the_p50_noise_band(shard):
    from matrix.judge.metrics import latency_stats
    from matrix.report.report import render_html
    from matrix.results import Rollout

    results = _with_release(shard, "1.20.1", 1.0, None)
    default, pinned = results.cells[0], results.cells[-1]
    calls = [20_000 + 37 * (i % 50) for i in range(200)]  # ns: one release's calls, then the same calls 3x slower
    default.latency = [latency_stats(1, calls)]
    pinned.latency = [latency_stats(1, [3 * c for c in calls])]
    ran = {"mode": "closed-loop", "env": "CartPole-v1", "reference_mean_return": 500.0, "reference_std_return": 0.0,
           "std_return": 0.0, "length_delta": 0.0, "action_agreement": 1.0, "steps": 1500, "step_us": 30.0}
    default.rollout = Rollout(**ran, mean_return=500.0, return_delta=0.0, return_delta_rel=0.0)
    pinned.rollout = Rollout(**ran, mean_return=487.5, return_delta=-12.5, return_delta_rel=-0.025)
    row = runtime_versions.comparisons(results)[0]
    low, high = row.latency_bands[1]
    assert 2.5 < low <= row.latency_ratios[1] <= high < 3.5
    section = render_html(results).split('id="versions"')[1].split("</section>")[0]
    assert "return Δ" in section and "+0 → -12.5" in section
    assert f"<b>{row.latency_ratios[1]:.2f}×</b>" in section and f"({low:.2f}–{high:.2f})" in section


def test_without_env_the_versions_table_has_no_return_column(shard):
    from matrix.report.report import render_html

    section = render_html(_with_release(shard, "1.20.1", 1.5, None)).split('id="versions"')[1].split("</section>")[0]
    assert "return Δ" not in section
