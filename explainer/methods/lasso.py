"""The Lasso that Sources' surrogate fits where the units outnumber the masks (ContextCite's regulariser): each answer
token's own Lasso with an unpenalised intercept, the penalty chosen per token by cross-validation over a grid of
fractions of its largest useful penalty.

The path is solved exactly by the homotopy (Osborne, Presnell & Turlach, 2000; LARS with its Lasso modification,
Efron et al., 2004, section 3.1): from the largest penalty down, the active units' weights move along a line, and the
line changes only where a unit joins (its correlation with the residual reaches the penalty) or leaves (its weight
reaches 0). With R masks at most R - 1 units are active, so a path takes a few dozen steps, each a solve of an active
set of at most R units; every problem (the folds' fits and the whole one's, times the answer's tokens) takes its steps
together (`homotopy`), so the loop runs over steps, not over units. Cyclic coordinate descent (`lassos`, glmnet's
scheme: Friedman, Hastie & Tibshirani, 2010), the solver before 2026-12-05, is kept as the reference of the tests and
finishes any problem the homotopy leaves unsettled (`_lasso_path`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LASSO_GRID = (0.5, 0.25, 0.1, 0.05, 0.02, 0.01)  # fractions of each token's smallest all-zero penalty, large
# to small (the order the path reaches them)
FOLDS = 5  # cross-validation folds of the Lasso's penalty
SWEEPS = 100  # coordinate-descent sweeps at most per fit
TOLERANCE = 1e-4  # a Lasso stops where no weight moves the fit by more than this fraction of its targets' range
STEPS = 2000  # homotopy steps at most (a path takes tens to a few hundred); a problem not at its last penalty by
# then, or whose optimality conditions fail by more than `SLACK`, is finished by coordinate descent
SLACK = 1e-6  # the relative miss of a unit's correlation with the residual that counts as a failure
PARALLEL = 1e-10  # a free unit whose correlation falls as fast as the level, to this much, never reaches it: its
# column lies in the active units' span and ties with them (two units with one column), so it is left out
FLAT = 1e-12  # a target whose centred values span this share of its size is constant: its weights are 0


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


@dataclass
class _State:
    """The homotopy's state, a row per problem (B): the weights `w` (B, U); the active units' signs `sign` (B, U),
    0 for a free unit; `level` (B,), the penalty times the problem's rows, which every active unit's correlation
    with the residual equals in size; `targets` (F, B), the levels to record, large to small; and `grid` (B,), the
    index of the next one."""

    w: np.ndarray
    sign: np.ndarray
    level: np.ndarray
    targets: np.ndarray
    grid: np.ndarray


@dataclass
class _Line:
    """The live problems' (L) current line: the active units padded to m, `order` (L, m) and `valid` (L, m); the
    Gram matrix's columns of the active units `cols` (L, U, m) and their block `gaa` (L, m, m); the active weights
    `wa` (L, m) and their move per unit fall of the level `d` (L, m), gaa^-1 sign; each unit's correlation with the
    residual `c` (L, U) and its move `a` (L, U)."""

    order: np.ndarray
    valid: np.ndarray
    cols: np.ndarray
    gaa: np.ndarray
    wa: np.ndarray
    d: np.ndarray
    c: np.ndarray
    a: np.ndarray


def _line(state: _State, gram: np.ndarray, owner: np.ndarray, corr: np.ndarray, live: np.ndarray) -> _Line:
    active = state.sign[live] != 0  # (L, U)
    n = active.sum(axis=1)
    m = max(int(n.max()), 1)
    order = np.argsort(~active, axis=1, kind="stable")[:, :m]  # (L, m) the active units first
    valid = np.arange(m)[None] < n[:, None]  # (L, m)
    units = np.arange(gram.shape[1])
    cols = gram[owner[live][:, None, None], units[None, :, None], order[:, None, :]] * valid[:, None, :]  # (L, U, m)
    gaa = np.take_along_axis(cols, order[:, :, None], axis=1) + np.eye(m)[None] * ~valid[:, :, None]  # (L, m, m)
    wa = np.take_along_axis(state.w[live], order, axis=1) * valid  # (L, m)
    d = np.linalg.solve(gaa, (np.take_along_axis(state.sign[live], order, axis=1) * valid)[..., None])[..., 0]
    c = corr[live] - np.einsum("lum,lm->lu", cols, wa)  # (L, U) recomputed each step, so no error accumulates
    return _Line(order, valid, cols, gaa, wa, d, c, np.einsum("lum,lm->lu", cols, d))


def _event(state: _State, line: _Line, live: np.ndarray) -> tuple[np.ndarray, ...]:
    """How far each live problem's level falls to its next event, t (L,), which event (0: the next grid penalty;
    1: the active unit `unit` (L,) reaches 0 and leaves; 2: the free unit `unit` reaches the level and joins)."""
    level = state.level[live][:, None]
    free = state.sign[live] == 0  # one that just left moves inward: it does not rejoin at once
    with np.errstate(divide="ignore", invalid="ignore"):  # |c - t a| = level - t, from above or from below
        up = np.where(free & (1.0 - line.a > PARALLEL), (level - line.c) / (1.0 - line.a), np.inf)
        down = np.where(free & (1.0 + line.a > PARALLEL), (level + line.c) / (1.0 + line.a), np.inf)
        zero = np.where(line.valid & (line.wa != 0), -line.wa / line.d, np.inf)
    join = np.maximum(np.minimum(up, down), 0.0)  # (L, U) at most 0: already there (ties, rounding)
    zero = np.where(zero > 0, zero, np.inf)  # (L, m)
    rows = np.arange(len(live))
    joins, leaves = join.argmin(axis=1), zero.argmin(axis=1)
    t_join, t_leave = join[rows, joins], zero[rows, leaves]
    t_grid = np.maximum(state.level[live] - state.targets[state.grid[live], live], 0.0)
    kind = np.where(t_grid <= np.minimum(t_join, t_leave), 0, np.where(t_leave < t_join, 1, 2))
    t = np.choose(kind, [t_grid, t_leave, t_join])
    return t, kind, np.where(kind == 1, line.order[rows, leaves], joins)


def _advance(state: _State, line: _Line, live: np.ndarray, out: np.ndarray) -> None:
    """Moves every live problem to its next event, records a grid penalty's weights in `out` (F, B, U), and lets
    the unit leave or join."""
    t, kind, unit = _event(state, line, live)
    w = np.zeros((len(live), state.w.shape[1]))
    np.put_along_axis(w, line.order, (line.wa + t[:, None] * line.d) * line.valid, axis=1)
    state.w[live], state.level[live] = w, state.level[live] - t
    b = live[kind == 0]
    out[state.grid[b], b] = state.w[b]
    state.grid[b] += 1
    b, j = live[kind == 1], unit[kind == 1]
    state.w[b, j], state.sign[b, j] = 0.0, 0.0
    joining = np.flatnonzero(kind == 2)
    moved = line.c[joining, unit[joining]] - t[joining] * line.a[joining, unit[joining]]
    state.sign[live[joining], unit[joining]] = np.sign(moved)


def homotopy(gram: np.ndarray, owner: np.ndarray, corr: np.ndarray, fractions) -> tuple[np.ndarray, np.ndarray]:
    """B Lasso paths at once, each exact: problem b's weights at the levels fraction x max|corr[b]| (the penalty
    times the problem's rows), for each fraction of `fractions` (large to small).

    Args:
        gram: (P, U, U) each design's centred Gram matrix X^T X. owner: (B,) the design of each problem.
        corr: (B, U) each problem's X^T y (centred). fractions: (F,) decreasing, in (0, 1].

    Returns:
        weights (F, B, U), and settled (B,): whether the problem reached its last level within `STEPS`.
    """
    b_, u_ = corr.shape
    top = np.abs(corr).max(axis=1)  # (B,) the level from which every weight is 0
    rows = np.arange(b_)
    first = np.abs(corr).argmax(axis=1)
    sign = np.zeros((b_, u_))
    sign[rows, first] = np.sign(corr[rows, first])
    targets = np.asarray(fractions, dtype=np.float64)[:, None] * top[None]  # (F, B)
    state = _State(np.zeros((b_, u_)), sign, top.copy(), targets, np.where(top > 0, 0, len(fractions)))
    out = np.zeros((len(fractions), b_, u_))  # a problem with no signal stays at 0
    for _ in range(STEPS):
        live = np.flatnonzero(state.grid < len(fractions))
        if not len(live):
            break
        _advance(state, _line(state, gram, owner, corr, live), live, out)
    return out, state.grid >= len(fractions)


def _kkt_failed(xc: np.ndarray, yc: np.ndarray, w: np.ndarray, level: np.ndarray) -> np.ndarray:
    """(P, K) whether a fit misses the Lasso's optimality conditions by more than `SLACK` of its level (the penalty
    times the rows): each active unit's correlation with the residual equals the level, signed as its weight, and
    no free unit's exceeds it."""
    c = np.einsum("pru,prk->puk", xc, yc - np.einsum("pru,puk->prk", xc, w))  # (P, U, K)
    miss = np.where(w != 0, np.abs(c - np.sign(w) * level[:, None]), np.abs(c) - level[:, None])
    return (miss > SLACK * level[:, None]).any(axis=1)


