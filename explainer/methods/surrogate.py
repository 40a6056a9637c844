"""ContextCite's surrogate (Cohen-Wang et al., 2024, section 3): a linear model of the answer's log-probability over
keep-masks of the prompt's units, fitted on a few ablations, one model per answer token.

For R ablations with keep-masks X (R, U) (1 = the unit is kept) and the answer's teacher-forced token log-probabilities
Y (R, K) under each, the surrogate of token k is y_k(x) = b_k + x · w_k. ContextCite fits the whole response's logit
probability with a Lasso on 64 random masks (each unit kept with probability 1/2). Here every answer token gets its
own fit from the same passes, so whole-answer weights are the sum of the tokens' (the fit is linear in Y), and:

- where the units are fewer than the masks, the fit is ridge regression with an unpenalised intercept (Eq. 1 of
  ContextCite with an L2 in place of its L1 penalty), its strength chosen by leave-one-out error (exact, from the hat
  matrix), shared by every answer token; where they are as many or more, ContextCite's Lasso (`chosen_regulariser`;
  the solver: `lasso.py`);
- the masks are a design, not independent draws (`design`). The default, "hadamard", is an orthogonal two-level design
  (`orthogonal`): every mask once where the units are few (2^U - 1 <= k; the fit is then the exact least-squares
  projection that LDS rewards), else the half fraction of the masks removing an odd number of units where it fits
  (2^(U - 1) <= k, from 5 units on; resolution U), else a folded Hadamard design (each unit kept in half of the masks,
  the units' columns orthogonal, and each unit's effect free of every two-unit interaction, which a linear surrogate
  fitted on few random masks mistakes for effects), else a plain Hadamard design, its columns drawn at random
  ("aberration": the columns that alias the fewest interactions with effects, `aberration_columns`; level with the
  default on development and on evaluated questions, docs/results.md); where k is too small for any (k <= U),
  sparse masks in which each unit is kept by the same few masks and no two units share a column (`sparse_columns`),
  which the Lasso fits: a mask keeps about a third of the prompt, so its pass computes about a third of it (before
  2026-12-03, complementary pairs with distinct columns, `distinct_pairs`, half of it; "loo_pairs", leave-one-out
  masks for up to half of them then pairs, the fallback before that, ranked a needle sentence worse: docs/results.md);
- the unperturbed prompt (all kept), whose log-probabilities the first pass computes anyway, is one more row.

`docs/results.md` (Sources) says which of these choices were measured, on which questions, and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .lasso import cross_validated_lasso
from .saturating import saturating

DESIGNS = ("loo_pairs", "pairs", "random", "hadamard", "aberration", "informed", "sparse", "distinct_pairs")
# leave-one-out then pairs; complementary pairs; independent masks; an orthogonal two-level design (every mask, a
# folded Hadamard, or a Hadamard); the same with a plain Hadamard design's columns chosen for minimum aberration; or
# placed by a prior; sparse distinct columns (`sparse_columns`, the orthogonal designs' fallback since 2026-12-03);
# complementary pairs with distinct columns (`distinct_pairs`, the fallback before)
ORTHOGONAL = ("hadamard", "aberration", "informed")  # the designs `orthogonal` builds
INFORMED_RUNS = 16  # the plain design's order whose columns the "informed" design places by a prior (9-15 units at
# 16-31 masks): ahead there on development questions, behind on the whole answer at 32 (docs/results.md)
HALF_FRACTION = 5  # units from which a half fraction (resolution U) replaces a fold (resolution IV) where it fits
MAX_PAIRS = 128  # pairs drawn for every design (256 masks, the most Sources asks for)
SPARSE_KEEP = 0.35  # the share of masks keeping each unit in `sparse_columns`
RIDGE_GRID = (1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)  # penalties tried, in units of the design's scale
REGULARISERS = ("auto", "ridge", "lasso", "saturating")  # auto: ridge where the units are fewer than the masks, else
# lasso; saturating: `saturating.py`'s model where the ridge would be, else lasso


def design(units: int, k: int, kind: str = "pairs", seed=0, prior: np.ndarray | None = None) -> np.ndarray:
    """(k, U) keep-masks. "pairs": x_1, 1 - x_1, x_2, 1 - x_2, ... with each x_i kept with probability 1/2 per unit
    (an odd k ends on an unpaired x), so every unit is kept in half of the paired masks, and the design of k masks
    is the first k rows of every larger one with the same seed; "loo_pairs": first min(U, k // 2) masks that each
    remove one unit (in a seeded order), then pairs; "random": each unit kept with probability 1/2, independently.
    "hadamard": `orthogonal`'s design, then pairs for any masks it leaves of k (none after a full factorial, which
    holds every mask once: fewer than k then run), or `sparse_columns` where none fits (k <= U); "aberration": the
    same, a plain design's columns chosen by `aberration_columns`; "informed": the same as "hadamard" but for a plain
    design of `INFORMED_RUNS` masks, whose columns `prior` places (`informed_columns`; without a prior, as "hadamard").
    "sparse": `sparse_columns`; "distinct_pairs": `distinct_pairs`, whatever the units.
    `seed`: anything `np.random.default_rng` takes. `prior`: (U,) how likely each unit is to matter (>= 0)."""
    if kind == "sparse":
        return sparse_columns(units, k, seed)
    if kind == "distinct_pairs":
        return distinct_pairs(units, k, seed)
    if kind in ORTHOGONAL:
        first = orthogonal(units, k, seed, aberration=kind == "aberration", prior=prior if kind == "informed" else None)
        if first is None:
            return sparse_columns(units, k, seed)
        if len(first) == k or len(first) == 2**units - 1:
            return first
        return np.concatenate([first, design(units, k - len(first), "pairs", seed)])
    if kind == "loo_pairs":
        n = min(units, k // 2)
        loo = ~np.eye(units, dtype=bool)[np.random.default_rng([*np.atleast_1d(seed), 9]).permutation(units)[:n]]
        return np.concatenate([loo, design(units, k - n, "pairs", seed)])  # (k, U)
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.random((k, units)) < 0.5
    if kind != "pairs":
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}, got {kind!r}")
    first = rng.random((MAX_PAIRS, units)) < 0.5  # (P, U) drawn in full whatever k is: nested designs
    return complementary(first)[:k]  # (k, U)


def complementary(codes: np.ndarray) -> np.ndarray:
    """(2P, U) keep-masks x_1, 1 - x_1, x_2, 1 - x_2, ... of (P, U) bool masks x."""
    return np.stack([codes, ~codes], axis=1).reshape(-1, codes.shape[1])


def distinct_pairs(units: int, k: int, seed=0) -> np.ndarray:
    """(k, U) complementary pairs in which no two units are removed by the same masks, where that can be: the k // 2
    first masks of the pairs give each unit a code of k // 2 bits, and a code that repeats another is drawn again
    while the units are at most 2^(k // 2) (an odd k ends on an unpaired random mask). Two units with the same column
    can never be told apart by any fit: with plain pairs, 16 masks tell at most 256 codes apart, and among 175
    sentences the needle shared its code with another about half of the time, the Lasso then weighting whichever it
    visited first (docs/results.md). Every unit is still kept in half of the paired masks."""
    rng = np.random.default_rng([*np.atleast_1d(seed), 11])
    half = k // 2
    codes = rng.random((half, units)) < 0.5  # (k // 2, U)
    if half and units <= 2 ** min(half, 62):
        redraw_repeats(codes, lambda n: rng.random((half, n)) < 0.5)
    masks = complementary(codes)  # (2 * (k // 2), U)
    return np.concatenate([masks, rng.random((k - len(masks), units)) < 0.5])  # (k, U)


def sparse_columns(units: int, k: int, seed=0, keep: float | None = None) -> np.ndarray:
    """(k, U) masks in which each unit is kept by exactly m = round(keep x k) of them (1 to k - 1), no two units
    sharing a column where the units are at most C(k, m) (`redraw_repeats`, as in `distinct_pairs`).
    A mask keeps about `keep` (`SPARSE_KEEP`) of the units, so its removal pass computes about that share of the
    prompt (`ablate.py`), against half for complementary pairs: where the units outnumber the masks and the Lasso
    fits them, 16 such masks ranked as well as 16 pairs for about three quarters of their positions (docs/results.md).
    Beside the unperturbed row, the masks bracket the evaluation's half-kept masks rather than sit on them."""
    keep = SPARSE_KEEP if keep is None else keep
    m = min(max(round(keep * k), 1), max(k - 1, 1))
    rng = np.random.default_rng([*np.atleast_1d(seed), 12])

    def draw(n: int) -> np.ndarray:  # (k, n) columns of m kept masks each, at random
        cols = np.zeros((k, n), dtype=bool)
        cols[np.argsort(rng.random((k, n)), axis=0)[:m], np.arange(n)] = True
        return cols

    masks = draw(units)
    if units <= math.comb(k, m):
        redraw_repeats(masks, draw)
    return masks


def redraw_repeats(columns: np.ndarray, draw) -> None:
    """Draw again, in place, every column of `columns` (R, U) that repeats an earlier one, by `draw(n)` -> (R, n),
    until no two are the same (the caller checks that there are enough distinct columns)."""
    while True:
        _, kept = np.unique(columns.T, axis=0, return_index=True)
        repeats = np.setdiff1d(np.arange(columns.shape[1]), kept)
        if not len(repeats):
            return
        columns[:, repeats] = draw(len(repeats))


def sylvester(n: int) -> np.ndarray:
    """(n, n) Hadamard matrix of +-1 (n a power of two): its columns are orthogonal, and every column but the first
    (all +1) holds n / 2 of each sign."""
    h = np.ones((1, 1), dtype=np.int8)
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h


def orthogonal(units: int, k: int, seed=0, aberration: bool = False, prior: np.ndarray | None = None
               ) -> np.ndarray | None:  # fmt: skip
    """An orthogonal two-level design over `units` in at most k keep-masks, or None where k is too small (k <= U).

    - every mask but the unperturbed one where 2^U - 1 <= k (a full factorial: the fit is then the exact
      least-squares projection of the answer's log-probability on the units, what LDS scores over random masks);
    - else, from `HALF_FRACTION` units on, the half fraction where 2^(U - 1) <= k: every mask that removes an odd
      number of units (each unit's leave-one-out mask among them, the unperturbed prompt not, so that its row adds a
      17th point to 16 masks). Its one alias word holds all U units (resolution U: each effect is aliased only with
      the interaction of all the other units), where a fold's is IV. It is the same design for every seed but for
      the order of its masks. On development questions of 5 sentences at k = 16 it was ahead of the fold per
      answer token, and in the mean on the whole answer (docs/results.md);
    - else a folded Hadamard design where U <= n, n the largest power of two with 2n <= k: n rows of a Sylvester
      matrix over U of its columns, then each row's complement (2n masks). Every unit is kept in half of them, any
      two units' columns are orthogonal, and the fold makes each unit's estimated effect free of every two-unit
      interaction (a resolution IV design; Box, Hunter & Hunter, ch. 6): interactions are what a linear surrogate
      fitted on few random masks mistakes for effects;
    - else a plain Hadamard design where U < n, n the largest power of two <= k: n masks over U of its columns but
      the first (effects orthogonal, each aliased with some two-unit interactions; resolution III).

    The columns are drawn and each one's signs flipped at random from `seed`, so different seeds give different
    designs of the same kind; `aberration`: a plain design's columns are `aberration_columns` instead, in a random
    order, from 16 runs on (at 8 every choice aliases as much, so the draw stays; the other kinds do not change);
    `prior`: a plain design of `INFORMED_RUNS` masks takes `informed_columns` instead (at other orders the draw
    stays: at 32 the placement was measured on development long contexts and not kept; at 8 and 64 not measured).
    Returns (R, U) bool, R <= k."""
    rng = design_rng(seed)
    kind, n = _orthogonal_kind(units, k)
    if kind in ("every mask", "half fraction"):  # few units: every mask, or those removing an odd number of units
        removed = ((np.arange(2**units)[:, None] >> np.arange(units)) & 1) == 1  # (2^U, U) bit set: removed
        chosen = ~(removed[1:] if kind == "every mask" else removed[removed.sum(axis=1) % 2 == 1])  # row 0 keeps all
        return chosen[rng.permutation(len(chosen))]
    if kind == "folded Hadamard":
        return folded(units, n, rng)
    if kind == "Hadamard":
        fewest = aberration and n >= 16  # at 8 runs every choice of columns holds as many words (the Fano plane)
        if prior is not None and n == INFORMED_RUNS:
            columns = informed_columns(n, np.asarray(prior, dtype=np.float64), rng)
        else:
            columns = aberration_columns(n, units, rng) if fewest else 1 + rng.permutation(n - 1)[:units]
        return sylvester(n)[:, columns] * rng.choice([-1, 1], units) > 0  # (n, U)
    return None


def design_rng(seed) -> np.random.Generator:
    """The generator `orthogonal` draws a design from for `seed`."""
    return np.random.default_rng([*np.atleast_1d(seed), 7])


def fold_order(k: int) -> int:
    """n, the largest power of two with 2n <= k: the Sylvester order of a folded design of at most k masks."""
    return 1 << max(0, (k // 2).bit_length() - 1)


def folded(units: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """(2n, U) a folded Hadamard design: n rows of a Sylvester matrix over U <= n of its columns drawn at random, each
    column's signs flipped at random, then each row's complement."""
    h = sylvester(n)[:, rng.permutation(n)[:units]] * rng.choice([-1, 1], units)  # (n, U)
    return np.concatenate([h > 0, h < 0])  # (2n, U): the rows, then their complements


def aberration_columns(n: int, units: int, rng: np.random.Generator) -> np.ndarray:
    """(U,) columns of a Sylvester matrix of order n (1 to n - 1; U < n) with the fewest aliases: a unit's column is
    aliased with the two-unit interaction of columns a and b where it is column a XOR b (a "word" of three columns).
    The n / 2 columns of odd bit count hold no word (an odd XOR an odd is even), so they come first (drawn at random
    where they are more than enough); each even one after them is the one that adds the fewest words (ties at
    random). For n = 16 this gives the minimum-aberration 16-run designs' word counts (Box, Hunter & Hunter, ch. 6):
    4, 8, 12, 16, 22, 28 and 35 words at 9 to 15 units, against 6.5 to 35 for columns drawn at random."""
    odd = [c for c in range(1, n) if bin(c).count("1") % 2]
    chosen = [int(c) for c in rng.permutation(odd)[:units]]
    rest = [int(c) for c in rng.permutation([c for c in range(1, n) if not bin(c).count("1") % 2])]
    while len(chosen) < units:
        held = set(chosen)
        words = [sum((c ^ a) in held for a in chosen) for c in rest]  # each new word counted twice
        chosen.append(rest.pop(int(np.argmin(words))))
    return np.asarray(chosen)[rng.permutation(units)]


def informed_columns(n: int, prior: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(U,) columns of a Sylvester matrix of order n (1 to n - 1; n / 2 < U < n) placed by `prior` (U,), how likely
    each unit is to matter: in a plain design a word of three columns a XOR b XOR c = 0 aliases each one's effect
    with the other two's interaction, and an interaction is large where both of its units matter. So the units most
    likely to matter take the n / 2 columns of odd bit count (no word among them; in a random order), and each other
    unit, from the likeliest down, the free even column whose new words alias the least: a word's cost is the sum of
    its three pairs' prior products (ties: the fewest words, then the order `rng` draws, so a flat prior gives
    `aberration_columns`' word counts). Each even column aliases n / 4 pairs of odd columns, so this is where the prior
    decides: the interaction of the two likeliest units lands on no unit's effect where a free column can take it."""
    units = len(prior)
    p = prior / prior.max() if prior.max() > 0 else np.zeros(units)
    ranked = rng.permutation(units)
    ranked = ranked[np.argsort(-p[ranked], kind="stable")]  # likeliest first, ties in a random order
    odd = [c for c in range(1, n) if bin(c).count("1") % 2]
    even = [int(c) for c in rng.permutation([c for c in range(1, n) if not bin(c).count("1") % 2])]
    column = dict(zip(ranked[: len(odd)].tolist(), rng.permutation(odd).tolist(), strict=False))
    for u in ranked[len(odd) :].tolist():
        held = {c: v for v, c in column.items()}
        words = [[(held[a], held[a ^ c]) for a in held if (a ^ c) in held and a < (a ^ c)] for c in even]
        cost = [(sum(p[u] * (p[v] + p[w]) + p[v] * p[w] for v, w in pairs), len(pairs)) for pairs in words]
        column[u] = even.pop(min(range(len(even)), key=cost.__getitem__))  # the least aliased, then fewest words
    return np.asarray([column[u] for u in range(units)])


def _orthogonal_kind(units: int, k: int) -> tuple[str | None, int]:
    """Which orthogonal design `orthogonal` builds over `units` in at most k masks, and its Sylvester order n."""
    if 2**units - 1 <= k:
        return "every mask", 0
    if units >= HALF_FRACTION and 2 ** (units - 1) <= k < 2**units - 1:
        return "half fraction", 2 ** (units - 1)
    n = fold_order(k)
    if units <= n and 2 * n <= k:
        return "folded Hadamard", n
    n = 1 << max(0, k.bit_length() - 1)
    return ("Hadamard", n) if units < n else (None, 0)


def design_kind(units: int, k: int, kind: str) -> str:
    """What `design(units, k, kind)` holds, in words for a reader: "every mask", "half fraction" (each unit's effect
    aliased only with the interaction of all the others), "folded Hadamard" (each unit's effect free of two-unit
    interactions), "Hadamard" (effects aliased with interactions; "overlap-placed Hadamard" where "informed" places
    its columns by the answer's overlap), "leave-one-out then pairs", "complementary pairs", "sparse" or "random"."""
    if kind in ORTHOGONAL:
        name, n = _orthogonal_kind(units, k)
        placed = kind == "informed" and name == "Hadamard" and n == INFORMED_RUNS
        return "overlap-placed Hadamard" if placed else name or "sparse"
    return {"loo_pairs": "leave-one-out then pairs", "pairs": "complementary pairs", "random": "random",
            "sparse": "sparse", "distinct_pairs": "complementary pairs"}[kind]  # fmt: skip


def ridge_path(x: np.ndarray, y: np.ndarray, penalty: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ridge with an unpenalised intercept: the (U + 1, K) coefficients (intercept first) and the (R, K) leave-one-out
    residuals (each row predicted by the fit without it: e_i / (1 - h_ii)). `penalty`: one for every column of x, or
    (U,) one per column (0: that column is free)."""
    a = np.concatenate([np.ones((len(x), 1)), x], axis=1)  # (R, U + 1)
    d = np.diag(np.r_[0.0, np.broadcast_to(np.asarray(penalty, dtype=np.float64), (x.shape[1],))])
    inverse = np.linalg.pinv(a.T @ a + d)  # (U + 1, U + 1)
    coef = inverse @ a.T @ y  # (U + 1, K)
    h = np.einsum("ij,jk,ik->i", a, inverse, a)  # (R,) leverages
    residual = y - a @ coef
    return coef, residual / np.maximum(1.0 - h, 1e-9)[:, None]


def fit(masks: np.ndarray, targets: np.ndarray, grid: Sequence[float] = RIDGE_GRID) -> tuple[np.ndarray, np.ndarray,
                                                                                                 float]:  # fmt: skip
    """The surrogate of every answer token.

    Args:
        masks: (R, U) bool keep-masks. targets: (R, K) the answer's token log-probabilities under each.
        grid: ridge penalties tried (times R / 4, so that a penalty means the same at any R); the one with the least
            summed leave-one-out squared error over the rows and tokens wins.

    Returns:
        weights (K, U), intercepts (K,), the penalty chosen (float64 arithmetic; the caller keeps float32).
    """
    x, y = np.asarray(masks, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    best = None
    for penalty in grid:
        coef, loo = ridge_path(x, y, penalty * len(x) / 4)
        error = float((loo**2).sum())
        if best is None or error < best[0] - 1e-12:
            best = (error, coef, penalty)
    _, coef, penalty = best
    return coef[1:].T, coef[0], float(penalty)


def cross_validated(masks: np.ndarray, targets: np.ndarray, penalty: float) -> np.ndarray:
    """(R, K) each row's prediction by the fit on the other rows (same penalty): a check that costs no pass."""
    x, y = np.asarray(masks, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    _, loo = ridge_path(x, y, penalty * len(x) / 4)
    return y - loo


def spread(weights: np.ndarray, spans: Sequence[tuple[int, int]], n: int) -> np.ndarray:
    """(K, N) float32 token map: each unit's weight (K, U) shared evenly by its tokens [start, stop), so summing a
    step's map over a unit's tokens gives its weight back; tokens outside every unit get 0."""
    out = np.zeros((weights.shape[0], n), dtype=np.float32)  # (K, N)
    for u, (start, stop) in enumerate(spans):
        out[:, start:stop] = (weights[:, u] / (stop - start))[:, None]
    return out


@dataclass
class Fit:
    """A surrogate fitted on R masks: weights (K, U), intercepts (K,), the penalty chosen (ridge: its strength; lasso:
    the median over tokens of the chosen fraction of the penalty that zeroes every unit) and `checked` (R, K), each
    row predicted by a fit without it (ridge: leave-one-out, exact; lasso: out of fold), a check that costs no pass."""

    weights: np.ndarray
    intercepts: np.ndarray
    penalty: float
    checked: np.ndarray


def chosen_regulariser(units: int, k: int, regulariser: str) -> str:
    """The regulariser a fit over `units` on k masks uses: "auto" is the ridge where the units are fewer than the
    masks (the orthogonal designs' regime, where every unit's weight is estimated), else ContextCite's Lasso (the
    units outnumber the masks, so only a sparse answer can be recovered: on 16 complementary pairs over a 43-sentence
    haystack it ranked the needle first on every prompt and left the other sentences at 0, docs/results.md); "ridge"
    and "lasso" are kept; "saturating" is `saturating.py`'s model where "auto" takes the ridge, else the Lasso."""
    if regulariser not in REGULARISERS:
        raise ValueError(f"regulariser must be one of {', '.join(REGULARISERS)}, got {regulariser!r}")
    if regulariser in ("ridge", "lasso"):
        return regulariser
    dense = "saturating" if regulariser == "saturating" else "ridge"
    return dense if units < k else "lasso"


def surrogate_fit(masks: np.ndarray, targets: np.ndarray, regulariser: str = "ridge") -> Fit:
    """The surrogate of every answer token, with a ridge (`fit`) or a Lasso (`lasso_fit`) penalty, or the saturating
    model projected on the units (`saturating.saturating`); "auto" is resolved by the caller, `chosen_regulariser`."""
    if regulariser == "lasso":
        return lasso_fit(masks, targets)
    if regulariser == "saturating":
        return Fit(*saturating(masks, targets))
    if regulariser != "ridge":
        raise ValueError(f"regulariser must be ridge, lasso or saturating here, got {regulariser!r}")
    weights, intercepts, penalty = fit(masks, targets)
    return Fit(weights, intercepts, penalty, cross_validated(masks, targets, penalty))


def lasso_fit(masks: np.ndarray, targets: np.ndarray) -> Fit:
    """ContextCite's regulariser, per answer token (`lasso.cross_validated_lasso`): each token's penalty chosen out of
    fold, then the fit on every row. Sparse weights suit masks that are fewer than the units, where most units barely
    move the answer."""
    return Fit(*cross_validated_lasso(masks, targets))
