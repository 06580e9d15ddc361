"""The decision's rules on fixed numbers (no runtime): budgets, --prefer, emulated adapters."""

from __future__ import annotations

import pytest

from matrix.decide import decide
from matrix.judge import rules
from matrix.report import report, report_decision
from matrix.report.report_text import md
from matrix.decide.compare import compare
from matrix.errors import InputError
from matrix.results import ArtifactInfo, Backend, Cell, FixAttempt, LatencyStats, LintResult, OutputParity, Rollout, RunResults


def _cell(variant: str, p50: float, size: int, drift: float, verdict: str = "PASS", emulated: bool = False,
          p99: float | None = None, calls: int = 200, **axes) -> Cell:
    stats = [LatencyStats(batch=1, n=calls, p50_us=p50, p90_us=p50, p99_us=p99 or 2 * p50, mean_us=p50, std_us=0, min_us=p50)]
    parity = [OutputParity(output="action", kind="continuous", max_abs=drift, mean_abs=0, p99_abs=0, max_rel=0)]
    return Cell(host="h", target="t", variant=variant, verdict=verdict, latency=stats, parity=parity,
                artifact=ArtifactInfo(size_bytes=size, conversion_s=0), backend=Backend(requested="x", actual="x", emulated=emulated),
                **axes)


CELLS = [_cell("fp32", 10, 4000, 1e-7), _cell("fp16", 10.5, 2000, 1e-3), _cell("int8", 30, 1000, 3e-2)]


@pytest.mark.parametrize("prefer, chosen, runner_up", [
    ("latency", "fp32", "fp16"),  # fp16 is as fast (within 10%): the tie goes to the simpler fp32
    ("size", "int8", "fp16"),
    ("accuracy", "fp32", "fp16"),
])
def test_prefer_orders_the_configurations_that_meet_every_budget(prefer, chosen, runner_up):
    decision = decide.decide_target("h", "t", CELLS, [], prefer)
    assert (decision.chosen.variant, decision.runner_up.variant) == (chosen, runner_up)


def test_only_the_chosen_says_why_it_won_and_every_other_row_why_it_lost():
    # --json printed each row's own ranking round as its `why`: the last row read "the only configuration that
    # qualifies" beside two others that qualified; the report shows `lost` for them, and so does the record now
    decision = decide.decide_target("h", "t", CELLS, [], "size")
    rows = [(c.variant, bool(c.why), c.lost) for c in decision.configurations]
    assert rows == [("int8", True, ""), ("fp16", False, "larger: 2 kB vs 1 kB"), ("fp32", False, "larger: 4 kB vs 2 kB")]
    assert decision.chosen.why == "smallest file of 3 that qualify"


def test_return_deltas_their_intervals_cannot_tell_apart_are_equally_close_and_the_simpler_wins():
    # measured (audit12): two tflite settings at |return delta| 0.00351 and 0.00352, both within about
    # [-0.004, +0.011], were ranked as if the first were closer; the third is clearly further
    def episodes(delta, low, high):
        return Rollout(mode="closed-loop", return_delta=delta, return_delta_low=low, return_delta_high=high)

    cells = [_cell("fp16", 10, 2000, 1e-3, rollout=episodes(0.00351, -0.0041, 0.0111)),
             _cell("fp32", 10, 4000, 1e-7, rollout=episodes(0.00352, -0.0040, 0.0110)),
             _cell("int8", 10, 1000, 3e-2, rollout=episodes(0.5, 0.3, 0.7))]
    decision = decide.decide_target("h", "t", cells, [], "accuracy", behaviour=True)
    assert [c.variant for c in decision.configurations] == ["fp32", "fp16", "int8"]
    assert decision.chosen.why == ("as close to the reference as 1 other (return deltas within each other's intervals); "
                                   "the simplest")
    assert decision.runner_up.lost == "as good on the preferred measure; the simpler configuration wins the tie"
    assert decision.configurations[2].lost == "further from the reference: |return delta| 0.5 vs |return delta| 0.00351"


@pytest.mark.parametrize("target, fast, default", [("ort-cpu", {"opt": "disable"}, {"opt": "all"}),
                                                   ("tflite", {"xnnpack": "off"}, {"xnnpack": "on"})])
