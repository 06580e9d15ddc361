"""How far a cell's answers are from the reference, and how its latency is summarised.

Definitions (stated in the report too):
- abs error per element |y - y_ref|; max_abs, mean_abs and p99_abs over all elements;
  a non-finite value equal to the reference's (NaN where it has NaN, an infinity of
  the same sign) is no error; any other NaN counts as infinitely wrong;
- max_rel = max |y - y_ref| / max(|y_ref|, REL_FLOOR): the floor keeps outputs near
  zero from turning rounding noise into huge relative errors;
- tolerance_used = max |y - y_ref| / (atol + rtol * |y_ref|): above 1 the output is
  beyond its tolerance (numpy's allclose rule);
- discrete outputs (integers, or any output the reference knows decision margins
  of: an ArgMax cast to float, a Round of a probability, as SB3's MultiBinary
  writes): a row is a near tie when the reference's top-1 minus top-2 logit (a
  rounded value's distance from the rounding boundary) is at most the tie margin
  (`--tie-margin`, its own threshold, not the drift tolerance); near ties are left out of agreement entirely (numerator and
  denominator): agreement = 1 - flips / judged rows, a flip being a disagreement
  on a row that is not a near tie. Disagreements on near ties are reported.
"""

from __future__ import annotations

import numpy as np

from .noise import p50_band
from ..results import LatencyStats, OutputParity
from .rules import Tolerance, share

REL_FLOOR = 1e-3


def latency_stats(batch: int, samples_ns: list[int]) -> LatencyStats:
    us = np.asarray(samples_ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    low, high = p50_band(us)
    return LatencyStats(
        batch=batch, n=len(us), p50_us=p50, p90_us=p90, p99_us=p99,
        mean_us=float(us.mean()), std_us=float(us.std()), min_us=float(us.min()), p50_low_us=low, p50_high_us=high,
    )


def parity(
    name: str, actual: np.ndarray, reference: np.ndarray, dev_runtime: np.ndarray | None,
    margins: np.ndarray | None, tie_margin: float, tolerance: Tolerance | None = None,
) -> OutputParity:
    diff = abs_error(actual, reference).ravel()
    with np.errstate(invalid="ignore"):  # inf / inf where an infinity is wrong: NaN, counted as infinite
        # fmax: a NaN reference gets the floor (the error there is 0 or inf already), not a NaN ratio
        rel = diff / np.fmax(np.abs(reference.astype(np.float64)).ravel(), REL_FLOOR)
    result = OutputParity(
        output=name,
        kind="discrete" if reference.dtype.kind in "iub" or margins is not None else "continuous",
        max_abs=_finite_max(diff),
        mean_abs=float(np.mean(diff)) if diff.size else 0.0,
        p99_abs=_percentile(diff, 99),
        max_rel=_finite_max(rel),
        vs_dev_runtime_max_abs=None if dev_runtime is None else _finite_max(abs_error(actual, dev_runtime)),
    )
    if result.kind == "discrete":
        _agreement(result, (actual != reference).ravel(), margins, tie_margin)
    elif tolerance is not None:
        allowed = tolerance.atol + tolerance.rtol * np.abs(reference.astype(np.float64)).ravel()
        result.tolerance_used = _finite_max(share(diff, allowed)) if diff.size else 0.0
    return result


def _agreement(result: OutputParity, differs: np.ndarray, margins: np.ndarray | None, tie_margin: float) -> None:
    decisive = np.ones_like(differs)
    if margins is not None and margins.size == differs.size:  # one margin per decision
        decisive = margins.ravel() > tie_margin
    result.flips = int((differs & decisive).sum())
    result.near_ties = int((differs & ~decisive).sum())
    result.judged_rows = int(decisive.sum())
    result.agreement = 1.0 - result.flips / result.judged_rows if result.judged_rows else None  # no row decides


def abs_error(actual: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|actual - reference| per element, 0 where both hold the same non-finite value."""
    actual, reference = actual.astype(np.float64), reference.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(actual - reference)
    same = (np.isnan(actual) & np.isnan(reference)) | (np.isinf(actual) & (actual == reference))
    return np.where(same, 0.0, diff)  # an array also for a rank-0 output, where np.abs gives a scalar


def _percentile(values: np.ndarray, q: float) -> float:
    """NaN counts as infinite; with infinities present, no interpolation (inf - inf has no meaning)."""
    if not values.size:
        return 0.0
    if np.isfinite(values).all():
        return float(np.percentile(values, q))
    # not nan_to_num: it would also turn inf into the largest finite float
    return float(np.percentile(np.where(np.isnan(values), np.inf, values), q, method="higher"))


def _finite_max(values: np.ndarray) -> float:
    """Max error, with NaN counted as infinitely wrong (it must never look like a pass)."""
    if not values.size:
        return 0.0
    return float(np.inf) if np.isnan(values).any() else float(values.max())
