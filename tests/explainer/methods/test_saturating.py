"""Sources' saturating surrogate (`explainer/methods/saturating.py`), against straightforward computations: the
least-squares line of a known function over every keep-mask, enumerated by hand; the ridge on a design that aliases
a saturating answer's interactions; fits run on each fold's rows alone."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from explainer.methods import get_method
from explainer.methods.saturating import EXACT, FOLDS, projection_masks, saturating
from explainer.methods.surrogate import chosen_regulariser, design, fit, surrogate_fit
from explainer.result.ranks import spearman

THETA = np.array([1.0, 0.5, -1.0, -3.0, -3.0])


def redundant(x: np.ndarray) -> np.ndarray:
    """An answer's log-probability over keep-masks (R, 5) of five passages, three of them partly redundant."""
    return -3.0 + 1.5 * np.log(1.0 + np.asarray(x, dtype=float) @ np.exp(THETA))


def line_over_every_mask(f, units: int) -> np.ndarray:
    """The least-squares line's weights through f over all 2^units keep-masks, each mask built by hand."""
    rows = [list(bits) for bits in itertools.product((0.0, 1.0), repeat=units)]
    a = np.array([[1.0, *row] for row in rows])
    y = np.array([float(f(np.array([row]))[0]) for row in rows])
    return np.linalg.lstsq(a, y, rcond=None)[0][1:]


def test_the_fit_of_a_saturating_answer_is_its_line_over_every_mask():
    masks = np.array(list(itertools.product((False, True), repeat=5)))  # every mask: the model is identified
    weights, intercepts, _, checked = saturating(masks, redundant(masks)[:, None])
    want = line_over_every_mask(redundant, 5)
    np.testing.assert_allclose(weights[0], want, atol=0.01 * np.abs(want).max())  # the priors' pull only
    assert weights.shape == (1, 5) and intercepts.shape == (1,) and checked.shape == (32, 1)


def test_on_a_plain_design_it_ranks_masks_as_the_answer_does_where_the_ridge_cannot():
    """24 passages in 32 masks: each unit's column is aliased with the redundant passages' interactions, which the
    ridge takes for effects; the saturating model has them in its shape."""
    rng = np.random.default_rng(0)
    small = rng.normal(0.0, 0.05, 21)

    def answer(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.log(0.05 + x[:, 0] + 0.8 * x[:, 1] + 0.5 * x[:, 2]) + x[:, 3:] @ small

    for seed in range(5):
        masks = np.concatenate([np.ones((1, 24), dtype=bool), design(24, 32, "hadamard", seed)])
        y = answer(masks)[:, None]
        fresh = rng.random((256, 24)) < 0.5  # masks LDS draws
        ours = spearman(answer(fresh), fresh @ saturating(masks, y)[0][0])
        ridge = spearman(answer(fresh), fresh @ fit(masks, y)[0][0])
        assert ours > 0.97 and ours > ridge + 0.04, (seed, ours, ridge)


def test_its_check_predicts_each_row_from_a_fit_on_the_other_folds():
    rng = np.random.default_rng(1)
    masks = np.concatenate([np.ones((1, 6), dtype=bool), rng.random((15, 6)) < 0.5])
    y = np.stack([redundant(masks[:, :5]) + 0.1 * masks[:, 5], -redundant(masks[:, 1:])], axis=1)  # (16, 2)
    _, _, _, checked = saturating(masks, y)
    for f in range(FOLDS):
        out = np.arange(len(masks)) % FOLDS == f
        w, b, _, _ = saturating(masks[~out], y[~out])  # the other folds' rows alone
        np.testing.assert_allclose(checked[out], masks[out] @ w.T + b, rtol=1e-9, atol=1e-9)


def test_the_projection_enumerates_small_prompts_and_draws_the_same_masks_for_large_ones():
    every = projection_masks(3)
    assert {tuple(row) for row in every} == set(itertools.product((0.0, 1.0), repeat=3))
    assert len(projection_masks(EXACT)) == 2**EXACT
    large = projection_masks(EXACT + 7)
    np.testing.assert_array_equal(large, projection_masks(EXACT + 7))
    assert abs(large.mean() - 0.5) < 0.01


def test_it_takes_the_ridge_s_place_and_leaves_the_lasso_where_units_outnumber_masks():
    assert chosen_regulariser(20, 32, "saturating") == "saturating"
    assert chosen_regulariser(32, 32, "saturating") == "lasso"
    masks = np.array(list(itertools.product((False, True), repeat=5)))
    got = surrogate_fit(masks, redundant(masks)[:, None], "saturating")
    np.testing.assert_allclose(got.weights, saturating(masks, redundant(masks)[:, None])[0])
    assert get_method("sources", regulariser="saturating").config.regulariser == "saturating"
    with pytest.raises(ValueError, match="ridge, lasso or saturating here"):
        surrogate_fit(masks, redundant(masks)[:, None], "auto")
