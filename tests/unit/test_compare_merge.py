"""Regression rules and shard merging on a saved real shard (an ort-cpu run of continuous_mlp,
fp32 + fp16), changed one field at a time."""

from __future__ import annotations

import datetime as dt

import pytest

from saved import FIXTURES
from matrix import results as schema
from matrix.decide.compare import DRIFT_NOISE_FLOOR, Thresholds, compare, coverage
from matrix.errors import InputError
from matrix.decide.merge import merge
from matrix.results import Backend, LatencyStats, Placement

SHARD = FIXTURES / "shard_continuous_mlp.json"


@pytest.fixture
def shard() -> schema.RunResults:
    return schema.load(SHARD)


def _cell(results: schema.RunResults, variant: str = "fp32"):
    return next(cell for cell in results.cells if cell.variant == variant)


def _kinds(baseline, current) -> list[str]:
    return [regression.kind for regression in compare(baseline, current)]


def test_the_fixture_is_a_real_passing_shard(shard):
    assert {(c.target, c.variant, c.verdict) for c in shard.cells} == {("ort-cpu", "fp32", "PASS"), ("ort-cpu", "fp16", "PASS")}
    assert all(c.latency and c.parity for c in shard.cells)


def test_a_run_compared_with_itself_has_no_regression(shard):
    assert compare(shard, shard.model_copy(deep=True)) == []


def test_a_cell_that_passed_and_now_fails_is_a_verdict_regression(shard):
    current = shard.model_copy(deep=True)
    _cell(current).verdict, _cell(current).reasons = "FAIL", ["open: no kernel"]
    found = compare(shard, current)
    assert [(r.kind, r.variant, r.detail) for r in found] == [("verdict", "fp32", "PASS -> FAIL: open: no kernel")]
    assert str(found[0]).startswith(f"{found[0].host} ort-cpu fp32 [verdict]")


