"""The bisect's search and its measures on recorded cells (matrix/cli/release_bisect.py): which releases it visits, how few,
and what it concludes. The cells are results records as a run writes them; the real runtimes are bisected in
tests/test_bisect.py."""

from __future__ import annotations

import math

import pytest

from matrix.cli import release_bisect as bisect  # not matrix/bisect.py: that name would shadow the stdlib module
from matrix.errors import InputError
from matrix.judge.metrics import latency_stats
from matrix.results import Cell, OutputParity, Placement

RELEASES = [f"1.{minor}.0" for minor in range(10, 27)]  # 17 releases


def _cell(verdict: str = "PASS", drift: float | None = 3e-7, reasons=(), **fields) -> Cell:
    parity = [] if drift is None else [OutputParity(output="action", kind="continuous", max_abs=drift, mean_abs=drift,
                                                    p99_abs=drift, max_rel=drift)]
    return Cell(host="h", target="ort-cpu", variant="fp32", verdict=verdict, reasons=list(reasons), parity=parity, **fields)


def _prober(first_changed: int, before: Cell, after: Cell, skip: frozenset[str] = frozenset()):
    visited = []

    def probe(release: str) -> Cell:
        visited.append(release)
        if release in skip:
            return _cell("SKIP", None, ["pip cannot install onnxruntime here"])
        return after if RELEASES.index(release) >= first_changed else before

    return probe, visited


@pytest.mark.parametrize("first_changed", range(1, len(RELEASES)))
def test_every_change_point_is_found_within_the_log2_bound(first_changed):
    probe, visited = _prober(first_changed, _cell(), _cell("FAIL", 0.56, ["action: drift 0.56 above tolerance 1e-05"]))
    outcome = bisect.search(RELEASES, probe, bisect.MEASURES["drift"], None)
    assert outcome.first_changed.release == RELEASES[first_changed]
    assert outcome.last_same.release == RELEASES[first_changed - 1]
    assert len(visited) == len(set(visited)) <= math.ceil(math.log2(len(RELEASES))) + 1
    assert visited[0] == RELEASES[0]


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 9])
def test_no_change_is_measured_at_the_new_end_not_assumed(count):
    releases = RELEASES[:count]
    probe, visited = _prober(len(RELEASES), _cell(), _cell())
    outcome = bisect.search(releases, probe, bisect.MEASURES["verdict"], None)
    assert outcome.first_changed is None and releases[-1] in visited
    assert len(visited) <= math.ceil(math.log2(count)) + 1
    assert bisect.conclusion(outcome, bisect.MEASURES["verdict"], "onnxruntime").startswith(
        f"no change in verdict from onnxruntime {releases[0]} to {releases[-1]}")


def test_the_answer_names_the_release_and_both_neighbours_measures():
    probe, _ = _prober(5, _cell(drift=3e-7), _cell("FAIL", 0.56))
    outcome = bisect.search(RELEASES, probe, bisect.MEASURES["drift"], None)
    assert bisect.conclusion(outcome, bisect.MEASURES["drift"], "onnxruntime-web") == (
        "first changed in onnxruntime-web 1.15.0 (1.14.0: drift 3e-07 PASS; 1.15.0: drift 0.56 FAIL)")


def test_a_release_that_does_not_run_here_is_left_out_and_named():
    """The change is at 1.18.0, but 1.17.0 and 1.18.0 cannot be installed: the answer is the narrowest it can be."""
    probe, visited = _prober(8, _cell(), _cell("FAIL", None, ["open: unsupported opset"]), frozenset({"1.17.0", "1.18.0"}))
    outcome = bisect.search(RELEASES, probe, bisect.MEASURES["verdict"], None)
    assert (outcome.last_same.release, outcome.first_changed.release) == ("1.16.0", "1.19.0")
    assert {v.release for v in outcome.untestable} == {"1.17.0", "1.18.0"} <= set(visited)
    assert bisect.conclusion(outcome, bisect.MEASURES["verdict"], "onnxruntime").endswith(
        "1.17.0, 1.18.0 between them did not run here)")


def test_an_old_end_that_does_not_run_here_is_bad_input():
    probe, _ = _prober(3, _cell(), _cell(), frozenset({RELEASES[0]}))
    with pytest.raises(InputError, match="did not run here"):
        bisect.search(RELEASES, probe, bisect.MEASURES["verdict"], None)


def test_drift_changes_only_by_the_factor_and_above_float32_noise():
    changed = bisect.MEASURES["drift"].changed
    assert not changed(3e-7, 9e-7, 10.0)  # both rounding noise
    assert changed(3e-7, 0.56, 10.0) and changed(0.56, 3e-7, 10.0)
    assert not changed(0.02, 0.1, 10.0) and changed(0.02, 0.1, 2.0)
    assert changed(None, 3e-7, 10.0)  # one release could not run the policy at all


