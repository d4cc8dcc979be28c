"""The one percentile the pipeline page and the benchmarks compute their figures with (no Django, no app import)."""

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Return the nearest-rank p-th percentile (0 < p <= 100) of already sorted values; NaN for no values.

    Nearest rank: the value at rank ceil(p/100 x n), 1-based (the first value for p = 0). It is always a value that
    was observed, never one interpolated between two (a p99 latency is a latency some request had), and it is what
    "99% of the values are at most this" means: the smallest value at or above p% of them.
    """
    if not sorted_values:
        return math.nan
    # p * n first: both are exact in floating point for the percentiles and counts used, so the division is the only
    # rounding, and a rank that is a whole number stays one (0.07 * 100 would not).
    return sorted_values[max(0, math.ceil(p * len(sorted_values) / 100) - 1)]