def test_an_equally_fast_tie_goes_to_the_runtimes_default_setting(target, fast, default):
    # the rule says "default settings", but every configuration of a --settings grid sets the same knobs, so the
    # tie went to the faster point p50: graph optimization disabled shipped beside an equally fast opt=all
    cells = [_cell("fp32", 5.20, 4000, 1e-7, settings={"threads": "1", **fast}),
             _cell("fp32", 5.26, 4000, 1e-7, settings={"threads": "1", **default})]
    decision = decide.decide_target("h", target, cells, [], "latency")
    assert decision.chosen.settings == {"threads": "1", **default}
    assert decision.runner_up.lost == "as good on the preferred measure; the simpler configuration wins the tie"


@pytest.mark.parametrize("mode, bar", [("open-loop", "the drift tolerance"), ("closed-loop", "the paired return difference")])
def test_a_trajectory_replay_is_judged_on_drift_and_the_decision_says_so(mode, bar):
    # --trajectory replays recorded states (open loop): no returns, cells judged on drift; the decision's quality
    # bar said "the paired return difference ... within the return tolerance" because a rollout was recorded at all
    results = RunResults(tool_version="t", created="now", model={"sha256": "x"}, hosts=[], lints=[], cells=CELLS,
                         run_options={"rollout": {"mode": mode}})
    [decision] = decide.decide_all(results, [])
    assert decision.quality_bar.startswith(bar)


def test_budgets_exclude_and_nothing_meeting_them_names_the_closest_and_its_misses():
    budgets = decide.parse_budgets(["t=p50:20us,size:3kB"])
    assert [b.describe() for b in budgets] == ["p50 ≤ 20 µs", "size ≤ 3 kB"]
    decision = decide.decide_target("h", "t", CELLS, budgets, "accuracy")
    assert decision.chosen.variant == "fp16" and decision.runner_up is None
    decision = decide.decide_target("h", "t", CELLS, decide.parse_budgets(["*=p99:5us"]), "latency")
    assert decision.chosen is None and decision.closest.variant == "fp32"  # the smallest overshoot
    assert decision.closest.misses == ["p99 ≤ 5 µs: measured 20 µs"]


def test_emulated_latency_never_decides_and_never_meets_a_latency_budget():
    cells = [_cell("fp32", 5000, 4000, 1e-7, emulated=True), _cell("fp16", 9000, 2000, 1e-3, emulated=True)]
    decision = decide.decide_target("h", "t", cells, [], "latency")
    assert decision.chosen.variant == "fp32" and "emulated latency does not rank" in decision.chosen.why  # simplest
    decision = decide.decide_target("h", "t", cells, decide.parse_budgets(["t=p50:1s"]), "latency")
    assert decision.chosen is None and "emulated adapter" in decision.closest.misses[0]


def test_a_failing_cell_is_never_shipped_and_a_pass_beats_a_warn():
    cells = [_cell("fp32", 10, 4000, 1e-7, verdict="FAIL"), _cell("fp16", 10, 2000, 1e-3, verdict="WARN"),
             _cell("int8", 10, 3000, 1e-3)]
    decision = decide.decide_target("h", "t", cells, [], "size")
    assert (decision.chosen.variant, decision.runner_up.variant) == ("int8", "fp16")
    # on latency the WARN is 3x faster: the PASS wins for its verdict, and its reason does not call it tied
    cells[1] = _cell("fp16", 3, 2000, 1e-3, verdict="WARN")
    decision = decide.decide_target("h", "t", cells, [], "latency")
    assert decision.chosen.variant == "int8" and decision.runner_up.lost == "WARN, and a PASS qualifies"
    assert decision.chosen.why == "the best placed of 2 that qualify (1 more rank lower: a WARN or a graph preparation)"


@pytest.mark.parametrize("spec", ["t", "t=p50:", "t=p50:fast", "t=p50:-1ms", "t=size:1ms", "t=latency:1ms"])
def test_malformed_budgets_are_input_errors(spec):
    with pytest.raises(InputError, match="--budget"):
        decide.parse_budgets([spec])


