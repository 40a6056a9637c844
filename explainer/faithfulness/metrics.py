"""Metric functions of the two faithfulness protocols, in plain numpy (no model, no torch).

- MACS paper, Appendix A.2.3-A.2.4: trapezoid AUC of a normalised perturbation curve over the removed fractions,
  divided by the largest fraction, and SRG = AUC_LIF - AUC_MIF.
- Grad-ELLM paper, section 3.1: Hellinger distance (Eq. 3) and the alpha transform s -> s^alpha that calibrates
  attribution scores to a target retaining probability pi (found by bisection).
- Text similarity of a regenerated answer with the original: ROUGE-L F1 (`rouge-score`) and sentence BLEU
  (`sacrebleu`, scaled to [0, 1]).
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
