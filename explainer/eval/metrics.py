"""Metric functions of the two evaluation protocols, in plain numpy (no model, no torch).

- MACS paper, Appendix A.1: average precision (AUC-PR) of a score row against a gold answer span.
- MACS paper, Appendix A.2.3-A.2.4: trapezoid AUC of a normalised perturbation curve over the removed fractions,
  divided by the largest fraction, and SRG = AUC_LIF - AUC_MIF.
- Grad-ELLM paper, section 3.1: Hellinger distance (Eq. 3) and the alpha transform s -> s^alpha that calibrates
  attribution scores to a target retaining probability pi (found by bisection).
- Text similarity of a regenerated answer with the original: ROUGE-L F1 (`rouge-score`) and sentence BLEU
  (`sacrebleu`, scaled to [0, 1]).
- Spearman's rank correlation (Spearman, 1904), tied values given their mean rank, used by the bf16 agreement and
  the LDS (`lds.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REMOVAL_FRACTIONS = (0.0, 0.01, 0.05, 0.10, 0.15, 0.20)  # MACS paper, Appendix A.2.1
PI_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05, 0.10, ..., 0.95 (Grad-ELLM paper, section 4.3)


@dataclass(frozen=True)
class RemovalMetric:
    """One quantity measured on every removal run (MACS paper, Appendix A.2).

    Attributes:
        key: name in reports and result files.
        label: short name for menus and table headers.
        title: the paper's row title (Table 5).
        description: what is measured, for axis titles.
        lower_is_better: True when evidence removal should make the value rise (SRG more negative is better).
    """

    key: str
    label: str
    title: str
    description: str
    lower_is_better: bool = False


REMOVAL_METRICS = (
    RemovalMetric("logit", "mean logit", "Mean Logits", "mean logit of the original tokens"),
    RemovalMetric("ppl", "perplexity", "Perplexity", "perplexity of the original answer", lower_is_better=True),
    RemovalMetric("rougeL", "ROUGE-L F1", "ROUGE-L F1", "ROUGE-L F1 vs the original answer"),
    RemovalMetric("bleu", "BLEU", "BLEU", "BLEU vs the original answer"),
)
REMOVAL_METRIC_KEYS = tuple(m.key for m in REMOVAL_METRICS)


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


def normalised_auc(fractions: Sequence[float], curve: Sequence[float]) -> float:
    """Trapezoid area under c(s) over the fractions, divided by the largest fraction (MACS paper, Appendix A.2.3).

    A curve that stays at 1 has AUC 1.
    """
    f = np.asarray(fractions, dtype=np.float64)
    c = np.asarray(curve, dtype=np.float64)
    if f.shape != c.shape or f.size < 2 or f[-1] <= 0:
        raise ValueError("need at least two fractions ending above 0 and one curve value per fraction")
    return float(np.sum((c[1:] + c[:-1]) / 2 * np.diff(f)) / f[-1])


def srg(auc_lif: float, auc_mif: float) -> float:
    """Symmetric Relevance Gain, AUC_LIF - AUC_MIF (MACS paper, Appendix A.2.4).

    Higher is better for metrics that drop when evidence is removed (logit, ROUGE-L, BLEU); for perplexity, which
    rises, more negative is better.
    """
    return float(auc_lif - auc_mif)


def hellinger(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Hellinger distance along the last axis (Grad-ELLM paper, Eq. 3): 0 for equal, 1 for disjoint distributions.

    Args:
        p, q: (..., V) probability distributions (broadcastable).
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    return np.sqrt(np.sum((np.sqrt(p) - np.sqrt(q)) ** 2, axis=-1)) / math.sqrt(2.0)


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scores mapped to [0, 1] by min-max; a row without spread (or with NaN only) maps to all zeros."""
    s = np.asarray(scores, dtype=np.float64)
    finite = s[np.isfinite(s)]
    if finite.size == 0 or finite.max() == finite.min():
        return np.zeros(s.shape)
    lo, hi = finite.min(), finite.max()
    return np.clip(np.nan_to_num((s - lo) / (hi - lo), nan=0.0), 0.0, 1.0)


def calibrate(scores: np.ndarray, pi: float, tol: float = 1e-3, iterations: int = 200) -> np.ndarray:
    """Retaining probabilities s^alpha with mean pi, alpha >= 0 found by bisection (Grad-ELLM paper, section 3.1).

    Args:
        scores: (n,) scores already in [0, 1] (see `minmax`).
        pi: target mean in [0, 1].
        tol: accepted |mean - pi|.

    Returns:
        (n,) retaining probabilities whose mean is pi within `tol`. Scores without spread carry no ranking, so
        they map to the constant pi. When no alpha reaches pi (it lies outside (mean(s == 1), mean(s > 0)), which
        happens with fewer than about 1/pi tokens), the limiting map is rescaled instead: the tokens at 1 get
        probability pi / mean(s == 1), or the tokens at 0 are raised so that the mean is pi.
    """
    s = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    if not 0.0 <= pi <= 1.0:
        raise ValueError(f"pi must lie in [0, 1], got {pi}")
    if s.size == 0:
        return s
    if s.max() == s.min():
        return np.full(s.shape, float(pi))
    lo, hi = -40.0, 40.0  # bisection on log(alpha); mean(s^alpha) decreases with alpha
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if np.mean(s ** math.exp(mid)) > pi:
            lo = mid
        else:
            hi = mid
    out = s ** math.exp((lo + hi) / 2)
    if abs(out.mean() - pi) <= tol:
        return out
    ones, nonzero = float(np.mean(s >= 1.0)), float(np.mean(s > 0.0))
    if ones > 0 and pi <= ones:
        return np.where(s >= 1.0, pi / ones, 0.0)
    if pi >= nonzero:
        fill = (pi - nonzero) / (1.0 - nonzero) if nonzero < 1.0 else 0.0
        return np.where(s > 0.0, 1.0, fill)
    return out  # unreachable for scores in [0, 1]; kept as a safe fallback


def rouge_l_f1(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of a candidate against one reference (`rouge-score`, its default tokeniser, no stemming)."""
    from rouge_score import rouge_scorer

    return float(_rouge_scorer(rouge_scorer).score(reference, candidate)["rougeL"].fmeasure)


_SCORER: list = []


def _rouge_scorer(module):
    if not _SCORER:
        _SCORER.append(module.RougeScorer(["rougeL"], use_stemmer=False))
    return _SCORER[0]


def bleu(candidate: str, reference: str) -> float:
    """Sentence BLEU in [0, 1] (`sacrebleu.sentence_bleu`, exponential smoothing, effective order)."""
    import sacrebleu

    if not reference.strip():
        return 0.0
    return float(sacrebleu.sentence_bleu(candidate, [reference]).score) / 100.0


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% confidence half-width 1.96 * sd / sqrt(n) (sample sd), ignoring NaN; (nan, nan) if empty."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    half = 1.96 * v.std(ddof=1) / math.sqrt(v.size) if v.size > 1 else 0.0
    return float(v.mean()), float(half)


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
