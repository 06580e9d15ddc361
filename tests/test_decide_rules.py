"""The decision's rules on fixed numbers (no runtime): budgets, --prefer, emulated adapters."""

from __future__ import annotations

import pytest

from matrix import decide
from matrix.compare import compare
from matrix.errors import InputError
from matrix.results import ArtifactInfo, Backend, Cell, LatencyStats, OutputParity, RunResults


def _cell(variant: str, p50: float, size: int, drift: float, verdict: str = "PASS", emulated: bool = False, **axes) -> Cell:
    stats = [LatencyStats(batch=1, n=10, p50_us=p50, p90_us=p50, p99_us=2 * p50, mean_us=p50, std_us=0, min_us=p50)]
    parity = [OutputParity(output="action", kind="continuous", max_abs=drift, mean_abs=0, p99_abs=0, max_rel=0)]
    return Cell(host="h", target="t", variant=variant, verdict=verdict, latency=stats, parity=parity,
                artifact=ArtifactInfo(size_bytes=size, conversion_s=0), backend=Backend(requested="x", actual="x", emulated=emulated),
                **axes)


CELLS = [_cell("fp32", 10, 4000, 1e-7), _cell("fp16", 10.5, 2000, 1e-3), _cell("int8", 30, 1000, 3e-2)]


@pytest.mark.parametrize("prefer, chosen, runner_up", [
    ("latency", "fp16", "fp32"),  # fp16 is as fast (within 10%) and smaller
    ("size", "int8", "fp16"),
    ("accuracy", "fp32", "fp16"),
])
def test_prefer_orders_the_configurations_that_meet_every_budget(prefer, chosen, runner_up):
    decision = decide.decide_target("h", "t", CELLS, [], prefer)
    assert (decision.chosen.variant, decision.runner_up.variant) == (chosen, runner_up)


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
    assert decide.decide_target("h", "t", cells, [], "latency").chosen.variant == "fp16"  # size decides
    decision = decide.decide_target("h", "t", cells, decide.parse_budgets(["t=p50:1s"]), "latency")
    assert decision.chosen is None and "emulated adapter" in decision.closest.misses[0]


def test_a_failing_cell_is_never_shipped_and_a_pass_beats_a_warn():
    cells = [_cell("fp32", 10, 4000, 1e-7, verdict="FAIL"), _cell("fp16", 10, 2000, 1e-3, verdict="WARN"),
             _cell("int8", 10, 3000, 1e-3)]
    decision = decide.decide_target("h", "t", cells, [], "size")
    assert (decision.chosen.variant, decision.runner_up.variant) == ("int8", "fp16")


@pytest.mark.parametrize("spec", ["t", "t=p50:", "t=p50:fast", "t=p50:-1ms", "t=size:1ms", "t=latency:1ms"])
def test_malformed_budgets_are_input_errors(spec):
    with pytest.raises(InputError, match="--budget"):
        decide.parse_budgets([spec])


def test_cells_that_differ_only_in_candidate_or_settings_do_not_collide_in_compare():
    def results(cells):
        return RunResults(tool_version="t", created="now", model={"sha256": "x"}, hosts=[], settings={}, lints=[], cells=cells)

    before = [_cell("fp32", 10, 1, 1e-7, settings={"threads": "1"}), _cell("fp32", 10, 1, 1e-7, settings={"threads": "2"})]
    after = [_cell("fp32", 10, 1, 1e-7, settings={"threads": "1"}), _cell("fp32", 10, 1, 1e-7, verdict="FAIL", settings={"threads": "2"})]
    found = compare(results(before), results(after))
    assert [(r.kind, r.configuration) for r in found] == [("verdict", "threads=2")]
