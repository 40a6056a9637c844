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


def test_the_projection_ceiling_is_each_sentence_s_mean_effect_over_every_mask_scored_on_the_evaluation_masks():
    """`projections` against an explicit computation: over a full factorial the least-squares effect of sentence i is
    mean(target | i kept) - mean(target | i removed); its LDS on the evaluation masks, per target scale. An answer
    linear in log p is ranked exactly; questions beyond the exhaustive pool are left out."""
    from explainer.eval.lds import lds, predictions

    assert design_lab.projections([_row(6, 0.0)])["log p"][0] > 0.999
    row = _row(5, 3.0)
    row["removal"] = np.random.default_rng(8).normal(-6.0, 2.0, size=(len(row["masks"]), 2)).tolist()  # no structure
    scores = design_lab.projections([row, _row(11, 0.0)])
    assert {name: len(v) for name, v in scores.items()} == {name: 1 for name in design_lab.TARGETS}
    x = np.array([[c == "1" for c in m] for m in row["masks"]], dtype=bool)
    logp = np.asarray(row["removal"]).sum(axis=1)
    targets = {"log p": logp, "p": np.exp(logp), "ranks of log p": np.argsort(np.argsort(logp)).astype(float)}
    for name, y in targets.items():
        effects = np.array([y[x[:, i]].mean() - y[~x[:, i]].mean() for i in range(5)])
        by_hand = lds(logp[row["evaluation"]], predictions(x[row["evaluation"]].astype(float), effects))
        assert abs(scores[name][0] - by_hand) < 1e-9, name


def test_where_the_sentences_outnumber_the_masks_the_default_fit_is_each_token_s_lasso():
    """`score_row`'s default passes fit as the method does (`regulariser=auto`): each token's Lasso where k <= S, the
    ridge elsewhere; `fallback` compares the candidates over the questions with at least k sentences only."""
    sparse = _row(11, 0.0)
    x = np.array([[c == "1" for c in m] for m in sparse["masks"]], dtype=float)
    sparse["removal"] = ((3.0 * x[:, 4] - 5.0)[:, None] * np.array([[0.25, 0.75]])).tolist()  # one sentence matters
    short = _row(6, 0.0)
    for kind in ("pairs", "loo_pairs"):
        assert design_lab.score_row(sparse, kind, 8, "removal", 0) == design_lab.score_row(
            sparse, kind, 8, "removal-lasso-tokens", 0)
        assert design_lab.score_row(short, kind, 16, "removal", 0) == design_lab.score_row(
            short, kind, 16, "removal-ridge", 0)
    assert design_lab.score_row(sparse, "pairs", 8, "removal", 0) != design_lab.score_row(
        sparse, "pairs", 8, "removal-ridge", 0)
    lean = {**sparse, "masks": [sparse["masks"][i] for i in sparse["evaluation"]],
            "removal": [sparse["removal"][i] for i in sparse["evaluation"]],
            "evaluation": list(range(len(sparse["evaluation"])))}  # fmt: skip
    assert design_lab.score_row(lean, "pairs", 8, "removal", 0) == (None, None)  # masks the pool lacks: unscored
    entries = design_lab.fallback([sparse, short])
    assert {(e["k"], e["design"], e["passes"]) for e in entries} == {
        (k, kind, passes) for k in design_lab.FALLBACK_COUNTS for kind, passes in design_lab.FALLBACKS}
    assert {e["k"]: e["n"] for e in entries} == {4: 2, 8: 1}  # the 6-sentence question has fewer than 8


def test_the_half_fraction_reads_effects_that_a_fold_mistakes_for_a_three_sentence_interaction():
    """Five sentences and an answer bent by sentences 0-2 together: a fold's effects carry some three-unit
    interaction with them where its one word holds all three (two of its five possible words do), the half fraction's
    only the five-unit one, so on this answer it ranks the evaluation masks clearly better than the fold's draws do,
    as every mask does; the lab's "folded" case is the fold the default drew before."""
    from explainer.methods.surrogate import design, folded

    masks, evaluation = design_lab.pool_masks(5, "q7")
    x = np.array([[c == "1" for c in m] for m in masks], dtype=float)
    weights = np.random.default_rng(3).normal(size=5)
    z = 2 * x - 1  # +-1: the interaction is a pure three-unit one
    logp = (x @ weights + 2.0 * z[:, 0] * z[:, 1] * z[:, 2] - 5.0)[:, None] * np.array([[0.25, 0.75]])
    row = {"id": "q7", "sentences": 5, "masks": masks, "evaluation": [masks.index(m) for m in evaluation],
           "removal": logp.tolist(), "knockout": logp.tolist()}  # fmt: skip
    entries = {e["design"] if e["k"] == 16 else "every": e for e in design_lab.half_fraction([row])}
    assert set(entries) == {"hadamard", "folded", "every"}
    assert min(entries["hadamard"]["lds"], entries["every"]["lds"]) > entries["folded"]["lds"] + 0.02
    assert entries["hadamard"]["minus folded"][0] == entries["hadamard"]["lds"] - entries["folded"]["lds"]
    for seed in range(3):  # a sixth sentence: the default is still the fold, drawn as the lab's "folded" draws it
        np.testing.assert_array_equal(design(6, 16, "hadamard", seed), folded(6, 8, np.random.default_rng([seed, 7])))
