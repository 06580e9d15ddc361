"""The paired confidence interval the behaviour rule judges by (numpy only: scipy is not a dependency).

Episode i of a cell and of the float64 reference reset with the same seed, so
their returns are paired: the interval is Student's t interval of the mean of
the per-seed differences, two-sided, at CONFIDENCE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float  # -inf/+inf with fewer than two episodes: one pair says nothing about the spread
    high: float
    n: int
    confidence: float = CONFIDENCE

    def negated(self) -> "Interval":
        """The interval of the opposite differences (reference - values)."""
        return Interval(-self.mean, -self.high, -self.low, self.n, self.confidence)

    def describe(self) -> str:
        if not math.isfinite(self.low):
            return f"{self.mean:+.4g} (one episode: no interval)"
        return f"{self.mean:+.4g}, {100 * self.confidence:g}% CI [{self.low:+.4g}, {self.high:+.4g}] over {self.n} paired episodes"


def paired_interval(values: np.ndarray, references: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """t interval of mean(values - references), pairs taken in order."""
    differences = np.asarray(values, dtype=np.float64) - np.asarray(references, dtype=np.float64)
    n = len(differences)
    mean = float(differences.mean()) if n else 0.0
    if n < 2:
        return Interval(mean, -math.inf, math.inf, n, confidence)
    half_width = t_quantile(confidence, n - 1) * float(differences.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half_width, mean + half_width, n, confidence)


def t_quantile(confidence: float, dof: int) -> float:
    """t such that P(|T| <= t) = confidence for Student's t with `dof` degrees of freedom (bisection)."""
    low, high = 0.0, 1.0
    while _central_probability(high, dof) < confidence:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _central_probability(middle, dof) < confidence else (low, middle)
    return (low + high) / 2


def _central_probability(t: float, dof: int) -> float:
    """P(|T| <= t), closed form for integer degrees of freedom (Abramowitz & Stegun 26.7.3, 26.7.4)."""
    theta = math.atan(t / math.sqrt(dof))
    cos2 = math.cos(theta) ** 2
    if dof % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(2, dof, 2):  # (1·3···(k-1)) / (2·4···k) cos^k θ
            term *= cos2 * (k - 1) / k
            total += term
        return math.sin(theta) * total
    if dof == 1:
        return 2 * theta / math.pi
    term, total = math.cos(theta), math.cos(theta)
    for k in range(3, dof - 1, 2):  # (2·4···(k-1)) / (1·3···k) cos^k θ
        term *= cos2 * (k - 1) / k
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * total)
