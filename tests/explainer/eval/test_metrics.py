"""Metric functions of the answer-span protocol against hand-computed values on tiny inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from explainer.eval.metrics import average_precision, mean_ci, span_labels, step_auc_pr


def test_average_precision_by_hand():
    # ranking: 0.9 (pos), 0.8 (neg), 0.7 (pos): AP = 1/2 * 1 + 1/2 * 2/3
    assert average_precision([1, 0, 1], [0.9, 0.8, 0.7]) == pytest.approx(0.5 + 1 / 3)
    assert average_precision([0, 1], [0.1, 0.9]) == pytest.approx(1.0)
    assert average_precision([1, 0], [0.1, 0.9]) == pytest.approx(0.5)


def test_average_precision_ties_form_one_threshold():
    # all tied: one threshold with precision 1/3 and recall 1 (sklearn gives 1/3)
    assert average_precision([0, 1, 0], [0.5, 0.5, 0.5]) == pytest.approx(1 / 3)
    # tie between a positive and a negative at the top: P=1/2 at R=1/2, then P=2/3 at R=1 -> 1/4 + 1/3
    assert average_precision([1, 0, 1, 0], [0.9, 0.9, 0.5, 0.1]) == pytest.approx(0.25 + 1 / 3)


def test_average_precision_matches_sklearn_definition_on_random_data():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.random(15) < 0.3
        s = np.round(rng.random(15), 1)  # many ties
        # reference: sweep thresholds over distinct scores, descending
        if not y.any():
            assert average_precision(y, s) == 0.0
            continue
        ap, prev_r = 0.0, 0.0
        for t in np.unique(s)[::-1]:
            pred = s >= t
            p, r = (y & pred).sum() / pred.sum(), (y & pred).sum() / y.sum()
            ap += (r - prev_r) * p
            prev_r = r
        assert average_precision(y, s) == pytest.approx(ap)


def test_no_positives_scores_zero_and_step_auc_means_over_spans():
    assert average_precision([0, 0, 0], [0.3, 0.2, 0.1]) == 0.0
    scores = np.array([[0.9, 0.1, 0.5], [0.1, 0.9, 0.5]])  # (K=2, n=3)
    labels = [np.array([1, 0, 0], bool), np.array([0, 1, 0], bool)]
    np.testing.assert_allclose(step_auc_pr(scores, labels), [(1 + 1 / 3) / 2, (1 / 3 + 1) / 2])


def test_span_labels_overlap():
    offsets = [(0, 3), (3, 8), (8, 9), (9, 15)]
    np.testing.assert_array_equal(span_labels(offsets, 4, 9), [False, True, True, False])
    np.testing.assert_array_equal(span_labels(offsets, 15, 20), [False] * 4)


def test_mean_ci():
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == pytest.approx(2.0) and h == pytest.approx(1.96 * 1.0 / math.sqrt(3))
    assert mean_ci([4.0]) == (4.0, 0.0)
    assert all(math.isnan(x) for x in mean_ci([]))
