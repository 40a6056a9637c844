"""The Lasso that Sources' surrogate fits where the units outnumber the masks (ContextCite's regulariser): each answer
token's own Lasso with an unpenalised intercept, by cyclic coordinate descent over the units with warm starts along a
path of penalties (glmnet's scheme: Friedman, Hastie & Tibshirani, 2010), the penalty chosen per token by
cross-validation. The folds' fits and the whole one's are solved together (`lassos`), so the loop over the units runs
once for all of them.
"""

from __future__ import annotations

import numpy as np

LASSO_GRID = (0.5, 0.25, 0.1, 0.05, 0.02, 0.01)  # fractions of each token's smallest all-zero penalty, large
# to small (each fit starts from the previous one's weights)
FOLDS = 5  # cross-validation folds of the Lasso's penalty
SWEEPS = 100  # coordinate-descent sweeps at most per fit
TOLERANCE = 1e-4  # a Lasso stops where no weight moves the fit by more than this fraction of its targets' range


def lasso(
    x: np.ndarray, y: np.ndarray, penalty: np.ndarray, start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each token's Lasso with an unpenalised intercept, min (1/2R) |y_k - b_k - x w_k|^2 + penalty_k |w_k|_1, by
    cyclic coordinate descent over the units, all tokens at once.

    Args:
        x: (R, U) float. y: (R, K). penalty: (K,). start: (U, K) weights to start from (warm start), or None.

    Returns:
        weights (U, K) and intercepts (K,).
    """
    every = np.ones((1, len(x)), dtype=bool)
    w, b = lassos(x, y, every, np.asarray(penalty, dtype=np.float64)[None], None if start is None else start[None])
    return w[0], b[0]


def _centred(x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each problem's rows (P, R) centred on their own means: count (P, 1), mean_x (P, U), mean_y (P, K), and the
    centred xc (P, R, U) and yc (P, R, K), 0 on the rows a problem leaves out."""
    inside = rows.astype(np.float64)[:, :, None]  # (P, R, 1)
    count = np.maximum(inside.sum(axis=1), 1.0)  # (P, 1)
    mean_x, mean_y = (inside * x).sum(axis=1) / count, (inside * y).sum(axis=1) / count  # (P, U), (P, K)
    return count, mean_x, mean_y, (x[None] - mean_x[:, None]) * inside, (y[None] - mean_y[:, None]) * inside


def lassos(
    x: np.ndarray, y: np.ndarray, rows: np.ndarray, penalty: np.ndarray, start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """P problems of `lasso` over the same masks at once, problem p fitted on the rows `rows[p]` only (the folds of
    a cross-validation and the whole): one coordinate-descent loop over the units updates every problem and token,
    so the Python loop runs once, not once per problem. The loop stops once every problem's largest move in a sweep
    is under `TOLERANCE` of its targets' range. A problem that got there earlier is swept on meanwhile, so it is not
    bit-equal to `lasso` on its rows alone: a sweep of coordinate descent never raises the objective, so its
    objective is at most the lone run's (on the bench's text, 47 sentences and 16 masks, the weights differ by up to
    0.3% of the targets' range at 0.05 of the largest penalty).

    Args:
        x: (R, U) float. y: (R, K). rows: (P, R) bool. penalty: (P, K). start: (P, U, K) or None.

    Returns:
        weights (P, U, K) and intercepts (P, K).
    """
    count, mean_x, mean_y, xc, yc = _centred(x, y, rows)
    norms = (xc**2).sum(axis=1)  # (P, U)
    scale = np.where(norms > 1e-12, norms, 1.0)  # a unit constant on a problem's rows stays at 0 there
    w = np.zeros((len(rows), x.shape[1], y.shape[1])) if start is None else start.copy()  # (P, U, K)
    residual = yc - np.einsum("pru,puk->prk", xc, w)  # (P, R, K)
    threshold = np.asarray(penalty, dtype=np.float64) * count  # (P, K)
    tolerance = TOLERANCE * np.maximum(np.abs(yc).max(axis=(1, 2)), 1e-12)  # (P,)

    column = np.ascontiguousarray(np.moveaxis(xc, 2, 0))  # (U, P, R) unit j's centred column in each problem
    across, down = column[:, :, None, :], column[:, :, :, None]  # (U, P, 1, R), (U, P, R, 1)
    norm, size = norms.T[:, :, None], np.sqrt(norms.T)  # (U, P, 1), (U, P)
    divide = scale.T[:, :, None]  # (U, P, 1)

    low, high = -threshold, threshold
    changes = np.zeros_like(w.transpose(1, 0, 2))  # (U, P, K) each unit's last move in the current sweep

    def sweep(units: np.ndarray) -> np.ndarray:  # one pass over `units`; each problem's largest move
        for j in units:
            old = w[:, j].copy()  # (P, K)
            rho = (across[j] @ residual)[:, 0] + norm[j] * old  # (P, K)
            new = (rho - np.minimum(np.maximum(rho, low), high)) / divide[j]  # soft-thresholded
            w[:, j] = new
            change = np.subtract(new, old, out=changes[j])
            np.subtract(residual, down[j] * change[:, None, :], out=residual)
        return (np.abs(changes[units]).max(axis=2) * size[units]).max(axis=0)  # (P,)

    every = np.flatnonzero((norms > 1e-12).any(axis=0))
    for _ in range(SWEEPS):  # a sweep over every unit, then over the nonzero ones until they settle (glmnet's
        if (sweep(every) < tolerance).all():  # active set): most units stay at zero
            break
        active = every[np.abs(w[:, every]).max(axis=(0, 2)) > 0]
        for _ in range(SWEEPS):
            if (sweep(active) < tolerance).all():
                break
    return w, mean_y - np.einsum("pu,puk->pk", mean_x, w)


def _lasso_path(x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """`lassos` at every fraction of `LASSO_GRID` of each problem's and token's smallest all-zero penalty, large to
    small (each from the previous one's weights): a list of ((P, U, K), (P, K))."""
    count, _, _, xc, yc = _centred(x, y, rows)
    largest = np.abs(np.einsum("pru,prk->puk", xc, yc)).max(axis=1) / count  # (P, K)
    path, w = [], None
    for fraction in LASSO_GRID:
        w, b = lassos(x, y, rows, fraction * largest, w)
        path.append((w, b))
    return path


def cross_validated_lasso(masks: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """ContextCite's regulariser, per answer token: each token's penalty is the fraction of `LASSO_GRID` with the
    least squared error out of fold (`FOLDS`-fold cross-validation, rows dealt in turn), then the fit on every row.
    Sparse weights suit masks that are fewer than the units, where most units barely move the answer."""
    x, y = np.asarray(masks, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    r, folds = len(x), min(len(x), FOLDS)
    fold = np.arange(r) % folds
    rows = np.concatenate([fold[None] != np.arange(folds)[:, None], np.ones((1, r), dtype=bool)])  # (F + 1, R)
    path = _lasso_path(x, y, rows)  # every fold's fit and the whole one's, together
    out = np.zeros((len(LASSO_GRID), r, y.shape[1]))  # (G, R, K) out-of-fold predictions
    for g, (w, b) in enumerate(path):
        for f in range(folds):
            test = fold == f
            out[g, test] = b[f] + x[test] @ w[f]
    chosen = ((out - y) ** 2).sum(axis=1).argmin(axis=0)  # (K,) the grid index of each token
    tokens = np.arange(y.shape[1])
    weights = np.stack([path[g][0][folds][:, k] for k, g in enumerate(chosen)])  # (K, U)
    intercepts = np.array([path[g][1][folds][k] for k, g in enumerate(chosen)])
    penalty = float(np.median(np.asarray(LASSO_GRID)[chosen]))
    return weights, intercepts, penalty, out[chosen, :, tokens].T
