"""Metric functions of the removal and pi-Soft protocols against hand-computed values on tiny inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from explainer.faithfulness.metrics import (
    PI_GRID,
    REMOVAL_FRACTIONS,
    bleu,
    calibrate,
    hellinger,
    minmax,
    normalised_auc,
    rouge_l_f1,
    srg,
)


def test_normalised_auc_and_srg_signs():
    f = REMOVAL_FRACTIONS
    assert normalised_auc(f, [1.0] * 6) == pytest.approx(1.0)
    # linear drop from 1 to 0 over [0, 0.2]: area 0.1, / 0.2 = 0.5
    assert normalised_auc(f, [1 - x / 0.2 for x in f]) == pytest.approx(0.5)
    # by hand on a coarse grid: trapezoids (1 + .5)/2 * .1 + (.5 + .5)/2 * .1 = .125, / .2
    assert normalised_auc([0, 0.1, 0.2], [1, 0.5, 0.5]) == pytest.approx(0.625)
    # a faithful method: removing important tokens first hurts more than removing unimportant ones
    assert srg(auc_lif=0.98, auc_mif=0.6) > 0  # logit / ROUGE / BLEU: higher is better
    assert srg(auc_lif=1.0, auc_mif=1.3) < 0  # perplexity rises under MIF: more negative is better


@pytest.mark.parametrize("pi", PI_GRID)
def test_calibrate_hits_pi(pi):
    rng = np.random.default_rng(1)
    s = minmax(rng.normal(size=200))
    out = calibrate(s, pi)
    assert abs(out.mean() - pi) <= 1e-3
    assert np.all((out >= 0) & (out <= 1))
    assert np.all(np.diff(out[np.argsort(s)]) >= -1e-12)  # the transform keeps the ranking


@pytest.mark.parametrize("pi", [0.05, 0.5, 0.95])
@pytest.mark.parametrize(
    "scores", [np.zeros(7), np.full(7, 3.0), np.array([0.0, 1.0]), np.array([0, 0, 0, 0, 1.0]), np.ones(3)]
)
def test_calibrate_edge_cases(scores, pi):
    out = calibrate(minmax(scores), pi)
    assert abs(out.mean() - pi) <= 1e-3
    assert np.all((out >= 0) & (out <= 1))


def test_minmax():
    np.testing.assert_allclose(minmax(np.array([2.0, 4.0, 3.0])), [0, 1, 0.5])
    np.testing.assert_allclose(minmax(np.array([5.0, 5.0])), [0, 0])


def test_hellinger_known_distributions():
    p = np.array([0.5, 0.5, 0.0])
    assert hellinger(p, p) == pytest.approx(0.0)
    assert hellinger(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    q = np.array([0.25, 0.75, 0.0])
    by_hand = math.sqrt((math.sqrt(0.5) - 0.5) ** 2 + (math.sqrt(0.5) - math.sqrt(0.75)) ** 2) / math.sqrt(2)
    assert hellinger(p, q) == pytest.approx(by_hand)
    np.testing.assert_allclose(hellinger(np.stack([p, q]), p), [0.0, by_hand])  # batched over rows


def test_text_similarity():
    assert rouge_l_f1("the cat sat", "the cat sat") == pytest.approx(1.0)
    # LCS 3 of candidate 3 / reference 4 tokens: P = 1, R = 3/4, F1 = 6/7
    assert rouge_l_f1("the cat sat", "the cat sat down") == pytest.approx(6 / 7)
    assert bleu("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1.0)
    assert 0.0 <= bleu("a dog", "the cat sat on the mat") < 0.2
    assert bleu("anything", "") == 0.0
