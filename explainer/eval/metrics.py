"""Metric functions of the answer-span and ranking protocols, in plain numpy (no model, no torch).

- MACS paper, Appendix A.1: average precision (AUC-PR) of a score row against a gold answer span.
- Spearman's rank correlation lives in `explainer/result/ranks.py` (the method, faithfulness and evaluation layers
  all read it) and is re-exported here.
- The mean with its 95% half-width, for the evaluation reports.

The removal and pi-Soft metrics live with their protocols in `explainer/faithfulness/metrics.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..result.ranks import average_ranks, spearman  # noqa: F401  (re-exported: the evaluation's callers)


def average_precision(y_true: Sequence[bool] | np.ndarray, y_score: Sequence[float] | np.ndarray) -> float:
    """Average precision, AP = sum_n (R_n - R_{n-1}) P_n over descending score thresholds.

    Same definition as sklearn's `average_precision_score`: tied scores form one threshold (they enter the
    ranking together). A row without positives scores 0.0 (MACS paper, Appendix A.1).

    Args:
        y_true: (n,) booleans, True for answer tokens.
        y_score: (n,) scores; higher means more important. NaN is treated as the lowest score.
    """
    y_true = np.asarray(y_true, dtype=bool)
    y_score = np.nan_to_num(np.asarray(y_score, dtype=np.float64), nan=-np.inf)
    if y_true.shape != y_score.shape or y_true.ndim != 1:
        raise ValueError(f"expected two (n,) vectors, got {y_true.shape} and {y_score.shape}")
    positives = int(y_true.sum())
    if positives == 0:
        return 0.0
    order = np.argsort(-y_score, kind="mergesort")
    scores, labels = y_score[order], y_true[order]
    # the last index of every run of equal scores is one threshold
    last = np.r_[np.flatnonzero(np.diff(scores) != 0), scores.size - 1]
    tp = np.cumsum(labels)[last]  # (thresholds,)
    predicted = last + 1
    precision = tp / predicted
    recall = tp / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def span_labels(offsets: Sequence[tuple[int, int]], start: int, end: int) -> np.ndarray:
    """(n,) booleans: which tokens' character spans [s, e) overlap the character span [start, end)."""
    return np.array([e > s and s < end and e > start for s, e in offsets], dtype=bool)


def step_auc_pr(scores: np.ndarray, labels: Sequence[np.ndarray]) -> np.ndarray:
    """Mean AP over gold spans for every step (MACS paper, Appendix A.1 `MeanStepAUC`).

    Args:
        scores: (K, n) scores of the evaluated tokens.
        labels: one (n,) boolean vector per gold answer span.

    Returns:
        (K,) float64; the sample's AUC-PR is its maximum.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if not labels:
        return np.zeros(scores.shape[0])
    return np.array([np.mean([average_precision(lab, row) for lab in labels]) for row in scores])


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% confidence half-width 1.96 * sd / sqrt(n) (sample sd), ignoring NaN; (nan, nan) if empty."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    half = 1.96 * v.std(ddof=1) / math.sqrt(v.size) if v.size > 1 else 0.0
    return float(v.mean()), float(half)


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided Student t quantile: P(|T| <= q) = level for T with `df` degrees of freedom (df = 4: 2.776).

    The t density is integrated numerically (trapezoids on a fine grid) and the quantile found by bisection; exact to
    about 1e-6, which an interval's half-width does not feel.
    """
    if df < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"need df >= 1 and a level in (0, 1), got {df} and {level}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def mass(q: float) -> float:  # P(0 <= T <= q)
        x = np.linspace(0.0, q, 20001)
        density = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
        return float(np.sum((density[1:] + density[:-1]) / 2 * np.diff(x)))

    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 2 * mass(mid) < level else (lo, mid)
    return (lo + hi) / 2


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float | int]:
    """Mean of a - b over the pairs where both are finite, with its t interval's half-width (n - 1 degrees of freedom)
    and the wins (a > b), losses and ties: how two methods compare on the same rows.

    Returns:
        {"mean", "half_width", "n", "wins", "losses", "ties"}; half_width is NaN below 2 pairs.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    d = a[keep] - b[keep]
    n = int(d.size)
    half = t_quantile(n - 1, level) * d.std(ddof=1) / math.sqrt(n) if n > 1 else float("nan")
    return {"mean": float(d.mean()) if n else float("nan"), "half_width": float(half), "n": n,
            "wins": int((d > 0).sum()), "losses": int((d < 0).sum()), "ties": int((d == 0).sum())}  # fmt: skip
