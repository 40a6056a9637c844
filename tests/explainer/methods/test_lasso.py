"""The batched Lasso (`lasso.lassos`) against straightforward computations: each problem solved alone on its rows,
and the cross-validated fit (`lasso_fit`) against an explicit loop over its folds."""

import numpy as np
import pytest

from explainer.methods import lasso as solver
from explainer.methods.lasso import FOLDS, LASSO_GRID, lasso, lassos
from explainer.methods.surrogate import lasso_fit


def _problem(seed: int, units: int = 30, masks: int = 16, tokens: int = 4):
    """More units than rows, as the surrogate's Lasso sees them, but the columns in general position (continuous):
    there the Lasso's solution is unique (Tibshirani, 2013), so any two solvers must agree on the weights; 0/1 masks
    can tie columns, and then only the fitted values are unique."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(masks + 1, units))
    truth = np.zeros((units, tokens))
    truth[rng.choice(units, 3, replace=False)] = rng.normal(scale=2.0, size=(3, tokens))
    return x, x @ truth + rng.normal(scale=0.1, size=(len(x), tokens)) - 3.0


def _alone(x, y, penalty):
    """One problem's Lasso on its own rows by plain coordinate descent, run far past `lasso`'s tolerance."""
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    norms = (xc**2).sum(axis=0)
    w = np.zeros((x.shape[1], y.shape[1]))
    for _ in range(20000):
        before = w.copy()
        for j in np.flatnonzero(norms > 1e-12):
            rho = xc[:, j] @ (yc - xc @ w) + norms[j] * w[j]
            w[j] = np.sign(rho) * np.maximum(np.abs(rho) - penalty * len(x), 0.0) / norms[j]
        if np.abs(w - before).max() < 1e-12:
            break
    return w, y.mean(axis=0) - x.mean(axis=0) @ w


@pytest.fixture
def converged(monkeypatch):
    """The solver run to convergence, so that it is compared with the reference on the solution, not on where a
    tolerance stopped each (the default's accuracy: `test_the_lasso_meets_its_optimality_conditions...`)."""
    monkeypatch.setattr(solver, "TOLERANCE", 1e-10)
    monkeypatch.setattr(solver, "SWEEPS", 5000)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_batched_problem_is_the_lasso_of_its_own_rows(seed, converged):
    x, y = _problem(seed)
    rows = np.ones((3, len(x)), dtype=bool)
    rows[0, ::3] = False  # three problems on different rows of the same masks
    rows[1, 1::4] = False
    penalty = np.array([[0.05, 0.02, 0.1, 0.03], [0.02, 0.02, 0.02, 0.02], [0.1, 0.05, 0.01, 0.2]])
    w, b = lassos(x, y, rows, penalty)
    scale = np.abs(y - y.mean(axis=0)).max()
    for p in range(3):
        want_w, want_b = _alone(x[rows[p]], y[rows[p]], penalty[p])
        np.testing.assert_allclose(w[p], want_w, atol=1e-6 * scale)
        np.testing.assert_allclose(b[p], want_b, atol=1e-6 * scale)
    one_w, one_b = lasso(x[rows[1]], y[rows[1]], penalty[1])  # one problem through `lasso` is the same as in a batch
    np.testing.assert_allclose(one_w, _alone(x[rows[1]], y[rows[1]], penalty[1])[0], atol=1e-6 * scale)


def test_the_cross_validated_fit_is_its_folds_fitted_one_by_one(converged):
    x, y = _problem(7, units=24, masks=16, tokens=5)
    got = lasso_fit(x, y)
    r = len(x)
    fold = np.arange(r) % FOLDS
    out = np.zeros((len(LASSO_GRID), r, y.shape[1]))
    for f in range(FOLDS):  # by hand: each fold's path on its training rows alone
        train, test = fold != f, fold == f
        xt, yt = x[train], y[train]
        largest = np.abs((xt - xt.mean(axis=0)).T @ (yt - yt.mean(axis=0))).max(axis=0) / len(xt)
        for g, fraction in enumerate(LASSO_GRID):
            w, b = _alone(xt, yt, fraction * largest)
            out[g, test] = b + x[test] @ w
    chosen = ((out - y) ** 2).sum(axis=1).argmin(axis=0)
    scale = np.abs(y - y.mean(axis=0)).max()
    np.testing.assert_allclose(got.checked, out[chosen, :, np.arange(y.shape[1])].T, atol=1e-6 * scale)
    largest = np.abs((x - x.mean(axis=0)).T @ (y - y.mean(axis=0))).max(axis=0) / r
    for k, g in enumerate(chosen):
        want = _alone(x, y[:, k : k + 1], LASSO_GRID[g] * largest[k : k + 1])[0][:, 0]
        np.testing.assert_allclose(got.weights[k], want, atol=1e-6 * scale)


def _objective(x, y, w, b, penalty):
    """(K,) each token's Lasso objective, (1/2R) |y - b - x w|^2 + penalty |w|_1, as `lasso` defines it."""
    return ((y - b - x @ w) ** 2).sum(axis=0) / (2 * len(x)) + penalty * np.abs(w).sum(axis=0)


def test_a_problem_swept_on_after_it_settled_ends_no_worse_than_alone():
    """At the default tolerance the batch sweeps every problem until the slowest settles: the others end where their
    lone runs would have stopped or further down their objective, never above it."""
    rng = np.random.default_rng(3)
    x = (rng.random((17, 40)) < 0.35).astype(float)  # 0/1 masks, more units than rows, as the haystack's
    y = x[:, :3] @ rng.normal(size=(3, 6)) + 0.3 * rng.normal(size=(17, 6))
    rows = np.ones((4, len(x)), dtype=bool)
    for p in range(3):
        rows[p, p::3] = False
    largest = np.abs((x - x.mean(axis=0)).T @ (y - y.mean(axis=0))).max(axis=0) / len(x)
    penalty = np.stack([0.05 * largest] * 4)
    w, b = lassos(x, y, rows, penalty)
    moved = 0.0
    for p in range(4):
        alone_w, alone_b = lasso(x[rows[p]], y[rows[p]], penalty[p])
        batched = _objective(x[rows[p]], y[rows[p]], w[p], b[p], penalty[p])
        assert (batched <= _objective(x[rows[p]], y[rows[p]], alone_w, alone_b, penalty[p]) + 1e-12).all()
        moved = max(moved, float(np.abs(w[p] - alone_w).max()))
    assert moved > 1e-3  # the case in question: some problem was swept on past where it alone stopped
