"""The Lasso's solvers against straightforward computations: the batched coordinate descent (`lasso.lassos`) against
each problem solved alone on its rows; the homotopy (`lasso.homotopy`, which solves the path) against plain
coordinate descent run far past any tolerance, and against the Lasso's optimality conditions written out problem by
problem on 0/1 masks, ties included; and the cross-validated fit (`lasso_fit`) against an explicit loop over its
folds."""

import numpy as np
import pytest

from explainer.methods import lasso as solver
from explainer.methods.lasso import FOLDS, LASSO_GRID, _centred, _lasso_path, lasso, lassos
from explainer.methods.surrogate import lasso_fit, sparse_columns


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


def test_the_cross_validated_fit_is_its_folds_fitted_one_by_one():
    """The path is exact (the homotopy), so it matches the reference run far past tolerance with no setting changed."""
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


def _folds(r: int) -> np.ndarray:
    """(F + 1, R) the rows of the cross-validation's problems, as `cross_validated_lasso` deals them."""
    fold = np.arange(r) % FOLDS
    return np.concatenate([fold[None] != np.arange(FOLDS)[:, None], np.ones((1, r), dtype=bool)])


def _optimal(x, y, w, b, penalty, rows, slack=1e-9):
    """The Lasso's optimality conditions, one problem and token at a time on the problem's own rows: the intercept
    makes the residual sum to 0; an active unit's correlation with the residual is R x penalty, signed as its
    weight; a free unit's is at most that."""
    for p in range(len(rows)):
        xr, yr = x[rows[p]], y[rows[p]]
        for k in range(y.shape[1]):
            residual = yr[:, k] - b[p, k] - xr @ w[p, :, k]
            level = penalty[p, k] * len(xr)
            assert abs(residual.sum()) <= slack * max(level, 1.0)
            c = (xr - xr.mean(axis=0)).T @ residual
            on = w[p, :, k] != 0
            np.testing.assert_allclose(c[on], level * np.sign(w[p, on, k]), atol=slack * level)
            assert (np.abs(c[~on]) <= level * (1 + slack)).all()


@pytest.mark.parametrize("units", [20, 47, 120, 190])
def test_the_homotopy_meets_the_optimality_conditions_on_sparse_0_1_masks_without_coordinate_descent(
        units, monkeypatch):  # fmt: skip
    """The method's own design where the units outnumber the masks (16 sparse masks and the unperturbed row): on a
    fold's rows two units' columns often coincide, so the solution ties; every problem still ends exactly optimal,
    and coordinate descent is never called to finish one (at 20 and 47 units no two columns coincide on any fold's
    rows; at 120 and 190 some do)."""
    monkeypatch.setattr(solver, "lassos", lambda *a, **k: pytest.fail("coordinate descent was called"))
    rng = np.random.default_rng(units)
    x = np.concatenate([np.ones((1, units), dtype=bool), sparse_columns(units, 16, seed=units)]).astype(float)
    truth = rng.standard_t(2, size=(units, 8)) * 0.05
    truth[rng.choice(units, 2, replace=False)] += rng.normal(scale=2.0, size=(2, 8))
    y = x @ truth + rng.normal(scale=0.1, size=(len(x), 8)) - 3.0
    rows = _folds(len(x))
    count, _, _, xc, yc = _centred(x, y, rows)
    largest = np.abs(np.einsum("pru,prk->puk", xc, yc)).max(axis=1) / count
    tied = any((x[rows[p]][:, :, None] == x[rows[p]][:, None, :]).all(axis=0).sum() > units for p in range(FOLDS))
    assert tied == (units >= 120)
    for fraction, (w, b) in zip(LASSO_GRID, _lasso_path(x, y, rows), strict=True):
        _optimal(x, y, w, b, fraction * largest, rows)