def test_a_cell_that_failed_before_is_no_new_regression(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    _cell(baseline).verdict = _cell(current).verdict = "FAIL"
    assert _kinds(baseline, current) == []


def _set_drift(results, value: float, variant: str = "fp32"):
    for parity in _cell(results, variant).parity:
        parity.max_abs = value


def test_drift_crossing_the_tolerance_is_a_regression(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    _set_drift(baseline, 4e-5)
    _set_drift(current, 2e-4)  # x5 only, but across the cell's tolerance 1e-4
    found = compare(baseline, current)
    assert [r.kind for r in found] == ["drift"] and "crossed tolerance 0.0001" in found[0].detail


def test_drift_growing_beyond_the_factor_is_a_regression_and_float32_noise_is_not(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    _set_drift(baseline, 1e-7)
    _set_drift(current, DRIFT_NOISE_FLOOR * 0.9)  # x9 ... and below the noise floor anyway
    assert _kinds(baseline, current) == []
    _set_drift(current, 5e-6)  # x50, above the floor, below the tolerance
    found = compare(baseline, current)
    assert [r.kind for r in found] == ["drift"] and "(x50)" in found[0].detail
    assert compare(baseline, current, Thresholds(drift_factor=100)) == []


def _set_latency(results, p50: float, p90: float):
    _cell(results).latency = [LatencyStats(batch=1, n=100, p50_us=p50, p90_us=p90, p99_us=p90, mean_us=p50, std_us=1, min_us=1)]


def test_latency_slower_by_the_threshold_and_beyond_the_baselines_p90_is_a_regression(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    _set_latency(baseline, p50=10.0, p90=12.0)
    _set_latency(current, p50=13.0, p90=14.0)  # +30%, above the old p90
    found = compare(baseline, current)
    assert [r.kind for r in found] == ["latency"]
    assert found[0].detail == "batch 1: p50 10.0 -> 13.0 us (+30%, beyond the baseline's p90 12.0)"


def test_latency_inside_the_baselines_own_spread_is_not_a_regression(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    _set_latency(baseline, p50=10.0, p90=20.0)  # a noisy baseline: p90 twice its p50
    _set_latency(current, p50=15.0, p90=16.0)  # +50%, but still inside the old spread
    assert _kinds(baseline, current) == []
    _set_latency(current, p50=12.0, p90=12.0)
    assert compare(baseline, current, Thresholds(latency_threshold=0.5)) == []


def test_emulated_cells_are_not_compared_on_latency(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    _set_latency(baseline, p50=10.0, p90=11.0)
    _set_latency(current, p50=100.0, p90=110.0)
    _cell(current).backend = Backend(requested="webgpu", actual="webgpu", emulated=True)
    assert _kinds(baseline, current) == []


def _on_processor(results: schema.RunResults, cpu: str) -> schema.RunResults:
    moved = results.model_copy(deep=True)
    moved.hosts[0].cpu = cpu
    return moved


def test_latency_measured_on_another_processor_is_not_compared_and_the_coverage_says_why(shard):
    """A hosted runner that lands on another CPU model tonight: every cell slower is the processor's doing. Drift and
    verdicts are still compared; latency on that host is said not compared, naming both processors."""
    baseline, current = shard, _on_processor(shard, "Slower CPU @ 1.2GHz")
    _set_latency(baseline, p50=10.0, p90=11.0)
    _set_latency(current, p50=20.0, p90=22.0)
    _set_drift(current, _cell(current).tolerance * 2)
    assert [r.kind for r in compare(baseline, current)] == ["drift"]
    covered = coverage(baseline, current)
    host = shard.hosts[0].label
    assert covered.latency_not_compared == {host: f"{shard.hosts[0].cpu} -> Slower CPU @ 1.2GHz"}
    assert not covered.whole
    assert covered.lines() == [f"latency not compared on host {host}: its processor changed ({shard.hosts[0].cpu} -> "
                               "Slower CPU @ 1.2GHz); a slower processor is not a slower runtime"]
    assert [r.kind for r in compare(baseline, _on_processor(current, shard.hosts[0].cpu))] == ["drift", "latency"]
    assert [r.kind for r in compare(baseline, _on_processor(current, ""))] == ["drift", "latency"]  # unknown: no change said


def test_nodes_that_now_fall_back_are_a_regression_named_by_node(shard):
    baseline, current = shard.model_copy(deep=True), shard.model_copy(deep=True)
    old = Placement(node="a", op_type="Round", where="CPU", fallback=True)
    _cell(baseline).placement = [old]
    _cell(current).placement = [old, Placement(node="c", op_type="Sign", where="CPU", fallback=True),
                                Placement(node="b", op_type="Mod", where="CPU", fallback=True)]
    found = compare(baseline, current)
    assert [(r.kind, r.detail) for r in found] == [("fallback", "2 nodes now fall back: b, c")]


def test_cells_in_only_one_file_are_not_regressions(shard):
    current = shard.model_copy(deep=True)
    current.cells = [c for c in current.cells if c.variant == "fp16"]
    _cell(current, "fp16").verdict = "FAIL"
    baseline = shard.model_copy(deep=True)
    baseline.cells = [c for c in baseline.cells if c.variant == "fp32"]
    assert compare(baseline, current) == []


def test_a_refusal_naming_a_label_with_a_newline_is_still_one_line(shard, tmp_path, policy_matrix):
    """--host-label takes any text: a baseline's label holding a newline split 'no host in common' over two lines."""
    current = shard.model_copy(deep=True)
    for cell in current.cells:
        cell.host = "runner\n# two"
    done = policy_matrix(["compare", "--baseline", _save(shard, tmp_path / "old"), "--current", _save(current, tmp_path / "new")])
    assert done.returncode == 2 and len(done.lines) == 1 and "the current run's runner # two" in done.lines[0], done.lines


def test_a_baseline_of_no_host_the_current_run_has_is_refused(shard):
    """Cells are matched per host: a nightly whose runner's --host-label changed paired no cell at all and said
    'no regressions', whatever had regressed."""
    current = shard.model_copy(deep=True)
    for cell in current.cells:
        cell.host, cell.verdict = "renamed-runner", "FAIL"
    with pytest.raises(InputError, match=f"no host in common: the baseline's {shard.cells[0].host}, the current run's renamed-runner"):
        compare(shard, current)


def test_a_baseline_host_missing_from_the_current_run_is_said_not_compared(shard, tmp_path, policy_matrix):
    """A nightly whose macOS shard produced nothing: the Linux cells compare, and the macOS ones were not compared,
    which 'no regressions' alone does not say."""
    both = _save(merge([_save(shard, tmp_path / "linux"), _save(_on_host(shard, "mac"), tmp_path / "mac")]), tmp_path / "merged")
    assert coverage(schema.load(both / "results.json"), shard).absent_hosts == {"mac": len(shard.cells)}
    done = policy_matrix(["compare", "--baseline", both, "--current", tmp_path / "linux"])
    assert done.returncode == 0, done.stderr
    assert done.lines == [f"not compared: host mac ({len(shard.cells)} cells in the baseline) has no cell in the current run",
                          "no regressions"]
    assert policy_matrix(["compare", "--baseline", tmp_path / "linux", "--current", tmp_path / "linux"]).lines == ["no regressions"]


def test_a_nightly_whose_macos_shard_never_came_says_so_in_its_summary_and_report(shard, tmp_path, policy_matrix):
    """The macOS runner failed and uploaded nothing: the merge of Linux alone against last night's merged results said
    'not compared: host mac' on the merge step's console only; the job summary and the report read as a full, quiet
    night with fewer cells."""
    last_night = _save(merge([_save(shard, tmp_path / "linux"), _save(_on_host(shard, "mac"), tmp_path / "mac")]), tmp_path / "last")
    done = policy_matrix(["merge", tmp_path / "linux", "--out", tmp_path / "tonight", "--baseline", last_night, "--fail-on", "never"])
    assert done.returncode == 0, done.stderr
    said = f"not compared: host mac ({len(shard.cells)} cells in the baseline) has no cell in the current run"
    assert said in done.lines
    tonight = tmp_path / "tonight"
    assert f"- {said}" in (tonight / "summary.md").read_text()
    assert f"compared with the baseline: {len(shard.cells)} cells, and not all of it" in (tonight / "summary.md").read_text()
    assert f"<li>{said}</li>" in (tonight / "index.html").read_text()
    recorded = schema.load(tonight / "results.json").baseline
    assert (recorded.compared, recorded.absent_hosts, recorded.refused) == (len(shard.cells), {"mac": len(shard.cells)}, "")


def test_cells_only_one_side_ran_are_named_not_compared_or_new(shard):
    """A target gone from tonight's shard (its setup broke) vanished from the comparison without a word."""
    fp32_only = shard.model_copy(deep=True)
    fp32_only.cells = [cell for cell in fp32_only.cells if cell.variant == "fp32"]
    host = shard.cells[0].host
    gone = coverage(shard, fp32_only)
    assert (gone.compared, gone.only_in_baseline, gone.only_in_current) == (1, [f"{host} ort-cpu fp16"], [])
    assert gone.lines() == [f"not compared: 1 cell of the baseline not in the current run: {host} ort-cpu fp16"]
    new = coverage(fp32_only, shard)
    assert new.lines() == [f"new since the baseline (nothing to compare with): 1 cell: {host} ort-cpu fp16"]
    assert coverage(shard, shard).lines() == []


def test_a_nightly_after_a_model_change_notes_the_baseline_instead_of_failing_every_night(shard, tmp_path, policy_matrix):
    """The nightly compared with the last successful nightly then. Once the policy changed, every merge exited 2 on 'compare
    runs of the same model', no nightly succeeded again, and the baseline stayed the old model's for good. With
    --baseline-mismatch note the report says why nothing was compared and the night stands on its own."""
    old_model = shard.model_copy(deep=True)
    old_model.model = {**old_model.model, "name": "policy_v1.onnx", "sha256": "f" * 64}
    baseline = _save(old_model, tmp_path / "last")
    tonight = _save(shard, tmp_path / "linux")
    refused = policy_matrix(["merge", tonight, "--out", tmp_path / "refused", "--baseline", baseline])
    assert refused.returncode == 2 and "compare runs of the same model" in refused.stderr
    done = policy_matrix(["merge", tonight, "--out", tmp_path / "noted", "--baseline", baseline, "--baseline-mismatch", "note"])
    assert done.returncode == 0, done.stderr
    recorded = schema.load(tmp_path / "noted" / "results.json").baseline
    assert recorded.compared == 0 and recorded.refused.startswith("the baseline measured 'policy_v1.onnx' (ffffffffffff)")
    summary = (tmp_path / "noted" / "summary.md").read_text()
    assert "### ⚠️ not compared with the baseline" in summary and "policy\\_v1.onnx" in summary
    assert "not compared with the baseline: the baseline measured" in done.lines[-2]


def test_runs_of_another_model_are_refused(shard):
    other = shard.model_copy(deep=True)
    other.model = {**other.model, "name": "other.onnx", "sha256": "f" * 64}
    with pytest.raises(InputError, match="compare runs of the same model"):
        compare(shard, other)


# --- merge -----------------------------------------------------------------------------------------

def _save(results: schema.RunResults, folder) -> object:
    folder.mkdir(parents=True, exist_ok=True)
    results.save(folder / "results.json")
    return folder


def _split(shard, tmp_path):
    fp32, fp16 = shard.model_copy(deep=True), shard.model_copy(deep=True)
    fp32.cells = [c for c in fp32.cells if c.variant == "fp32"]
    fp16.cells = [c for c in fp16.cells if c.variant == "fp16"]
    return _save(fp32, tmp_path / "a"), _save(fp16, tmp_path / "b")


def test_disjoint_shards_of_one_host_merge_into_one_host(shard, tmp_path):
    first, second = _split(shard, tmp_path)
    merged = merge([first, second / "results.json"])  # a folder or its results.json
    assert sorted(c.variant for c in merged.cells) == ["fp16", "fp32"]
    assert [h.label for h in merged.hosts] == [h.label for h in shard.hosts]
    assert merged.run_options["shards"] == [str(first / "results.json"), str(second / "results.json")]


def test_shards_of_other_hosts_add_their_host(shard, tmp_path):
    other = shard.model_copy(deep=True)
    for cell in other.cells:
        cell.host = "mac"
    other.hosts = [other.hosts[0].model_copy(update={"label": "mac", "os": "Darwin"})]
    merged = merge([_save(shard, tmp_path / "a"), _save(other, tmp_path / "b")])
    assert [h.label for h in merged.hosts] == [shard.hosts[0].label, "mac"]
    assert len(merged.cells) == 2 * len(shard.cells)


def test_the_merge_keeps_every_shards_lints_once(shard, tmp_path):
    """A shard that ran a --candidate carries its precision lint ('candidate NAME: computes in int8 as given'),
    and a shard from an older release lacks lints added since: the merge kept only the first shard's lints."""
    old, new = shard.model_copy(deep=True), _on_host(shard, "new")
    old.lints = [lint for lint in old.lints if lint.id != "precision"]
    candidate = schema.LintResult(id="precision", level="warn", message="candidate student.onnx: computes in int8 as given")
    new.lints.append(candidate)
    merged = merge([_save(old, tmp_path / "old"), _save(new, tmp_path / "new")])
    assert merged.lints == [*old.lints, *[lint for lint in new.lints if lint not in old.lints]]
    assert candidate in merged.lints and len(merged.lints) == len(new.lints)


def test_a_fix_file_a_shard_saved_is_named_from_the_merged_report(shard, tmp_path):
    """A shard's --assist fix is saved beside that shard's report ('fixes/HOST-TARGET-fp32/opset17.onnx'); the
    merged report, elsewhere, named the same relative path, where no file is."""
    assisted = _on_host(shard, "assisted")
    _cell(assisted).fixes = [schema.FixAttempt(preparation="opset17", verdict="PASS", prepared_onnx="fixes/c/opset17.onnx")]
    merged = merge([_save(shard, tmp_path / "shards" / "a"), _save(assisted, tmp_path / "shards" / "b")], out=tmp_path / "merged")
    fixed = next(cell for cell in merged.cells if cell.fixes)
    assert (tmp_path / "merged" / fixed.fixes[0].prepared_onnx).resolve() == tmp_path / "shards" / "b" / "fixes" / "c" / "opset17.onnx"


def test_the_files_a_shards_words_name_are_named_from_the_merged_report(shard, tmp_path):
    """The fix file was rebased but the words naming it were not: the cell's 'fix: … (prepared graph: fixes/…)'
    and WebGL's fixed-batch 'workaround: …; saved as cells/…' still named the shard's folder from the merged one."""
    from matrix.judge import rules

    assisted = _on_host(shard, "assisted")
    cell = _cell(assisted)
    cell.fixes = [schema.FixAttempt(preparation="opset17", verdict="PASS", prepared_onnx="fixes/c/opset17.onnx")]
    cell.reasons.append("fix: opset17 makes it PASS (prepared graph: fixes/c/opset17.onnx)")
    saved = rules.workaround_note("a fixed batch of 1", "the runtime's words", ["cells/w/b1.onnx", "cells/w/b2.onnx"])
    cell.artifact.notes.append(saved)
    cell.reasons.append(saved)
    merged = merge([_save(shard, tmp_path / "shards" / "a"), _save(assisted, tmp_path / "shards" / "b")], out=tmp_path / "merged")
    fixed = next(cell for cell in merged.cells if cell.fixes)
    assert "fix: opset17 makes it PASS (prepared graph: ../shards/b/fixes/c/opset17.onnx)" in fixed.reasons
    rebased = ("workaround: a fixed batch of 1 (the exported file fails: the runtime's words); saved as "
               "../shards/b/cells/w/b1.onnx, ../shards/b/cells/w/b2.onnx")
    assert rebased in fixed.reasons and fixed.artifact.notes[-1] == rebased
    assert rules.workaround(fixed.artifact.notes)[1] == "../shards/b/cells/w/"


def _on_host(shard: schema.RunResults, label: str) -> schema.RunResults:
    other = shard.model_copy(deep=True)
    for cell in other.cells:
        cell.host = label
    other.hosts = [other.hosts[0].model_copy(update={"label": label})]
    return other


def test_every_interrupted_shard_reaches_the_merged_report_naming_its_host(shard, tmp_path):
    """An interrupted shard's report holds only its finished cells. The merge kept the first shard's run as the
    merged one, so a later shard's interruption was nowhere in the report CI shows; then it named only the
    first interrupted shard, so a second host cut short read as a finished run."""
    from matrix.report.report import render_html, summary_markdown

    mac, win = _on_host(shard, "mac"), _on_host(shard, "win")
    mac.interrupted = schema.Interruption(after_cells=2, signal="SIGTERM")
    win.interrupted = schema.Interruption(after_cells=1, signal="SIGINT")
    merged = merge([_save(shard, tmp_path / "a"), _save(mac, tmp_path / "b"), _save(win, tmp_path / "c")])
    said = ["mac: interrupted (SIGTERM) after 2 cells: this report holds the finished cells only",
            "win: interrupted (SIGINT) after 1 cells: this report holds the finished cells only"]
    assert [interruption.describe() for interruption in merged.interruptions()] == said
    assert merged.interrupted.describe() == said[0]  # readers of one interruption still read one
    assert all(line in summary_markdown(merged) and line in render_html(merged) for line in said)
    assert schema.load(_save(merged, tmp_path / "m") / "results.json").interruptions() == merged.interruptions()


def test_a_shards_required_target_that_did_not_run_fails_the_merge(shard, tmp_path, policy_matrix):
    """A shard run with --require whose target SKIPped everywhere failed that shard; the merge recomputed the
    list from no --require at all, so the nightly's merge job passed (exit 0) and junit.xml said nothing."""
    unrun = _on_host(shard, "mac")
    for cell in unrun.cells:
        cell.verdict, cell.reasons = "SKIP", ["needs macOS"]
    unrun.required_not_run = ["ort-cpu"]
    not_required = _on_host(unrun, "linux")  # the same SKIPs, but this host's run did not --require ort-cpu
    not_required.required_not_run = []
    done = policy_matrix(["merge", _save(shard, tmp_path / "a"), _save(unrun, tmp_path / "b"),
                          _save(not_required, tmp_path / "c"), "--out", tmp_path / "m"])
    assert done.returncode == 1, done.lines[-3:]
    assert "required target ort-cpu did not run" in (tmp_path / "m" / "summary.md").read_text()
    junit = (tmp_path / "m" / "junit.xml").read_text()
    assert junit.count('name="ort-cpu required"') == 1 and 'classname="mac.ort-cpu" name="ort-cpu required"' in junit


def test_a_variant_the_tool_could_not_make_on_a_shard_is_named_in_the_merge_with_its_host(shard, tmp_path):
    """The tool's own failure to make a variant (its cells SKIP) is said once in the report; the merge kept the
    first shard's, so another host's 'could not make the fp16 variant' was nowhere and its SKIPs unexplained."""
    unmade = _on_host(shard, "mac")
    unmade.variant_errors = {"fp16": "onnxconverter-common: no float16"}
    merged = merge([_save(shard, tmp_path / "a"), _save(unmade, tmp_path / "b")])
    assert merged.variant_errors == {"fp16": "mac: onnxconverter-common: no float16"}


def test_options_the_shards_set_differently_are_shown_per_shard_not_as_the_first_shards(shard, tmp_path):
    """The merged report's run options were the first shard's: a macOS shard timed with 50 calls and its own
    targets read as 200 calls of ort-cpu alone, the first shard's run id as the merged run's."""
    other = _on_host(shard, "mac")
    other.run_options = {**other.run_options, "iters": 50, "targets": ["coreml"], "run_id": "0123456789ab"}
    first, second = _save(shard, tmp_path / "a"), _save(other, tmp_path / "b")
    options = merge([first, second]).run_options
    assert not {"iters", "targets", "run_id"} & set(options)
    assert options["per_shard"] == {
        str(first / "results.json"): {"created": shard.created, **{key: shard.run_options[key] for key in ("iters", "run_id", "targets")}},
        str(second / "results.json"): {"created": other.created, "iters": 50, "run_id": "0123456789ab", "targets": ["coreml"]}}
    assert options["variants"] == shard.run_options["variants"]  # what they share stays as it was


def test_a_merged_report_is_dated_by_the_merge_and_lists_each_shards_own_time(shard, tmp_path):
    """The merged report's `created` was the first shard's: a merge of last night's shards read as made when the
    first shard began, and the other shards' times were nowhere."""
    from matrix.report.report import render_html, summary_markdown

    other = _on_host(shard, "mac")
    other.created = "2026-01-02T03:04:05+00:00"
    first, second = _save(shard, tmp_path / "a"), _save(other, tmp_path / "b")
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    merged = merge([first, second])
    assert before <= dt.datetime.fromisoformat(merged.created) <= dt.datetime.now(dt.timezone.utc)
    shown = {str(first / "results.json"): shard.created, str(second / "results.json"): other.created}
    assert {path: options["created"] for path, options in merged.run_options["per_shard"].items()} == shown
    assert merged.created in summary_markdown(merged) and other.created in render_html(merged)


def test_shards_that_judged_alike_cells_at_different_tolerances_are_refused_or_noted(shard, tmp_path):
    """A release before 05637b2 judged a user's int8 model (and a --candidate) at fp32's tolerance; today's judges it
    at int8's, the precision it computes in. The merge ranked the old host's FAIL at atol 1e-4 beside the new
    host's WARN at 0.25, verdicts made by different rules, and said nothing: refused, or said in the merged report
    (its lints, each cell's notes)."""
    new = _on_host(shard, "new")
    _cell(new).tolerance, _cell(new).rtol = 0.25, 0.01  # what today's run of a user's int8 model records
    first, second = _save(shard, tmp_path / "old"), _save(new, tmp_path / "new")
    old_host = shard.hosts[0].label
    with pytest.raises(InputError, match=rf"old/results.json and .*new/results.json judged alike cells at different "
                                         rf"tolerances: ort-cpu fp32 at atol 0.0001 on {old_host} vs atol 0.25 \+ rtol "
                                         rf"0.01 on new; rerun the older shard with this release, or pass --allow-different-inputs"):
        merge([first, second])
    merged = merge([first, second], allow_different_inputs=True)
    noted = {cell.host: cell.notes for cell in merged.cells if cell.variant == "fp32"}
    assert noted == {old_host: ["judged at atol 0.0001 here; new judged this configuration at atol 0.25 + rtol 0.01"],
                     "new": [f"judged at atol 0.25 + rtol 0.01 here; {old_host} judged this configuration at atol 0.0001"]}
    assert all(not cell.notes for cell in merged.cells if cell.variant == "fp16")  # judged alike on both hosts
    from matrix.report.report import render_html

    assert all(note in render_html(merged) for notes in noted.values() for note in notes)  # each cell's reasons say it
    assert merged.lints[-1].message.endswith(f"ort-cpu fp32 at atol 0.0001 on {old_host} vs atol 0.25 + rtol 0.01 on new: "
                                             "their verdicts follow different rules")


def test_a_cell_in_two_shards_is_refused_not_overwritten(shard, tmp_path):
    first, _ = _split(shard, tmp_path)
    with pytest.raises(InputError, match="cell ort-cpu fp32 of host .* is in both"):
        merge([first, _save(shard, tmp_path / "c")])


def test_shards_of_another_model_are_refused(shard, tmp_path):
    first, second = _split(shard, tmp_path)
    other = schema.load(second / "results.json")
    other.model = {**other.model, "sha256": "0" * 64}
    with pytest.raises(InputError, match="shards must share one model"):
        merge([first, _save(other, tmp_path / "d")])


def test_merge_needs_a_shard_and_drops_old_regressions(shard, tmp_path):
    with pytest.raises(InputError, match="at least one shard"):
        merge([])
    flagged = shard.model_copy(deep=True)
    flagged.regressions = [schema.Regression(host="h", target="ort-cpu", variant="fp32", kind="drift", detail="x")]
    assert merge([_save(flagged, tmp_path / "e")]).regressions == []


def test_a_results_file_of_another_schema_version_is_an_input_error(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(SHARD.read_text().replace('"schema_version": 1', '"schema_version": 99', 1))
    with pytest.raises(InputError, match="schema version 99"):
        schema.load(path)


# --- results measured on different inputs are not compared ------------------------------------------

def _on(results: schema.RunResults, kind: str, sha: str) -> schema.RunResults:
    changed = results.model_copy(deep=True)
    changed.model.update(observation_kind=kind, observations_sha256=sha)
    return changed


def test_compare_refuses_recorded_against_synthetic_observations_naming_them(shard):
    recorded, synthetic = _on(shard, "recorded", "a" * 64), _on(shard, "synthetic", "b" * 64)
    with pytest.raises(InputError, match=r"different inputs: observations \(sha256\) aaaaaaaaaaaa… vs bbbbbbbbbbbb… \(and 1 more\)"):
        compare(recorded, synthetic)
    worse = synthetic.model_copy(deep=True)
    _cell(worse).verdict, _cell(worse).reasons = "FAIL", ["injected"]
    (line,) = compare(recorded, worse, allow_different_inputs=True)
    assert line.kind == "verdict" and "(inputs differ: observations (sha256)" in line.detail and "observation source recorded vs synthetic" in line.detail


def test_compare_refuses_other_episodes_and_judging_settings_but_not_an_older_file_without_them(shard):
    env = shard.model_copy(deep=True)
    env.run_options["rollout"] = {"mode": "closed-loop", "env": "Pendulum-v1", "episodes": 10, "seeds": "0..9"}
    fewer = env.model_copy(deep=True)
    fewer.run_options["rollout"] = {**env.run_options["rollout"], "episodes": 3, "seeds": "0..2"}
    with pytest.raises(InputError, match="episodes 10 vs 3"):
        compare(env, fewer)
    with pytest.raises(InputError, match="rollouts: none vs"):
        compare(shard, env)
    looser = shard.model_copy(deep=True)
    looser.run_options["tie_margin"] = 0.5
    with pytest.raises(InputError, match="tie_margin 0.001 vs 0.5"):
        compare(shard, looser)
    assert compare(shard, _on(shard, "synthetic", "b" * 64)) == []  # the fixture predates the hash: nothing to tell apart


def test_compare_names_the_side_input_that_made_the_observations_differ(shard):
    """Runs of one policy with --side-input deterministic=true and =false: the refusal named only the observation
    sets' sha256, the consequence; the values given come first, as the option takes them."""
    runs = []
    for value, sha in ((True, "a" * 64), (False, "b" * 64)):
        run = _on(shard, "visited", sha)
        run.run_options["rollout"] = {"mode": "closed-loop", "env": "Pendulum-v1", "episodes": 3,
                                      "side_inputs": {"deterministic": value}}
        runs.append(run)
    with pytest.raises(InputError, match=r"different inputs: side inputs deterministic=true vs deterministic=false "
                                         r"\(and 1 more\)"):
        compare(*runs)
    del runs[1].run_options["rollout"]["side_inputs"]  # a run given none
    with pytest.raises(InputError, match="side inputs deterministic=true vs none"):
        compare(*runs)


def test_compare_refuses_cells_judged_at_different_tolerances_or_says_it_on_their_lines(shard):
    """A baseline of a release before 05637b2 judged a user's int8 model at fp32's tolerance, today's run at int8's: a
    verdict that changed between them is the rule's doing, not the runtime's. Refused as merge refuses such shards,
    naming the cell and both tolerances; with --allow-different-inputs each of that cell's regression lines says it."""
    current = shard.model_copy(deep=True)
    _cell(current).tolerance, _cell(current).rtol = 0.25, 0.01  # what today's run of a user's int8 model records
    host = shard.hosts[0].label
    with pytest.raises(InputError, match=rf"the baseline and the current run judged alike cells at different tolerances: "
                                         rf"ort-cpu fp32 on {host} at atol 0.0001 in the baseline vs atol 0.25 \+ rtol "
                                         rf"0.01 now; rerun the baseline with this release, or pass --allow-different-inputs"):
        compare(shard, current)
    _cell(current).verdict, _cell(current).reasons = "FAIL", ["drift 0.3"]
    (line,) = compare(shard, current, allow_different_inputs=True)
    assert (line.variant, line.detail) == ("fp32", "PASS -> FAIL: drift 0.3 (judged at atol 0.0001 in the baseline, "
                                                    "atol 0.25 + rtol 0.01 now)")
    _cell(current).tolerance = _cell(shard).tolerance  # the baseline's cell recorded no rtol: nothing to tell apart
    assert [r.detail for r in compare(shard, current)] == ["PASS -> FAIL: drift 0.3"]


def test_merge_refuses_shards_on_different_observations(shard, tmp_path):
    first, second = _on(shard, "visited", "a" * 64), _on(shard, "visited", "c" * 64)
    second.hosts[0].label, _cell(second).host, _cell(second, "fp16").host = "other", "other", "other"
    paths = []
    for name, results in (("a.json", first), ("b.json", second)):
        results.save(tmp_path / name)
        paths.append(tmp_path / name)
    with pytest.raises(InputError, match=r"a.json and .*b.json were measured on different inputs: observations \(sha256\)"):
        merge(paths)
    assert len(merge(paths, allow_different_inputs=True).hosts) == 2


def test_the_compare_command_exits_2_with_one_line(shard, tmp_path, capsys, monkeypatch):
    from matrix.cli import cli

    _on(shard, "recorded", "a" * 64).save(tmp_path / "recorded.json")
    _on(shard, "synthetic", "b" * 64).save(tmp_path / "synthetic.json")
    monkeypatch.setattr("sys.argv", ["policy-matrix", "compare", "--baseline", str(tmp_path / "recorded.json"),
                                     "--current", str(tmp_path / "synthetic.json")])
    monkeypatch.setattr("signal.signal", lambda *args: None)  # main's SIGTERM handler is not this test process's
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("policy-matrix: error:") and "observations (sha256)" in error[0]


def test_an_unreadable_baseline_is_noted_too_or_refused_first(shard, tmp_path, policy_matrix):
    """A truncated download of last night's results: refused it fails the merge (exit 2) before anything is written,
    and with --baseline-mismatch note it is said like another model's, the night judged on its own."""
    truncated = tmp_path / "last" / "results.json"
    truncated.parent.mkdir()
    truncated.write_text(SHARD.read_text()[:2000])
    tonight = _save(shard, tmp_path / "linux")
    refused = policy_matrix(["merge", tonight, "--out", tmp_path / "refused", "--baseline", truncated])
    assert refused.returncode == 2 and "not JSON" in refused.stderr and not (tmp_path / "refused").exists()
    done = policy_matrix(["merge", tonight, "--out", tmp_path / "noted", "--baseline", truncated.parent,
                          "--baseline-mismatch", "note"])
    assert done.returncode == 0, done.stderr
    recorded = schema.load(tmp_path / "noted" / "results.json").baseline
    assert recorded.compared == 0 and recorded.refused.startswith(f"{truncated}: not JSON")


def test_cells_new_since_the_baseline_are_listed_without_the_warning(shard, tmp_path, policy_matrix):
    """A target added tonight loses nothing of the baseline: listed, not flagged as a gap in the comparison."""
    fp32_only = shard.model_copy(deep=True)
    fp32_only.cells = [cell for cell in fp32_only.cells if cell.variant == "fp32"]
    done = policy_matrix(["merge", _save(shard, tmp_path / "tonight"), "--out", tmp_path / "merged",
                          "--baseline", _save(fp32_only, tmp_path / "last")])
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "compared with the baseline: 1 cell\n\n- new since the baseline (nothing to compare with): 1 cell:" in summary
    assert "⚠️" not in summary and "Every cell of the baseline was compared." in (tmp_path / "merged" / "index.html").read_text()


def test_cells_the_baseline_measured_that_skip_now_are_named_with_why(shard, tmp_path, policy_matrix):
    """tract's wheel broken on tonight's runner: its cells SKIP ('the tract package is not installed'), SKIP has no
    verdict, drift or latency to compare, and the merge said 'no regressions' and nothing more."""
    tonight = shard.model_copy(deep=True)
    why = "the onnxruntime package is not installed: run `policy-matrix setup core`"
    skipped = _cell(tonight, "fp16")
    skipped.verdict, skipped.reasons, skipped.parity, skipped.latency = "SKIP", [why], [], []
    host = shard.cells[0].host
    assert coverage(shard, tonight).skipped_now == {f"{host} ort-cpu fp16": why}
    done = policy_matrix(["merge", _save(tonight, tmp_path / "tonight"), "--out", tmp_path / "merged",
                          "--baseline", _save(shard, tmp_path / "last")])
    assert done.returncode == 0, done.stderr
    said = f"not compared: 1 cell the baseline measured SKIP now: {host} ort-cpu fp16 ({why})"
    assert said in done.lines
    assert "### ⚠️ compared with the baseline: 2 cells, and not all of it" in (tmp_path / "merged" / "summary.md").read_text()
    assert coverage(tonight, shard).skipped_now == {}  # measured again: compared as usual


def test_a_shard_folder_of_a_run_that_never_finished_is_named_so(shard, tmp_path, policy_matrix):
    """A runner killed mid-run leaves results.jsonl (its finished cells) and no results.json: the merge said
    'results.json: no such results file', as if the folder were the wrong one."""
    killed = tmp_path / "macos"
    killed.mkdir()
    (killed / "results.jsonl").write_text(shard.cells[0].model_dump_json() + "\n")
    done = policy_matrix(["merge", _save(shard, tmp_path / "linux"), killed, "--out", tmp_path / "merged"])
    assert done.returncode == 2
    assert done.stderr.strip() == (f"policy-matrix: error: {killed}: its run did not finish (results.jsonl, no results.json): "
                                   f"`policy-matrix run MODEL --resume {killed}` with the options it ran with runs its "
                                   "missing cells, or leave it out")
