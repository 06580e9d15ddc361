"""When two latencies differ: a p50 with its noise band, and the rule that compares two of them.

A p50's band is a bootstrap percentile interval over the timed calls it summarises: the calls
resampled with replacement RESAMPLES times, the median of each resample, the central CONFIDENCE
share of those medians. The resampling is seeded, so the same calls always give the same band.
The calls themselves are not kept in results.json (hundreds per cell), only the band is: a ratio
of two p50s then gets the band that both bands allow (lowest over highest, highest over lowest),
wider than a joint bootstrap would give, so a difference it finds is one the calls really show.

One rule for every reader (the Versions table, bisect's p50 measure, the shipping decision):
two p50s differ when their ratio's band lies wholly outside [1 / (1 + threshold), 1 + threshold].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 1000
_MAX_DRAWS = 1 << 21
_SEED = 0  # fixed: a band is a function of the calls, not of the moment it was computed


def p50_band(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The bootstrap interval of the median of `samples` (same unit as the samples)."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no timed calls: a p50 needs at least one")
    rng = np.random.default_rng(_SEED)
    rows = max(1, _MAX_DRAWS // values.size)  # resamples drawn at once: memory stays bounded at any --iters
    medians = np.concatenate([np.median(values[rng.integers(0, values.size, size=(min(rows, RESAMPLES - start), values.size))], axis=1)
                              for start in range(0, RESAMPLES, rows)])
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def ratio_band(reference: tuple[float, float], other: tuple[float, float]) -> tuple[float, float]:
    """The band of other's p50 / reference's p50, from each p50's own band."""
    (ref_low, ref_high), (low, high) = reference, other
    if ref_low <= 0:  # a clock too coarse to see one call: the ratio can be anything
        return 0.0, float("inf")
    return low / ref_high, high / ref_low


def differs(band: tuple[float, float], threshold: float = 0.0) -> bool:
    """The ratio's band lies wholly beyond `threshold` (a fraction) on either side of 1."""
    low, high = band
    return low > 1 + threshold or high < 1 / (1 + threshold)