def test_p50_changes_only_beyond_its_noise_band():
    def timed(scale: float, seed: int):
        import numpy as np

        rng = np.random.default_rng(seed)
        return latency_stats(1, [int(1e3 * scale * (20 + x)) for x in rng.lognormal(1.0, 0.8, 200)])

    measure = bisect.MEASURES["p50"]
    same = _cell(latency=[timed(1.0, 1)]), _cell(latency=[timed(1.0, 2)])
    slower = _cell(latency=[timed(1.0, 1)]), _cell(latency=[timed(2.0, 3)])
    assert not measure.changed(measure.read(same[0]), measure.read(same[1]), 0.25)
    assert measure.changed(measure.read(slower[0]), measure.read(slower[1]), 0.25)


def test_placement_changes_when_a_node_moves_to_a_fallback():
    measure = bisect.MEASURES["placement"]
    on_device = [Placement(node="Round_0", op_type="Round", where="JsExecutionProvider", fallback=False)]
    fell_back = [Placement(node="Round_0", op_type="Round", where="CPUExecutionProvider", fallback=True)]
    before, after = measure.read(_cell(placement=on_device)), measure.read(_cell(placement=fell_back))
    assert measure.changed(before, after, 0.0) and not measure.changed(before, before, 0.0)
    assert measure.show(after) == "1 fallback node(s): Round_0"


@pytest.mark.parametrize("text", ["1.20.1", "1.20.1..", "..1.23.0", "1.20..1.23.0", "1.20.1..1.23.0;rm"])
def test_a_malformed_range_is_bad_input(text):
    with pytest.raises(InputError):
        bisect.parse_range(text)


def test_the_range_must_be_offered_and_ordered():
    offered = ["1.19.0", "1.20.1", "1.21.0"]
    assert bisect.releases_between(offered, "1.19.0", "1.21.0", "1.19.0") == offered
    with pytest.raises(InputError, match="not among the releases offered"):
        bisect.releases_between(offered, "1.18.0", "1.21.0", "1.19.0")
    with pytest.raises(InputError, match="OLD must be older"):
        bisect.releases_between(offered, "1.21.0", "1.19.0", "1.19.0")


def test_a_threshold_is_for_measures_with_degrees_only():
    bisect.check_threshold(bisect.MEASURES["drift"], 2.0)
    bisect.check_threshold(bisect.MEASURES["verdict"], None)
    with pytest.raises(InputError, match="takes no threshold"):
        bisect.check_threshold(bisect.MEASURES["verdict"], 0.5)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="finite number >= 0"):
            bisect.check_threshold(bisect.MEASURES["p50"], bad)


def test_the_report_lists_every_release_and_escapes_the_runtimes_words(tmp_path):
    from saved import FIXTURES

    from matrix import results as schema

    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    fp32 = next(c for c in shard.cells if c.variant == "fp32")
    passed = fp32.model_copy(update={"target": "ort-cpu@1.14.0"})
    failed = fp32.model_copy(update={"target": "ort-cpu@1.15.0", "verdict": "FAIL",
                                     "reasons": ["open: <script>alert(1)</script> | bad node \x1b[2J\u202e"]})
    runs = {"1.14.0": shard.model_copy(update={"cells": [passed]}), "1.15.0": shard.model_copy(update={"cells": [failed]})}
    probe, _ = _prober(5, passed, failed)
    outcome = bisect.search(RELEASES, probe, bisect.MEASURES["verdict"], None)
    runs.update({v.release: runs["1.15.0" if v.changed else "1.14.0"] for v in outcome.visits})
    index = bisect.write_report(outcome, runs, bisect.MEASURES["verdict"], "onnxruntime", tmp_path)
    table = (tmp_path / "bisect.md").read_text()
    assert "<script>" not in table and "&lt;script&gt;" in table and "\\| bad node" in table
    assert "\x1b" not in table and "\u202e" not in table and "\\x1b[2J\\u202e" in table  # a node's name acts on no reader
    assert all(f"| {release} |" in table for release in RELEASES)
    html = index.read_text()
    assert "ort-cpu@1.14.0" in html and "ort-cpu@1.15.0" in html and "<script>alert(1)" not in html


@pytest.mark.parametrize("skip, shown", [(frozenset(), ["1.10.0", "1.26.0"]), (frozenset(RELEASES[1:]), ["1.10.0"])])
def test_a_bisect_that_finds_no_change_writes_the_page_of_the_ends_it_measured(tmp_path, skip, shown):
    """The README lists index.html in every bisect's folder; one that found no change wrote none. It shows the
    oldest release and the newest that ran here (only the oldest, when no other release ran)."""
    from saved import FIXTURES

    from matrix import results as schema

    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    fp32 = next(c for c in shard.cells if c.variant == "fp32")
    probe, _ = _prober(len(RELEASES), fp32, fp32, skip)
    outcome = bisect.search(RELEASES, probe, bisect.MEASURES["verdict"], None)
    runs = {v.release: shard.model_copy(update={"cells": [fp32.model_copy(update={"target": f"ort-cpu@{v.release}"})]})
            for v in outcome.visits}
    index = bisect.write_report(outcome, runs, bisect.MEASURES["verdict"], "onnxruntime", tmp_path)
    assert index == tmp_path / "index.html"
    assert [cell.target for cell in schema.load(tmp_path / "results.json").cells] == [f"ort-cpu@{r}" for r in shown]
    assert all(f"ort-cpu@{release}" in index.read_text() for release in shown)
