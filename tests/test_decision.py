"""Decide by measurement: candidates, budgets and the settings grid, end to end on real onnxruntime."""

from __future__ import annotations

import csv
import json

import onnx
import pytest
from conftest import load_results, run_cli
from decision_policies import student, teacher

from matrix.decide import decide
from matrix import results as schema
from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.slow]  # CLI runs in subprocesses

# 300 timed calls: of 30, the p99 is the slowest call, and one preemption on a busy machine (the student's 625 us
# against its p50 of 9 us) made it "a tail more than 3x worse" than the teacher's, which then shipped.
FAST = ("--iters", "300", "--warmup", "5", "--precisions", "fp32")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    paths = {"teacher": folder / "teacher.onnx", "student": folder / "student.onnx"}
    onnx.save(teacher(), str(paths["teacher"]))
    onnx.save(student(), str(paths["student"]))
    return paths


@pytest.fixture(scope="module")
def distilled_run(models, tmp_path_factory):
    """Teacher and student on ort-cpu at batch 256, with a drift tolerance the student meets and a loose latency budget."""
    out = tmp_path_factory.mktemp("distilled")
    done = run_cli("run", models["teacher"], "--candidate", models["student"], "--targets", "ort-cpu", *FAST,
                   "--batch-sizes", "256", "--tolerance", "ort-cpu:fp32=2.0", "--budget", "ort-cpu=p50:100ms", "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    return out, done


def _by_model(results) -> dict:
    return {cell.candidate or "teacher.onnx": cell for cell in results.cells}


def test_the_student_is_shipped_when_it_meets_budget_and_quality(distilled_run):
    out, done = distilled_run
    results = schema.load(out / "results.json")
    cells = _by_model(results)
    assert set(cells) == {"teacher.onnx", "student.onnx"}
    assert 1e-3 < cells["student.onnx"].max_drift < 1.0  # a student differs from its teacher, within the tolerance
    assert cells["student.onnx"].latency[0].p50_us < cells["teacher.onnx"].latency[0].p50_us  # 30x fewer FLOPs
    (decision,) = results.decision
    assert decision.target == "ort-cpu" and decision.budgets == ["p50 ≤ 100 ms"]
    assert (decision.chosen.candidate, decision.runner_up.candidate) == ("student.onnx", "")
    assert decision.chosen.p50_us == cells["student.onnx"].latency[0].p50_us
    assert "decision ort-cpu: ship student.onnx fp32" in done.stderr and "runner-up teacher.onnx fp32" in done.stderr
    printed = json.loads(done.stdout)  # --json: the same decision, machine-readable
    assert printed["decision"][0]["chosen"]["candidate"] == "student.onnx" and printed["counts"]["PASS"] == 2
    assert printed["decision"][0]["runner_up"]["lost"] and "synthetic" in printed["observations"]
    assert results.grid["configurations"] == 2 and results.grid["candidates"] == ["student.onnx"]
    assert "grid: 2 configurations" in done.stderr
    html = (out / "index.html").read_text()
    assert html.index('id="decision"') < html.index('id="verdicts"')  # the answer comes first
    ship_table = html[html.index('id="ship-table"'):html.index("</table>", html.index('id="ship-table"'))]
    assert "<b>student.onnx fp32</b>" in ship_table and "behaviour not measured" in html
    assert html.count('class="point"') == 2 and 'id="configurations-table"' in html


def test_a_latency_budget_between_the_two_ships_the_student_and_one_below_both_names_the_closest(distilled_run):
    out, _ = distilled_run
    results = schema.load(out / "results.json")
    cells = _by_model(results)
    fast, slow = cells["student.onnx"].latency[0].p50_us, cells["teacher.onnx"].latency[0].p50_us
    between = decide.Budget("ort-cpu", "p50", (fast * slow) ** 0.5)
    decision = decide.decide_target("h", "ort-cpu", results.cells, [between], "accuracy")
    assert decision.chosen.candidate == "student.onnx" and decision.runner_up is None  # the teacher misses the budget
    below = decide.Budget("ort-cpu", "p50", fast / 2)
    decision = decide.decide_target("h", "ort-cpu", results.cells, [below], "latency")
    assert decision.chosen is None and decision.closest.candidate == "student.onnx"
    assert decision.closest.misses[0].startswith("p50 ≤")


def test_the_teacher_is_shipped_when_the_student_misses_quality_and_nothing_meeting_the_budget_is_said(models, tmp_path, policy_matrix):
    done = policy_matrix(["run", models["teacher"], "--candidate", models["student"], "--targets", "ort-cpu", *FAST,
                          "--batch-sizes", "256", "--budget", "ort-cpu=p50:1ns", "--out", tmp_path])
    assert done.returncode == 1, done.stderr  # the student FAILs the default fp32 tolerance against the teacher
    assert "decision ort-cpu: nothing meets the budget; closest: teacher.onnx fp32" in done.stderr
    results = schema.load(tmp_path / "results.json")
    assert _by_model(results)["student.onnx"].verdict == "FAIL"
    (decision,) = results.decision
    assert decision.chosen is None and decision.closest.candidate == "" and "p50 ≤ 0.001 µs" in decision.closest.misses[0]
    assert "nothing meets the budget; closest: teacher.onnx fp32" in (tmp_path / "index.html").read_text()
    (unbudgeted,) = decide.decide_all(results, [], "latency")
    assert unbudgeted.chosen.candidate == "" and unbudgeted.runner_up is None  # the teacher, alone in quality


@pytest.mark.parametrize("change, words", [
    ({"obs": 5}, "input 'obs' has shape [batch, 5], not [batch, 8]"),
    ({"action_name": "act"}, "outputs ['act'] instead of ['action']"),
])
def test_a_candidate_with_another_interface_is_one_clear_line_and_exit_2(models, tmp_path, change, words, policy_matrix):
    other = tmp_path / "other.onnx"
    onnx.save(student(**change), str(other))
    done = policy_matrix([models["teacher"], "--candidate", other, "--targets", "ort-cpu", "--out", tmp_path / "out"])
    assert done.returncode == 2
    assert done.lines == [f"policy-matrix: error: --candidate {other}: its interface differs from teacher.onnx's: {words}"]


def test_ort_settings_grid_reaches_the_runtime_and_shows_in_results_csv_and_report(tmp_path, policy_matrix):
    done = policy_matrix(["run", example("continuous_mlp"), "--targets", "ort-cpu", *FAST, "--batch-sizes", "1",
                          "--settings", "ort-cpu:threads=1,2", "--settings", "ort-cpu:opt=disable,all", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    assert "grid: 4 configurations" in done.stderr
    results = load_results(tmp_path)
    seen = {(c["settings"]["threads"], c["settings"]["opt"]): c["backend"]["detail"] for c in results["cells"]}
    levels = {"disable": "ORT_DISABLE_ALL", "all": "ORT_ENABLE_ALL"}
    assert seen == {(t, o): f"intra_op_num_threads={t}, graph_optimization_level={levels[o]}"
                    for t in ("1", "2") for o in ("disable", "all")}  # read back from each session
    assert results["grid"]["settings"]["ort-cpu"][0] == {"opt": "disable", "threads": "1"}
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert sorted(row["settings"] for row in rows) == ["opt=all,threads=1", "opt=all,threads=2",
                                                       "opt=disable,threads=1", "opt=disable,threads=2"]
    html = (tmp_path / "index.html").read_text()
    # each cell's label names its knobs, and the parity, latency and reasons tables show them beside the variant
    assert "ort-cpu fp32 · opt=disable,threads=2" in html and html.count("<td>fp32 · opt=all,threads=1</td>") == 3
    assert len({c["settings"]["threads"] for c in results["cells"]}) == 2


def test_settings_are_pruned_where_they_cannot_apply_and_typos_exit_2(tmp_path, policy_matrix):
    done = policy_matrix(["run", example("continuous_mlp"), "--targets", "ort-cpu,tract", *FAST, "--batch-sizes", "1",
                          "--settings", "*:opt=basic,all", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    assert "grid: 3 configurations" in done.stderr and "not run: opt on tract" in done.stderr
    cells = load_results(tmp_path)["cells"]
    assert sorted((c["target"], c["settings"].get("opt", "")) for c in cells) == [("ort-cpu", "all"), ("ort-cpu", "basic"),
                                                                                  ("tract", "")]
    for bad, words in [("ort-cpu:turbo=1", "has a knob 'turbo'; known: opt, threads"),
                       ("ort-cpu:opt=fast", "ort-cpu opt takes one of disable, basic, extended, all, not 'fast'"),
                       ("ort-cpu:threads=0", "takes a whole number >= 1"), ("threads=2", "expected TARGET:KNOB=VALUE")]:
        done = policy_matrix([example("continuous_mlp"), "--targets", "ort-cpu", "--settings", bad, "--out", tmp_path / "x"])
        assert done.returncode == 2 and words in "\n".join(done.lines), done.lines


@pytest.mark.tflite_env
def test_tflite_threads_are_a_settings_axis(tmp_path, policy_matrix):
    import targets

    if reason := targets.get("tflite").unavailable_reason():
        pytest.skip(f"tflite: {reason}")
    done = policy_matrix(["run", example("continuous_mlp"), "--targets", "tflite", *FAST, "--batch-sizes", "1",
                          "--settings", "tflite:threads=1,2", "--settings", "tflite:xnnpack=on,off", "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    cells = {(c["settings"]["threads"], c["settings"]["xnnpack"]): c for c in load_results(tmp_path)["cells"]}
    assert set(cells) == {(t, x) for t in ("1", "2") for x in ("on", "off")}
    assert all(c["verdict"] == "PASS" for c in cells.values()), {k: c["reasons"] for k, c in cells.items()}
    assert cells[("2", "off")]["backend"]["requested"] != cells[("2", "on")]["backend"]["requested"]  # XNNPACK really off
    assert "tflite · threads=2,xnnpack=off" in (tmp_path / "index.html").read_text()


@pytest.mark.parametrize("spec, words", [
    ("p50:1ms", "expected TARGET=METRIC:VALUE"), ("ort-cpu=p75:1ms", "the metric is one of p50, p99, size"),
    ("ort-cpu=size:1ms", "is not an amount with a unit"), ("tflite=p50:1ms", "matches none of the selected targets"),
])
def test_a_bad_budget_is_one_line_and_exit_2(spec, words, tmp_path, policy_matrix):
    done = policy_matrix([example("continuous_mlp"), "--targets", "ort-cpu", "--budget", spec, "--out", tmp_path])
    assert done.returncode == 2 and len(done.lines) == 1 and words in done.lines[0], done.lines[-5:]


def test_budgets_settings_and_candidates_come_from_matrix_toml(models, tmp_path, policy_matrix):
    config = tmp_path / "matrix.toml"
    config.write_text('candidate = ["student.onnx"]\nsettings = ["ort-cpu:threads=1,2"]\nbudget = ["ort-cpu=size:5kB"]\n'
                      'prefer = "size"\ntargets = "ort-cpu"\nprecisions = "fp32"\niters = 5\nwarmup = 1\nbatch-sizes = "1"\n'
                      '[tolerance]\n"ort-cpu:fp32" = 1.0\n')
    (tmp_path / "student.onnx").write_bytes(models["student"].read_bytes())
    done = policy_matrix(["run", models["teacher"], "--config", config, "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    results = schema.load(tmp_path / "out" / "results.json")
    assert len(results.cells) == 4 and results.run_options["decision"] == {"budgets": ["ort-cpu=size:5kB"], "prefer": "size"}
    (decision,) = results.decision
    assert decision.chosen.candidate == "student.onnx" and decision.chosen.size_bytes < 5000
    assert decision.runner_up.candidate == "student.onnx"  # the other thread count; the teacher is over 5 kB
    assert json.loads((tmp_path / "out" / "results.json").read_text())["decision"][0]["prefer"] == "size"


def test_with_env_a_candidate_is_judged_by_its_return_not_by_its_step_by_step_agreement(tmp_path, policy_matrix):
    import rollout_policies

    teacher_path = rollout_policies.cartpole(tmp_path / "teacher.onnx")
    gains = list(rollout_policies.CARTPOLE_GAINS)
    close = rollout_policies.cartpole(tmp_path / "close.onnx", (gains[0], gains[1] * 3, gains[2], gains[3]))
    poor = rollout_policies.cartpole(tmp_path / "poor.onnx", (0.0, 0.0, 0.0, 0.1))
    done = policy_matrix(["run", teacher_path, "--candidate", close, "--candidate", poor, "--targets", "ort-cpu", "--precisions", "fp32",
                          "--env", "CartPole-v1", "--episodes", "3", "--iters", "5", "--warmup", "1", "--batch-sizes", "1",
                          "--out", tmp_path / "out"])
    results = schema.load(tmp_path / "out" / "results.json")
    cells = {cell.candidate: cell for cell in results.cells}
    assert cells["close.onnx"].parity[0].agreement < 1.0  # it differs step by step ...
    assert cells["close.onnx"].verdict == "PASS" and cells["close.onnx"].rollout.return_delta == 0  # ... and balances as long
    assert cells["poor.onnx"].verdict == "FAIL" and cells["poor.onnx"].reasons[0].startswith("behaviour: mean return")
    (decision,) = results.decision
    assert "return tolerance" in decision.quality_bar and decision.chosen.candidate in ("", "close.onnx")
    assert {decision.chosen.candidate, decision.runner_up.candidate} == {"", "close.onnx"}, done.stderr


def test_merge_decides_again_with_the_shards_budgets(distilled_run, tmp_path, policy_matrix):
    out, _ = distilled_run
    done = policy_matrix(["merge", out, "--out", tmp_path])
    assert done.returncode == 0, done.lines
    (decision,) = schema.load(tmp_path / "results.json").decision
    assert decision.budgets == ["p50 ≤ 100 ms"] and decision.chosen.candidate == "student.onnx"
    assert "decision ort-cpu: ship student.onnx fp32" in "\n".join(done.lines)


def test_the_size_of_a_model_with_external_data_is_what_the_user_ships(tmp_path, policy_matrix):
    """The fp32 cell's size was the tool's copy (data inlined, shapes inferred: 23,527 B for files of 23,730 B). What
    ships, and what --prefer size, size budgets and the smallest-file tie compare, is the model and its data file."""
    folder = tmp_path / "exported"
    folder.mkdir()
    onnx.save(onnx.load(str(example("continuous_mlp"))), str(folder / "policy.onnx"), save_as_external_data=True,
              location="policy.onnx.data", size_threshold=0)
    shipped = (folder / "policy.onnx").stat().st_size + (folder / "policy.onnx.data").stat().st_size
    done = policy_matrix([folder / "policy.onnx", "--targets", "ort-cpu", "--precisions", "fp32,fp16", "--iters", "10",
                          "--warmup", "2", "--budget", f"ort-cpu=size:{shipped}B", "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    results = schema.load(tmp_path / "out" / "results.json")
    sizes = {cell.variant: cell.artifact.size_bytes for cell in results.cells}
    assert sizes["fp32"] == shipped
    assert sizes["fp16"] == (tmp_path / "out" / "variants" / "model" / "fp16.onnx").stat().st_size  # the tool's own file
    (decision,) = results.decision
    assert {c.variant: c.size_bytes for c in decision.configurations} == sizes
    assert not next(c for c in decision.configurations if c.variant == "fp32").misses  # exactly at the budget
