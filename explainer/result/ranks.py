"""Spearman's rank correlation (Spearman, 1904) of two score rows, tied values given their mean rank, in plain numpy.

One definition for every layer that reads it: Sources' fit quality (`methods/sources.py`), the LDS of an answer
(`faithfulness/lds.py`) and the evaluations (`eval/`: bf16 agreement, LDS over data sets, calibration forms).
"""

from __future__ import annotations

import numpy as np


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of the values of `x` (n,), tied values sharing the mean of their ranks: [5, 1, 5] -> [2.5, 1,
    2.5]. Returns float64 (n,)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts = np.concatenate([[0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1])  # first index of each tie group
    ends = np.concatenate([starts[1:], [x.size]])
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + 1 + ends) / 2, ends - starts)  # mean of the ranks starts+1 .. ends
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation of two score rows (n,) over the positions where both are finite.

    Returns:
        A value in [-1, 1], or None when fewer than 2 positions remain or either row is constant there.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 2:
        return None
    ra, rb = average_ranks(a[keep]), average_ranks(b[keep])
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    if denominator == 0:
        return None
    return float(np.clip((ra * rb).sum() / denominator, -1.0, 1.0))
