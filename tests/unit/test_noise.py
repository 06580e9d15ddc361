"""The p50 noise band and the one rule that says two latencies differ (matrix/judge/noise.py)."""

from __future__ import annotations

import numpy as np
import pytest

from matrix.judge import noise
from matrix.judge.metrics import latency_stats


def _calls(n: int, scale: float, seed: int) -> np.ndarray:
    """Per-call latencies shaped like real ones: a floor plus a long right tail (us)."""
    rng = np.random.default_rng(seed)
    return scale * (20 + rng.lognormal(1.0, 0.8, n))


def test_the_band_holds_the_median_and_narrows_with_more_calls():
    few, many = _calls(30, 1.0, 1), _calls(3000, 1.0, 1)
    low_few, high_few = noise.p50_band(few)
    low_many, high_many = noise.p50_band(many)
    assert low_few <= np.median(few) <= high_few and low_many <= np.median(many) <= high_many
    assert high_many - low_many < (high_few - low_few) / 3


def test_the_same_calls_give_the_same_band():
    calls = _calls(200, 1.0, 2)
    assert noise.p50_band(calls) == noise.p50_band(calls.copy())


def test_two_runs_of_the_same_runtime_do_not_differ_but_a_slower_one_does():
    reference = noise.p50_band(_calls(200, 1.0, 3))
    same = noise.ratio_band(reference, noise.p50_band(_calls(200, 1.0, 4)))
    slower = noise.ratio_band(reference, noise.p50_band(_calls(200, 1.5, 5)))
    faster = noise.ratio_band(reference, noise.p50_band(_calls(200, 0.6, 6)))
    assert same[0] < 1 < same[1] and not noise.differs(same)
    assert noise.differs(slower) and slower[0] > 1.3
    assert noise.differs(faster) and faster[1] < 0.7
    assert not noise.differs(slower, threshold=1.0)  # 1.5x is inside a 100% threshold


def test_a_clock_too_coarse_to_see_a_call_leaves_the_ratio_open():
    assert noise.ratio_band((0.0, 0.0), (5.0, 6.0)) == (0.0, float("inf"))
    assert not noise.differs((0.0, float("inf")))


def test_every_latency_summary_carries_its_band():
    stats = latency_stats(1, [int(x * 1e3) for x in _calls(100, 1.0, 7)])
    assert stats.p50_band is not None and stats.p50_low_us <= stats.p50_us <= stats.p50_high_us


def test_no_calls_is_refused():
    with pytest.raises(ValueError):
        noise.p50_band([])
