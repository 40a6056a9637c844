"""The field's metrics over sources (`explainer/eval/lds.py`) against straightforward loops and hand-computed cases:
Spearman by hand, the masks' keep rate, sums over sentences, LDS of a method that is the true linear model (1) and its
reverse (-1), the top-k choice, and the hit ratio."""

from __future__ import annotations

import numpy as np
import pytest

from explainer.eval.lds import (
    ablation_masks,
    centred,
    centred_predictions,
    hit_ratio,
    lds,
    lds_per_token,
    predictions,
    source_scores,
    spread,
    top_sources,
    without,
)
from explainer.eval.metrics import spearman
from explainer.faithfulness.lds import tied


def loop_ranks(x):
    """1-based ranks, ties sharing the mean rank, by counting (no sort)."""
    return [sum(y < v for y in x) + (sum(y == v for y in x) + 1) / 2 for v in x]


def loop_spearman(a, b):
    ra, rb = loop_ranks(list(a)), loop_ranks(list(b))
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den


def test_spearman_against_a_hand_computation_and_a_loop():
    # ranks [1, 2, 3, 4] and [2, 1, 4, 3]: d = (1, 1, 1, 1), rho = 1 - 6 * 4 / (4 * 15) = 0.6
    assert spearman([0.1, 0.2, 0.3, 0.4], [5.0, 1.0, 9.0, 7.0]) == pytest.approx(0.6)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, 9).astype(float), rng.normal(size=9)  # ties in a
        assert spearman(a, b) == pytest.approx(loop_spearman(a, b))


def test_ablation_masks_are_seeded_and_keep_about_half():
    m = ablation_masks(10, 32, 0.5, seed=[3, 7])
    assert m.shape == (32, 10) and m.dtype == bool
    assert (m == ablation_masks(10, 32, 0.5, seed=[3, 7])).all()
    assert not (m == ablation_masks(10, 32, 0.5, seed=[3, 8])).all()
    assert abs(ablation_masks(50, 400, 0.5, seed=1).mean() - 0.5) < 0.02
    assert ablation_masks(4, 5, 0.0).sum() == 0 and ablation_masks(4, 5, 1.0).all()


def test_source_scores_sum_each_sentence_over_a_loop():
    raw = np.array([[1.0, 2.0, np.nan, 4.0, 5.0], [0.5, -1.0, 3.0, 0.0, 2.0]])  # (K=2, N=5)
    sources = [[0, 1], [2, 3, 4]]
    want = [[sum(0.0 if np.isnan(raw[k, p]) else raw[k, p] for p in s) for s in sources] for k in range(2)]
    np.testing.assert_allclose(source_scores(raw, sources), want)
    np.testing.assert_allclose(source_scores(raw[1], sources), want[1])


def test_spread_shares_each_sources_score_evenly_and_sums_back():
    sources = [[1, 2], [4, 5, 6], [7]]
    scores = np.array([3.0, -1.5, 2.0])
    got = spread(scores, sources, 9)
    want = np.zeros(9)
    for score, positions in zip(scores, sources):
        for p in positions:
            want[p] = score / len(positions)
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(source_scores(got, sources), scores)  # the sentence map it was spread from


def test_centred_rows_have_zero_mean_over_the_positions():
    raw = np.array([[1.0, 2.0, 3.0, 100.0], [0.0, 0.0, 6.0, -5.0]])
    c = centred(raw, [0, 1, 2])
    np.testing.assert_allclose(c[:, :3].mean(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(c[0], [-1.0, 0.0, 1.0, 98.0])


def test_predictions_sum_the_kept_sources():
    masks = np.array([[True, False, True], [False, False, False], [True, True, True]])
    scores = np.array([[1.0, 2.0, 4.0], [0.0, -1.0, 1.0]])  # (K=2, S=3)
    want = [[sum(scores[k, s] for s in range(3) if masks[m, s]) for k in range(2)] for m in range(3)]
    np.testing.assert_allclose(predictions(masks, scores), want)
    np.testing.assert_allclose(predictions(masks, scores[0]), [5.0, 0.0, 7.0])


def test_centred_keep_all_and_keep_none_tie_whatever_the_rounding():
    """A centred map's scores sum to 0, so keeping every sentence and keeping none both predict 0; the ~1e-16 that
    rounding leaves, of either sign by the summation order, must not rank the two apart (it did, by CPU)."""
    masks = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 1]], dtype=bool)
    actual = np.array([-8.0, -20.0, -12.0, -15.0, -9.0, -18.0])
    exact = np.array([0.5, 0.25, -0.75])
    values = set()
    for noise in (0.0, 2.3e-16, -2.3e-16):  # what two orders of summation leave (about an ulp of 0.5)
        scores = exact + np.array([noise, 0.0, 0.0])
        got = centred_predictions(masks, scores)
        assert got[0] == got[1] == 0.0  # tied exactly
        np.testing.assert_allclose(got[2:], predictions(masks[2:], exact), atol=1e-15)  # the rest untouched
        values.add(lds(actual, got))
    assert len(values) == 1
    plain = {spearman(actual, predictions(masks, exact + np.array([n, 0.0, 0.0]))) for n in (2.3e-16, -2.3e-16)}
    assert len(plain) == 2  # a bare Spearman of the predictions depends on the rounding
    assert len({lds(actual, predictions(masks, exact + np.array([n, 0.0, 0.0]))) for n in (2.3e-16, -2.3e-16)}) == 1
    per_token = centred_predictions(masks, np.stack([exact, 2 * exact]) + 2.3e-16)  # (K, S) rows, each its own scale
    assert (per_token[:2] == 0.0).all() and per_token.shape == (6, 2)