@pytest.mark.parametrize("spec, words", [("t=p50:0us", "the limit must be above 0"),
                                         ("t=p50:1e400us", "'1e400us' is too large to be a limit"),
                                         ("t=size:0.5B", "a size limit is at least 1 B"),
                                         ("t=p50:\uff11ms", "is not an amount with a unit")])
def test_a_budget_limit_is_a_finite_amount_above_zero_and_the_refusal_says_which(spec, words):
    # a fullwidth digit (U+FF11) is a digit to a str pattern's \d and to float(): it was read as 1 ms
    with pytest.raises(InputError, match=words):
        decide.parse_budgets([spec])


def test_cells_that_differ_only_in_candidate_or_settings_do_not_collide_in_compare():
    def results(cells):
        return RunResults(tool_version="t", created="now", model={"sha256": "x"}, hosts=[], run_options={}, lints=[], cells=cells)

    before = [_cell("fp32", 10, 1, 1e-7, settings={"threads": "1"}), _cell("fp32", 10, 1, 1e-7, settings={"threads": "2"})]
    after = [_cell("fp32", 10, 1, 1e-7, settings={"threads": "1"}), _cell("fp32", 10, 1, 1e-7, verdict="FAIL", settings={"threads": "2"})]
    found = compare(results(before), results(after))
    assert [(r.kind, r.configuration) for r in found] == [("verdict", "threads=2")]


def test_a_noisy_tail_cannot_win_on_latency_and_the_loser_says_why():
    """Measured: threads=2 had the better p50 (5.88 µs) but a p99 of 53.7 µs against threads=1's 6.55 µs."""
    cells = [_cell("fp32", 5.88, 4000, 1e-7, p99=53.7, settings={"threads": "2"}),
             _cell("fp32", 6.06, 4000, 1e-7, p99=6.55, settings={"threads": "1"})]
    decision = decide.decide_target("h", "t", cells, [], "latency")
    assert decision.chosen.settings == {"threads": "1"} and decision.runner_up.settings == {"threads": "2"}
    assert decision.runner_up.lost == "p99 53.7 µs vs 6.55 µs: a tail more than 3x worse"
    # not "fastest p50 of 2": threads=2's p50 was lower, and the winner's reason must not say otherwise
    assert decision.chosen.why == "fastest p50 with a steady tail: 1 with a faster p50 had a p99 more than 3x the best"


@pytest.mark.parametrize("calls, chosen, why, lost", [
    (200, "1", "fastest p50 with a steady tail: 1 with a faster p50 had a p99 more than 3x the best",
     "p99 53.7 µs vs 6.55 µs: a tail more than 3x worse"),
    # of 30 calls the p99 lies between the two slowest: one call the machine preempted decides it
    (30, "2", "fastest p50 of 2 that qualify; tails not compared where a p99 rests on 30 timed calls, fewer than 101 (--iters)",
     "slower: p50 6.06 µs vs 5 µs"),
])
def test_a_tail_is_compared_only_where_a_p99_rests_on_more_than_the_slowest_calls(calls, chosen, why, lost):
    """Measured with --iters 30: one preempted call (625 µs against a p50 of 9 µs) set the faster student aside."""
    cells = [_cell("fp32", 5, 4000, 1e-7, p99=53.7, calls=calls, settings={"threads": "2"}),
             _cell("fp32", 6.06, 4000, 1e-7, p99=6.55, calls=calls, settings={"threads": "1"})]
    decision = decide.decide_target("h", "t", cells, [], "latency")
    assert (decision.chosen.settings["threads"], decision.chosen.why, decision.runner_up.lost) == (chosen, why, lost)


def test_equally_fast_configurations_go_to_the_simpler_one():
    """Measured on a recurrent policy: fp16 p50 7.87 µs, fp32 7.78 µs: no reason to ship fp16 for speed."""
    cells = [_cell("fp16", 7.87, 2000, 1e-3), _cell("fp32", 7.78, 4000, 1e-7),
             _cell("fp32", 7.5, 1000, 1e-3, candidate="student.onnx")]
    decision = decide.decide_target("h", "t", cells, [], "latency")
    assert (decision.chosen.variant, decision.chosen.candidate) == ("fp32", "")
    assert "as fast as 2 others" in decision.chosen.why
    assert [c.lost for c in decision.configurations[1:]] == ["as good on the preferred measure; the simpler configuration wins the tie"] * 2


