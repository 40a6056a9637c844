"""Percentiles of measured times, the one rule every load and crowd figure uses: the nearest rank (the smallest value
with at least q% of the values at or below it), so a p95 is always a time that was measured."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0 < q <= 100) of `values` by the nearest rank; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(len(ordered), rank) - 1]
