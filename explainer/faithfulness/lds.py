"""Every method's LDS on the visitor's own answer, from the ablations Sources' surrogate already ran (no pass).

The linear datamodeling score (ContextCite, Cohen-Wang et al., 2024, section 4; the evaluation over data sets:
`eval/lds.py`) of one answer: over keep-masks of the prompt's units, the Spearman correlation of the answer's measured
log-probability with what a method predicts, the sum of the kept units' scores (a unit's score: the sum of its tokens'
raw scores, summed over the answer's steps). Sources' surrogate records every mask it ran and the answer's
log-probabilities under each (`methods/sources.py`, its meta's "masks"), so each ticked method is scored on those masks
for free:

- a method other than Sources is scored on every recorded mask (it saw none of them);
- Sources' surrogate was fitted on all but its `check` masks, so its own score is cross-validated: each fitted mask
  predicted by the fit without it (`surrogate.cross_validated`); the report gives beside it the held-out Spearman on
  the `check` masks, and how many masks each used.

A score on few masks is coarse (Spearman over 5 masks takes few values): the report says how many entered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..result.attribution import Attribution
from ..result.ranks import spearman

SOURCES = "sources"


def source_scores(raw: np.ndarray, sources: Sequence[Sequence[int]]) -> np.ndarray:
    """Each source's score at each step: the sum of its tokens' raw scores (NaN counts as 0).

    Args:
        raw: (K, N) raw token scores of K steps (or (N,) for one map).
        sources: S lists of prompt positions.

    Returns:
        (K, S) float64 (or (S,) for an (N,) map).
    """
    r = np.nan_to_num(np.asarray(raw, dtype=np.float64), nan=0.0)
    one = r.ndim == 1
    r = np.atleast_2d(r)  # (K, N)
    out = np.stack([r[:, list(p)].sum(axis=1) for p in sources], axis=1) if sources else np.zeros((len(r), 0))
    return out[0] if one else out  # (K, S)


def predictions(masks: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The linear surrogate's prediction for each mask: the sum of the kept sources' scores.

    Args:
        masks: (M, S) booleans. scores: (S,) or (K, S).

    Returns:
        (M,) or (M, K) float64.
    """
    return np.asarray(masks, dtype=np.float64) @ np.asarray(scores, dtype=np.float64).T


PREDICTION_TIE = 1e-9  # predictions this close, relative to the largest |prediction|, are one value (a tie)


def tied(predicted: np.ndarray) -> np.ndarray:
    """`predicted` (M,) with values that differ only by float rounding made equal: sorted, each value within
    `PREDICTION_TIE` of the largest |value| of the one before it joins that one's group, and takes the group's first
    value.

    Two masks that differ only in a source scored exactly 0 (a Lasso's zero weight, spread over its tokens and summed
    back) predict the same value, but the sums leave them ~1e-16 apart in an order set by the order of the additions,
    and the Spearman would rank them apart (Sources run alone 0.41, the same fit in the `surrogate` command 0.39, on a
    4-sentence test). Gaps of 1e-9 of the scale are far below any score's meaning and far above float64 rounding."""
    p = np.asarray(predicted, dtype=np.float64).ravel()
    finite = np.isfinite(p)
    if finite.sum() < 2:
        return p
    values = p[finite]
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    tolerance = PREDICTION_TIE * float(np.abs(ordered).max())
    group = np.concatenate([[0], np.cumsum(np.diff(ordered) > tolerance)])  # (n,) group of each sorted value
    firsts = ordered[np.concatenate([[0], np.flatnonzero(np.diff(group)) + 1])]
    snapped = np.empty_like(values)
    snapped[order] = firsts[group]
    out = p.copy()
    out[finite] = snapped
    return out


def lds(actual: np.ndarray, predicted: np.ndarray) -> float | None:
    """The LDS of one example: Spearman's correlation of the measured and predicted values over the M masks (ties get
    their mean rank; predictions apart only by float rounding tie: `tied`); None when either is constant."""
    return spearman(np.asarray(actual).ravel(), tied(predicted))


@dataclass
class LdsReport:
    """Plain data: each method's LDS on this answer and how many masks it used; the surrogate's own fit quality."""

    lds: dict[str, float | None] = field(default_factory=dict)
    masks: dict[str, int] = field(default_factory=dict)
    units: int = 0
    fit: dict[str, float | int | None] = field(default_factory=dict)  # held-out / cross-validated Spearman, counts


def answer_lds(attr: Attribution, methods: Sequence[str]) -> LdsReport | None:
    """The LDS of each of `methods` that `attr` holds, on Sources' recorded ablations; None when the result has no
    Sources surrogate (Sources not ticked, or fitted by leave-one-out)."""
    if SOURCES not in attr.methods:
        return None
    meta = attr.methods[SOURCES].meta or {}
    record = meta.get("masks")
    if meta.get("fit") != "surrogate" or not record:
        return None
    keep = np.asarray(record["keep"], dtype=bool)  # (R, U) row 0: every unit kept
    actual = np.asarray(record["log_p"], dtype=np.float64).sum(axis=1)  # (R,) the whole answer's log p
    spans = [list(range(start, stop)) for start, stop in record["units"]]
    report = LdsReport(units=len(spans))
    for name in methods:
        if name == SOURCES or name not in attr.methods:
            continue
        scores = source_scores(attr.methods[name].raw, spans).sum(axis=0)  # (U,) summed over the answer's steps
        report.lds[name] = lds(actual, predictions(keep, scores))
        report.masks[name] = len(keep)
    if SOURCES in methods:
        report.lds[SOURCES] = meta.get("cross_validated_spearman")
        report.masks[SOURCES] = int(record["fitted"])
    report.fit = {
        "held_out_spearman": meta.get("held_out_spearman"), "checks": meta.get("checks"),
        "cross_validated_spearman": meta.get("cross_validated_spearman"), "ablations": meta.get("ablations"),
    }  # fmt: skip
    return report