def test_a_method_equal_to_the_true_linear_model_gets_lds_1_and_its_reverse_minus_1():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=8)  # the model's true effect of each source on log p
    masks = ablation_masks(8, 32, seed=0)
    actual = -3.0 + masks @ weights  # a model that is exactly linear in the kept sources
    assert lds(actual, predictions(masks, weights)) == pytest.approx(1.0)
    assert lds(actual, predictions(masks, -weights)) == pytest.approx(-1.0)
    assert lds(actual, predictions(masks, 2 * weights + 0.0)) == pytest.approx(1.0)  # scale is free
    assert lds(actual, predictions(masks, np.zeros(8))) is None  # no ranking: undefined
    noisy = actual + rng.normal(scale=0.5, size=32)
    assert lds(noisy, predictions(masks, weights)) == pytest.approx(loop_spearman(noisy, masks @ weights))


def test_lds_per_token_is_the_lds_of_each_column():
    rng = np.random.default_rng(1)
    masks = ablation_masks(6, 32, seed=2)
    w = rng.normal(size=(3, 6))  # (K, S): each token's own linear model
    actual = masks @ w.T  # (M, K)
    per = lds_per_token(actual, predictions(masks, w))
    assert per == pytest.approx([1.0, 1.0, 1.0])
    flipped = w.copy()
    flipped[1] *= -1
    assert lds_per_token(actual, predictions(masks, flipped)) == pytest.approx([1.0, -1.0, 1.0])


def test_top_sources_and_their_removal():
    assert top_sources(np.array([0.2, 0.9, 0.9, -1.0, 0.5]), 3) == [1, 2, 4]  # a tie goes to the earlier source
    assert top_sources(np.array([1.0, 2.0]), 5) == [1, 0]
    assert without(5, [1, 3]).tolist() == [True, False, True, False, True]


def test_hit_ratio_counts_positive_saliency_only():
    scores = np.array([3.0, -2.0, 1.0, np.nan, 4.0, 2.0])
    # evaluated 0..4: positive mass 3 + 1 + 4 = 8; hits {0, 1}: 3
    assert hit_ratio(scores, [0, 1], [0, 1, 2, 3, 4]) == pytest.approx(3 / 8)
    assert hit_ratio(scores, [0, 1, 5], [0, 1, 2, 3, 4]) == pytest.approx(3 / 8)  # outside the evaluated: not counted
    assert hit_ratio(np.array([-1.0, 0.0]), [0], [0, 1]) is None


def test_predictions_apart_only_by_rounding_tie_and_others_keep_their_order():
    """Masks that differ only in a source scored 0 predict the same; a weight of +-6e-16 (a zero spread over tokens
    and summed back) must not order them, while gaps of any meaning keep theirs (`tied`, by hand on 5 values)."""
    masks = np.array([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0]], dtype=bool)
    actual = np.array([-3.0, -2.0, -9.0, -8.0, -7.0])
    values = set()
    for zero in (0.0, 6e-16, -6e-16):
        got = tied(predictions(masks, np.array([1.3, 1.35, zero, 0.75])))
        assert got[0] == got[1] and got[2] == got[3]  # each pair one value
        assert got[4] < got[2] < got[0]  # 1.3 < 1.35 < 3.4 keep their order
        values.add(lds(actual, predictions(masks, np.array([1.3, 1.35, zero, 0.75]))))
    assert len(values) == 1
    spaced = np.array([1.0, 1.0 + 1e-6, np.nan, 3.0])  # a gap of 1e-6 of the scale is a gap; NaN stays NaN
    out = tied(spaced)
    assert out[0] < out[1] < out[3] and np.isnan(out[2])