def test_a_fix_that_passes_ships_when_nothing_else_does_and_ranks_after_what_needs_none():
    fix = FixAttempt(preparation="onnxsim (batch 1) + Min/Max -> Clip", verdict="PASS", drift=5.2e-7, p50_us=900, batch=1,
                     prepared_onnx="fixes/webgl/prepared.onnx")
    failing = _cell("fp32", 10, 4000, 1e-7, verdict="FAIL", reasons=["cannot resolve operator 'Min'"], fixes=[fix])
    decision = decide.decide_target("h", "t", [failing], [], "latency")
    assert decision.chosen.fix == fix.preparation and decision.chosen.prepared_onnx == fix.prepared_onnx
    assert decide.headline(decision, "pendulum.onnx").startswith(
        "ship pendulum.onnx fp32 after onnxsim (batch 1) + Min/Max -> Clip -> fixes/webgl/prepared.onnx")
    passing = _cell("fp16", 2000, 2000, 1e-3)
    decision = decide.decide_target("h", "t", [failing, passing], [], "latency")
    assert decision.chosen.variant == "fp16" and decision.runner_up.fix  # slower, yet needs no preparation
    assert decision.runner_up.lost == "needs a graph preparation; one that needs none qualifies"


def test_without_a_budget_nothing_says_budget_and_every_rejected_configuration_has_a_reason():
    cells = [_cell("fp32", 10, 4000, 0.5, verdict="FAIL", reasons=["action: drift 0.5 above tolerance 0.0001"]),
             _cell("int8", 10, 1000, 0.9, verdict="FAIL", reasons=["action: drift 0.9 above tolerance 0.25"])]
    decision = decide.decide_target("h", "t", cells, [], "latency")
    line = decide.headline(decision, "m.onnx")
    assert "budget" not in line and line.startswith("nothing passes; closest: m.onnx fp32") and "(try --assist)" in line
    assert all(c.misses for c in decision.configurations)
    budgets = decide.parse_budgets(["t=size:15kB"])
    fat = [_cell("fp32", 10, 21900, 1e-7), _cell("fp16", 10, 12000, 1e-3)]
    decision = decide.decide_target("h", "t", fat, budgets, "latency")
    rejected = {c.variant: c.misses for c in decision.configurations if c.misses}
    assert decision.chosen.variant == "fp16" and rejected == {"fp32": ["size ≤ 15 kB: measured 21.9 kB"]}


def test_error_lints_say_not_deployment_ready_and_discrete_policies_are_described_by_agreement():
    discrete = _cell("fp16", 10, 2000, 0)
    discrete.parity = [OutputParity(output="action", kind="discrete", max_abs=1, mean_abs=0, p99_abs=0, max_rel=0,
                                    agreement=0.992, flips=2)]
    results = RunResults(tool_version="t", created="now", model={"name": "m.onnx", "sha256": "x"}, hosts=[], run_options={},
                         lints=[LintResult(id="random-op", level="error", message="RandomNormal makes actions random")],
                         cells=[discrete])
    results.decision = decide.decide_all(results, [])
    (line,) = decide.summary_lines(results)
    assert line.startswith("decision t: not deployment-ready (random-op: RandomNormal makes actions random); best measured: ship")
    assert "agreement 99.2% (2 flips)" in line and "drift" not in line


