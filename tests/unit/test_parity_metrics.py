"""Parity metrics on hand-made arrays: every number below is worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from matrix.judge.metrics import REL_FLOOR, abs_error, latency_stats, parity


def test_continuous_drift_statistics():
    reference = np.array([[1.0, -2.0], [0.0, 4.0]], np.float32)
    actual = reference + np.array([[0.1, 0.0], [0.002, -0.4]], np.float32)
    result = parity("action", actual, reference, dev_runtime=None, margins=None, tie_margin=1e-3)
    assert result.kind == "continuous" and result.agreement is None and result.flips is None
    assert result.max_abs == pytest.approx(0.4, rel=1e-6)
    assert result.mean_abs == pytest.approx((0.1 + 0.002 + 0.4) / 4, rel=1e-5)
    # relative: 0.1/1, 0/2, 0.002/max(0, floor), 0.4/4 -> the floored zero dominates
    assert result.max_rel == pytest.approx(0.002 / REL_FLOOR, rel=1e-4)
    assert result.vs_dev_runtime_max_abs is None


def test_a_rank_0_output_is_judged_like_any_other():
    """ONNX's test_det_2d and DynamicQuantizeLinear's scale: a scalar output took the runner down with a traceback
    ("'numpy.float64' object does not support item assignment")."""
    one_ulp = 2.0**-22  # float32's step at 2
    result = parity("det", np.array(-2 + one_ulp, np.float32), np.array(-2.0), np.array(-2.0, np.float32), None, 1e-3)
    assert result.max_abs == one_ulp and result.vs_dev_runtime_max_abs == one_ulp
    assert abs_error(np.array(np.nan), np.array(np.nan)).shape == ()


def test_drift_against_the_development_runtime_is_its_own_column():
    reference = np.zeros(3, np.float32)
    dev_runtime = np.array([0.0, 0.5, 0.0], np.float32)
    result = parity("y", np.zeros(3, np.float32), reference, dev_runtime, None, 1e-3)
    assert result.max_abs == 0 and result.vs_dev_runtime_max_abs == 0.5


def test_the_same_non_finite_value_as_the_reference_is_no_error():
    reference = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert abs_error(reference.copy(), reference).tolist() == [0, 0, 0, 0]
    result = parity("y", reference.astype(np.float32), reference.astype(np.float32), None, None, 1e-3)
    assert result.max_abs == 0 and result.max_rel == 0


@pytest.mark.parametrize("actual", [[np.nan, 1.0], [-np.inf, 1.0], [np.inf, 1.0]])
def test_any_other_non_finite_value_is_infinitely_wrong(actual):
    result = parity("y", np.array(actual, np.float32), np.array([np.inf, 1.0], np.float32), None, None, 1e-3)
    if actual[0] == np.inf:
        assert result.max_abs == 0
    else:
        assert result.max_abs == math.inf and result.p99_abs == math.inf and result.max_rel == math.inf


def test_a_nan_where_the_reference_is_finite_never_looks_like_a_pass():
    result = parity("y", np.array([np.nan, 0.0], np.float32), np.zeros(2, np.float32), None, None, 1e-3)
    assert result.max_abs == math.inf and result.p99_abs == math.inf


def test_empty_outputs_have_zero_drift():
    empty = np.zeros((0, 2), np.float32)
    result = parity("y", empty, empty, None, None, 1e-3)
    assert (result.max_abs, result.mean_abs, result.p99_abs, result.max_rel) == (0, 0, 0, 0)


def test_discrete_agreement_flips_and_near_ties_follow_the_tie_margin():
    reference = np.array([0, 1, 2, 3], np.int64)
    actual = np.array([0, 2, 1, 3], np.int64)  # two disagreements
    margins = np.array([0.5, 0.5, 1e-4, 0.5])  # the second disagreement is a near tie
    result = parity("action", actual, reference, None, margins, tie_margin=1e-3)
    assert result.kind == "discrete"
    # the near-tie row is out of agreement entirely: 2 of the 3 decisive rows agree
    assert (result.agreement, result.flips, result.near_ties, result.judged_rows) == (pytest.approx(2 / 3), 1, 1, 3)
    looser = parity("action", actual, reference, None, margins, tie_margin=1.0)
    # no row decides: agreement is not measured (0 of 0 rows), never 100 %
    assert (looser.flips, looser.near_ties, looser.judged_rows, looser.agreement) == (0, 2, 0, None)


def test_without_one_margin_per_decision_every_disagreement_is_a_flip():
    reference, actual = np.array([0, 1, 1], np.int32), np.array([1, 1, 0], np.int32)
    for margins in (None, np.array([0.0, 0.0])):  # missing, or not one per decision
        result = parity("action", actual, reference, None, margins, tie_margin=1e-3)
        assert (result.flips, result.near_ties) == (2, 0)
        assert result.agreement == pytest.approx(1 / 3)


def test_booleans_are_discrete():
    assert parity("done", np.array([True]), np.array([True]), None, None, 1e-3).kind == "discrete"


def test_latency_stats_are_microseconds_of_the_samples():
    stats = latency_stats(64, [1000, 2000, 3000, 4000, 5000])
    assert stats.batch == 64 and stats.n == 5
    assert (stats.p50_us, stats.min_us, stats.mean_us) == (3.0, 1.0, 3.0)
    assert stats.p90_us == pytest.approx(4.6) and stats.std_us == pytest.approx(math.sqrt(2))
