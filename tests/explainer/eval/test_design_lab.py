"""The design lab (`explainer/eval/design_lab.py`) on a synthetic question whose log-probabilities are known: the pool
holds the evaluation masks, and a fit on an answer that is exactly linear in the kept sentences ranks every
evaluation mask right; an interaction between two sentences is what separates the designs."""

from __future__ import annotations

import numpy as np

from explainer.eval import design_lab


def _row(s: int, interaction: float) -> dict:
    masks, evaluation = design_lab.pool_masks(s, "q7")
    weights = np.random.default_rng(3).normal(size=s)  # no two subsets sum alike: no ties in the measured values
    x = np.array([[c == "1" for c in m] for m in masks], dtype=float)
    logp = (x @ weights + interaction * x[:, 0] * x[:, 1] - 5.0)[:, None] * np.array([[0.25, 0.75]])  # (R, K = 2)
    return {"id": "q7", "sentences": s, "masks": masks, "evaluation": [masks.index(m) for m in evaluation],
            "removal": logp.tolist(), "knockout": logp.tolist()}  # fmt: skip


def test_the_pool_holds_every_mask_up_to_eight_sentences_and_the_evaluation_masks():
    masks, evaluation = design_lab.pool_masks(5, "q7")
    assert len(masks) == 32 and masks[0] == "11111" and set(evaluation) <= set(masks)
    long_masks, long_eval = design_lab.pool_masks(11, "q7")
    assert set(long_eval) <= set(long_masks) and len(long_masks) < 2**11


def test_a_linear_answer_is_ranked_exactly_and_an_interaction_separates_the_designs():
    row = _row(6, 0.0)
    for kind in ("hadamard", "loo_pairs", "random"):
        assert design_lab.score_row(row, kind, 16, "removal", 0)[0] > 0.999
    assert design_lab.score_row(row, "reference", 64, "removal", 0)[0] > 0.99  # least squares on the logit
    bent = _row(6, 3.0)  # sentences 0 and 1 matter together: a linear fit on few masks misreads their effects
    mean_lds = {kind: np.mean([design_lab.score_row(bent, kind, 16, "removal", seed)[0] for seed in range(5)])
                for kind in ("hadamard", "loo_pairs", "random", "pairs")}  # fmt: skip
    assert mean_lds["hadamard"] == max(mean_lds.values())  # folded: effects free of the interaction
    folded = np.mean([design_lab.score_row(bent, "hadamard", 16, "removal", seed)[0] for seed in range(5)])
    entries = {(e["design"], e["k"], e["passes"]): e for e in design_lab.report([bent])}
    assert entries[("hadamard", 16, "removal")]["lds"] == folded  # the report averages the seeds
    mean, half, n = design_lab.paired(list(entries.values()), ("hadamard", 16, "removal"), ("random", 16, "removal"))
    assert n == 1 and mean == folded - mean_lds["random"]


def test_the_lasso_case_fits_the_whole_answer_only():
    whole, token = design_lab.score_row(_row(6, 0.0), "hadamard", 16, "removal-lasso", 0)
    assert whole > 0.99 and token is None