def test_a_budget_on_a_target_where_nothing_ran_the_policy_says_so_instead_of_vanishing():
    """ort-cuda on a machine without CUDA SKIPs every cell: a budget naming it gets a line saying nothing was held to
    it, not silence. A SKIPped target no budget names stays out of the decision."""
    skipped = [_cell(variant, 10, 1000, 1e-7, verdict="SKIP") for variant in ("fp32", "fp16")]
    for cell in skipped:
        cell.target = "ort-cuda"
    coreml = _cell("fp32", 10, 1000, 1e-7, verdict="SKIP")
    coreml.target = "coreml-cpu"
    results = RunResults(tool_version="t", created="now", model={"name": "m.onnx", "sha256": "x"}, hosts=[], run_options={},
                         lints=[], cells=[_cell("fp32", 10, 1000, 1e-7), *skipped, coreml])
    results.decision = decide.decide_all(results, decide.parse_budgets(["ort-cuda=p50:1ms"]))
    assert [(d.host, d.target) for d in results.decision] == [("h", "ort-cuda"), ("h", "t")]
    assert decide.summary_lines(results)[0] == ("decision ort-cuda: nothing ran the policy on this target (every cell SKIP "
                                                "or CONVERTED): no configuration was held to p50 ≤ 1 ms")
    assert "nothing ran the policy on this target" in report._ship_table_markdown(results)[4]
    by_glob = decide.decide_all(results, decide.parse_budgets(["*=p50:1ms"]))  # asks of whatever ran, not of every target
    assert [(d.host, d.target) for d in by_glob] == [("h", "t")]


def test_a_reduced_precision_file_larger_than_its_fp32_is_flagged():
    cells = [_cell("fp32", 10, 1000, 1e-7), _cell("int8", 12, 2400, 1e-2)]
    decision = decide.decide_target("h", "t", cells, [], "size")
    int8 = next(c for c in decision.configurations if c.variant == "int8")
    assert int8.flags == ["int8 file 2.4x the size of its fp32"] and "int8 file 2.4x" in decide.evidence(int8)


def test_equally_fast_is_judged_by_the_noise_bands_when_the_calls_left_them():
    """fp16's p50 is 25% above fp32's, but both bands are wide: the difference is noise, and the simpler fp32 ships.
    With tight bands the same 25% is a real difference and the faster fp16 ships."""
    def banded(variant, p50, low, high, size):
        cell = _cell(variant, p50, size, 1e-4)
        cell.latency[0].p50_low_us, cell.latency[0].p50_high_us = low, high
        return cell

    noisy = [banded("fp32", 10.0, 7.0, 14.0, 4000), banded("fp16", 8.0, 6.0, 11.0, 2000)]
    assert decide.decide_target("h", "t", noisy, [], "latency").chosen.variant == "fp32"
    tight = [banded("fp32", 10.0, 9.9, 10.1, 4000), banded("fp16", 8.0, 7.9, 8.1, 2000)]
    decision = decide.decide_target("h", "t", tight, [], "latency")
    assert decision.chosen.variant == "fp16" and decision.runner_up.lost == "slower: p50 10 µs vs 8 µs"


def _failing_results(run_options: dict, fixes: list[FixAttempt], prefer: str = "latency") -> RunResults:
    cells = [_cell("fp32", 10, 4000, 0.5, verdict="FAIL", reasons=["cannot resolve operator 'ArgMax'"], fixes=fixes),
             _cell("fp16", 10, 2000, 0.5, verdict="FAIL", reasons=["cannot resolve operator 'ArgMax'"])]
    results = RunResults(tool_version="t", created="now", model={"name": "m.onnx", "sha256": "x"}, hosts=[],
                         run_options=run_options, lints=[], cells=cells)
    results.decision = decide.decide_all(results, [], prefer)
    return results


def test_a_merge_of_shards_that_differ_on_assist_says_per_target_what_assist_did(tmp_path):
    """A merge keeps only the options its shards share: when one shard ran --assist and the other did not, every
    target read "(try --assist)", the assisted shard's too. Each target now reads what its own shard did."""
    from matrix.decide.merge import merge
    from matrix.results import Host

    for host, assist in (("linux", True), ("mac", False)):
        shard = _failing_results({"assist": True} if assist else {}, [])
        shard.hosts = [Host(label=host, os="", arch="", cpu="", python="")]
        shard.model = {"name": "m.onnx", "sha256": "0" * 64}
        shard.cells = [cell.model_copy(update={"host": host}) for cell in shard.cells]
        shard.save(tmp_path / f"{host}.json")
    merged = merge([tmp_path / "linux.json", tmp_path / "mac.json"])
    merged.decision = decide.Request.recorded(merged.run_options).decide(merged)
    assert decide.summary_lines(merged) == [
        "decision linux t: nothing passes; closest: m.onnx fp32 (quality: FAIL (cannot resolve operator 'ArgMax')) "
        "(--assist tried no graph preparation on these cells)",
        "decision mac t: nothing passes; closest: m.onnx fp32 (quality: FAIL (cannot resolve operator 'ArgMax')) (try --assist)"]