def _lasso_path(x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every problem's and token's Lasso at each fraction of `LASSO_GRID` of its smallest all-zero penalty, large to
    small, by the homotopy: a list of ((P, U, K) weights, (P, K) intercepts). A target constant on a problem's rows
    gets no weights (centred, it is rounding). A problem the homotopy left unsettled or off its optimality
    conditions, or a homotopy that met a singular active block, is finished by coordinate descent from there."""
    count, mean_x, mean_y, xc, yc = _centred(x, y, rows)
    flat = np.ptp(yc, axis=1) <= FLAT * np.abs(y).max(axis=0)  # (P, K) a target constant on the problem's rows
    yc = np.where(flat[:, None, :], 0.0, yc)  # (what centring leaves is rounding, which a path would chase)
    p_, u_, k_ = xc.shape[0], xc.shape[2], yc.shape[2]
    corr = np.einsum("pru,prk->pku", xc, yc).reshape(p_ * k_, u_)  # (P K, U)
    try:
        weights, settled = homotopy(np.einsum("pru,prv->puv", xc, xc), np.repeat(np.arange(p_), k_), corr, LASSO_GRID)
    except np.linalg.LinAlgError:  # a singular active block (none seen on the method's designs): all by descent
        weights, settled = np.zeros((len(LASSO_GRID), p_ * k_, u_)), np.zeros(p_ * k_, dtype=bool)
    largest = np.abs(corr).max(axis=1).reshape(p_, k_) / count  # (P, K) each token's smallest all-zero penalty
    path = []
    for g, fraction in enumerate(LASSO_GRID):
        w = weights[g].reshape(p_, k_, u_).transpose(0, 2, 1)  # (P, U, K)
        if (_kkt_failed(xc, yc, w, fraction * largest * count) | ~settled.reshape(p_, k_)).any():
            w, _ = lassos(x, y, rows, fraction * largest, w)
        path.append((w, mean_y - np.einsum("pu,puk->pk", mean_x, w)))
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