def test_the_homotopy_leaves_a_duplicated_column_out_and_keeps_the_fitted_values(monkeypatch):
    """Two identical columns tie at every penalty: the path gives the weight to one of them, and the fitted values
    and the summed weight are the unique ones a solver without the duplicate finds."""
    monkeypatch.setattr(solver, "lassos", lambda *a, **k: pytest.fail("coordinate descent was called"))
    x, y = _problem(4, units=12, masks=16, tokens=3)
    j = int(np.abs((x - x.mean(axis=0)).T @ (y[:, 0] - y[:, 0].mean())).argmax())  # the first to join token 0's
    twin = np.concatenate([x, x[:, [j]]], axis=1)  # unit 12 is unit j again
    rows = np.ones((1, len(x)), dtype=bool)
    for (w, b), (w2, b2) in zip(_lasso_path(x, y, rows), _lasso_path(twin, y, rows), strict=True):
        assert w[0, j, 0] != 0  # the tied unit is in token 0's fit at every penalty
        np.testing.assert_allclose(w2[0, j] + w2[0, 12], w[0, j], atol=1e-9)
        others = np.arange(12) != j
        np.testing.assert_allclose(w2[0, :12][others], w[0, others], atol=1e-9)
        assert ((w2[0, j] == 0) | (w2[0, 12] == 0)).all()
        np.testing.assert_allclose(b2, b, atol=1e-9)


def _path_is_coordinate_descents(x, y):
    """The whole-row path at every fraction of the grid equals each penalty's problem solved alone by the reference."""
    rows = np.ones((1, len(x)), dtype=bool)
    largest = np.abs((x - x.mean(axis=0)).T @ (y - y.mean(axis=0))).max(axis=0) / len(x)
    scale = np.abs(y - y.mean(axis=0)).max()
    for fraction, (w, b) in zip(LASSO_GRID, _lasso_path(x, y, rows), strict=True):
        want_w, want_b = _alone(x, y, fraction * largest)
        np.testing.assert_allclose(w[0], want_w, atol=1e-6 * scale)
        np.testing.assert_allclose(b[0], want_b, atol=1e-6 * scale)


def test_a_problem_the_homotopy_leaves_unsettled_is_finished_by_coordinate_descent(converged, monkeypatch):
    """Cut the homotopy to one step: every problem is then unsettled, and the path is coordinate descent's from
    there, which (run to convergence) is the reference's solution."""
    monkeypatch.setattr(solver, "STEPS", 1)
    _path_is_coordinate_descents(*_problem(5, units=20, masks=16, tokens=3))


def test_a_target_constant_on_a_fold_gets_no_weights_and_every_fit_stays_optimal(monkeypatch):
    """Nine masks of a long prompt's reference pool (19 sentences; docs/results/sources-design-long-f32-2026-11-30)
    and a token the model is sure of, its log-probability -1e-4 on every mask but two, which fold 3 leaves out: on
    that fold's rows the target is constant, and what centring leaves is rounding (about 1e-20). Followed, that
    rounding drove the path to six active units, the rank of the fold's rows, off the optimality conditions by
    hundreds of times the level, and with another rounding a singular active block; the fold's fit is 0 instead,
    and every fit is optimal with no coordinate descent."""
    monkeypatch.setattr(solver, "lassos", lambda *a, **k: pytest.fail("coordinate descent was called"))
    masks = ["1111111111111111111", "0001001010111100010", "1000111110100010010", "0111001100011111100",
             "0011010110010111001", "1010110110111111111", "1010000111101111010", "0101011101111110010",
             "0010100001111011000"]  # fmt: skip
    x = np.array([[c == "1" for c in s] for s in masks], dtype=float)
    y = np.array([-1, -1, -1, -2, -1, -1, -1, -1, -2.0])[:, None] * 1e-4
    rows = _folds(len(x))
    assert np.ptp(y[rows[3]]) == 0 and np.ptp(_centred(x, y, rows)[4][3]) > 0  # constant, but not once centred
    count, _, _, xc, yc = _centred(x, y, rows)
    largest = np.abs(np.einsum("pru,prk->puk", xc, yc)).max(axis=1) / count
    others = [0, 1, 2, 4, 5]
    for fraction, (w, b) in zip(LASSO_GRID, _lasso_path(x, y, rows), strict=True):
        assert (w[3] == 0).all() and b[3, 0] == pytest.approx(-1e-4, rel=1e-12)
        _optimal(x, y, w[others], b[others], (fraction * largest)[others], rows[others])


def test_a_singular_active_block_sends_the_path_to_coordinate_descent(converged, monkeypatch):
    """Where the homotopy meets a singular active block (numpy raises), every problem is fitted by coordinate
    descent instead, which (run to convergence) is the reference's solution."""

    def singular(*args, **kwargs):
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(solver, "homotopy", singular)
    _path_is_coordinate_descents(*_problem(6, units=20, masks=16, tokens=3))