@pytest.mark.parametrize("run_options, fixes, said", [
    ({}, [], "(try --assist)"),
    ({"assist": True}, [], "(--assist tried no graph preparation on these cells)"),
    ({"assist": True}, [FixAttempt(preparation="simplify", verdict="FAIL"), FixAttempt(preparation="argmax-cut", verdict="SKIP")],
     "(--assist found no fix: tried on fp32: simplify, argmax-cut)"),
])
def test_nothing_passes_says_what_assist_did_in_every_place_the_decision_is_shown(run_options, fixes, said):
    """'(try --assist)' showed after --assist had run and found nothing: the console line, summary.md's ship table and
    the report's ship table all read decide.headline, which now knows whether it ran and what it tried."""
    results = _failing_results(run_options, fixes)
    (line,) = decide.summary_lines(results)
    (decision,) = results.decision
    assert line.endswith(said) and ("try --assist" in line) == (not run_options)
    assert md(said) in "\n".join(report._ship_table_markdown(results))
    assert report_decision.context(results)["headline"](decision).endswith(said)


def test_nothing_passes_after_assist_says_a_candidates_cells_were_not_prepared():
    """--assist prepares the first model only: "found no fix: tried on fp32" read as if the candidate had been tried."""
    results = _failing_results({"assist": True}, [FixAttempt(preparation="simplify", verdict="FAIL")])
    results.cells.append(_cell("fp32", 5, 1000, 0.5, verdict="FAIL", candidate="student.onnx"))
    results.decision = decide.decide_all(results, [])
    (line,) = decide.summary_lines(results)
    assert line.endswith("(--assist found no fix: tried on fp32: simplify; a candidate's cells are not prepared)")


@pytest.mark.parametrize("prefer, measure", [("latency", "the fastest p50"), ("size", "the smallest file"),
                                             ("accuracy", "the closest to the reference")])
def test_summary_md_and_the_report_say_the_order_prefer_asked_for(prefer, measure):
    """summary.md's 'Order:' line spoke of p50s under --prefer size while the report named size: one sentence now."""
    results = _failing_results({}, [], prefer)
    results.cells[1].verdict = "PASS"
    results.decision = decide.decide_all(results, [], prefer)
    order = decide.order_line(results.decision[0])
    assert f"by {prefer} (--prefer): " in order and measure in order
    assert ("fastest p50" in order) == (prefer == "latency") and "ties go to the simpler configuration" in order
    assert f"{md(order)}." in report._ship_table_markdown(results)
    assert report_decision.context(results)["order_line"](results.decision[0]) == order


def test_under_env_a_fix_says_it_was_judged_on_drift():
    """--assist drives no episodes for a fix: with --env its row and the quality bar say what it was judged on,
    since the bar otherwise names the paired return."""
    fix = FixAttempt(preparation="simplify", verdict="PASS", drift=1e-7, p50_us=900, batch=1, prepared_onnx="fixes/p.onnx")
    failing = _cell("fp32", 10, 4000, 0.5, verdict="FAIL", reasons=["cannot resolve operator 'Min'"], fixes=[fix])
    decision = decide.decide_target("h", "t", [failing], [], "latency", behaviour=True, assisted=True)
    assert decision.chosen.flags == [rules.FIX_JUDGED_ON] and rules.FIX_JUDGED_ON in decide.headline(decision, "m.onnx")
    assert decision.quality_bar.endswith(f"a fix from --assist is {rules.FIX_JUDGED_ON}")
    plain = decide.decide_target("h", "t", [failing], [], "latency", behaviour=False, assisted=True)
    assert not plain.chosen.flags and "return" not in plain.quality_bar
