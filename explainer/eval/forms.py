"""Which calibrated form of MACS predicts ablations better than MACS, judged honestly (`scripts/calibration_forms.py`).

A form turns a row's measured maps into one score per source (the context's sentences, as `lds_eval` cuts them); its
LDS is the Spearman correlation over the row's 32 ablation masks of the measured log p(response) against the sum of
the kept sources' scores, exactly as the `lds` command scores a method (`lds.py`). Rows are `calibrate.
collect_forms_row`'s arrays. The forms, each chosen to be able to change the ranking of the masks (a positive scale
of the scores cannot):

- `macs`: MACS's raw scores, summed over the answer's steps and each source's tokens (the baseline);
- `temperature`: every layer factor raised to one power tau (log c -> tau log c), a global temperature;
- `intercept`: signed scores, t_p - beta mean(t) per token (a length term: a source loses beta x its length x the
  mean) plus delta x the mean source score per kept source (an intercept per source);
- `blend`: (1 - lambda) MACS + lambda Sources (`sources`, its defaults), each divided by its sum of |scores|;
- `layer`: one exponent per layer, `macs_calibrated`'s form, fitted with the `calibrate` command's objective (AT2's:
  minus the mean Pearson over the masks) and its default pull (l2 0.1);
- `shipped`: the layer weights that ship with the package, fixed. They were fitted on rows 200-209 of the
  350-question dev file, training rows here, so they are no candidate (their training score is partly in-sample):
  `layer` is their form refitted honestly; they are scored on the held-out rows beside the chosen form.

Selection (`cross_validate`): on the training rows only, each candidate's parameters are chosen on four fifths of them
(a grid search on the mean LDS, or the layer fit) and scored on the fifth left out, so every training row gets an
out-of-fold LDS; the form with the best mean is the one chosen. `held_out` then fits it on all training rows and
scores it once on rows it never saw, paired against MACS with a t interval (`metrics.paired_difference`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np

from .calibrate import fit_weights
from .metrics import paired_difference, spearman

Row = dict[str, np.ndarray]
Params = dict[str, Any]
FOLDS = 5
TEMPERATURES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0)
BETAS = tuple(np.round(np.linspace(-1.0, 2.0, 13), 2))  # 0: MACS; 1: zero-mean over the context's tokens
DELTAS = tuple(np.round(np.linspace(-1.0, 1.0, 9), 2))
LAMBDAS = tuple(np.round(np.linspace(0.0, 1.0, 21), 2))  # 0: MACS; 1: Sources alone
LAYER_L2 = 0.1  # the `calibrate` command's default pull towards w = 1
CANDIDATES = ("macs", "temperature", "intercept", "blend", "layer")  # what the selection may choose


def _per_source(tokens: np.ndarray, row: Row) -> np.ndarray:
    """(S,) the sum of a (P,) token vector over each source's tokens."""
    return np.bincount(row["source"], weights=tokens, minlength=row["masks"].shape[1])


def _log_product(row: Row, weights: np.ndarray | float = 1.0) -> np.ndarray:
    """(K, P) sum_l w_l log f_l, shifted so its largest entry is 0 (a positive scale the LDS ignores; float64 needs
    it for deep models)."""
    z = np.einsum("klp,l->kp", row["features"].astype(np.float64), np.broadcast_to(weights, row["features"].shape[1]))
    return z - z.max()


def _macs(row: Row, p: Params) -> np.ndarray:
    return _per_source(row["macs"].astype(np.float64).sum(axis=0), row)


def _temperature(row: Row, p: Params) -> np.ndarray:
    return _per_source(np.exp(p["tau"] * _log_product(row)).sum(axis=0), row)


def _intercept(row: Row, p: Params) -> np.ndarray:
    t = row["macs"].astype(np.float64).sum(axis=0)  # (P,)
    scores = _per_source(t - p["beta"] * t.mean(), row)  # (S,)
    return scores + p["delta"] * _per_source(t, row).mean()


def _unit(scores: np.ndarray) -> np.ndarray:
    total = np.abs(scores).sum()
    return scores / total if total > 0 else scores


def _blend(row: Row, p: Params) -> np.ndarray:
    macs = _unit(_macs(row, p))
    sources = _unit(_per_source(np.nan_to_num(row["sources"].astype(np.float64)).sum(axis=0), row))
    return (1.0 - p["lambda"]) * macs + p["lambda"] * sources


def _layer(row: Row, p: Params) -> np.ndarray:
    return _per_source(np.exp(_log_product(row, np.asarray(p["weights"], dtype=np.float64))).sum(axis=0), row)


def _fit_layer(rows: list[Row]) -> Params:
    return {"weights": fit_weights(rows, LAYER_L2)["weights"]}


@dataclass(frozen=True)
class Form:
    """One way to score sources: `scores(row, params)` -> (S,), and how its parameters are chosen on training rows:
    a grid searched on the mean LDS, a fit, or nothing (fixed parameters)."""

    name: str
    scores: Callable[[Row, Params], np.ndarray]
    grid: dict[str, Sequence[float]] = field(default_factory=dict)
    fit: Callable[[list[Row]], Params] | None = None
    fixed: Params = field(default_factory=dict)

    def choose(self, rows: list[Row]) -> Params:
        """The parameters chosen on `rows` (training rows only)."""
        if self.fit is not None:
            return self.fit(rows)
        if not self.grid:
            return dict(self.fixed)
        candidates = [dict(zip(self.grid, values)) for values in product(*self.grid.values())]
        means = [_mean(lds_values(self, p, rows)) for p in candidates]
        return candidates[int(np.argmax(means))]  # the first best


def forms(shipped_weights: Sequence[float] | None = None) -> dict[str, Form]:
    """The forms, in table order; `shipped` only when weights are given (a baseline, not a candidate: `CANDIDATES`)."""
    out = {
        "macs": Form("macs", _macs),
        "temperature": Form("temperature", _temperature, {"tau": TEMPERATURES}),
        "intercept": Form("intercept", _intercept, {"beta": BETAS, "delta": DELTAS}),
        "blend": Form("blend", _blend, {"lambda": LAMBDAS}),
        "layer": Form("layer", _layer, fit=_fit_layer),
    }
    if shipped_weights is not None:
        out["shipped"] = Form("shipped", _layer, fixed={"weights": list(shipped_weights)})
    return out


def _mean(values: np.ndarray) -> float:
    """The mean over the rows where the LDS is defined; -inf where it is nowhere (a form that ranks nothing)."""
    return float(np.nanmean(values)) if np.isfinite(values).any() else -np.inf


def usable(rows: list[Row]) -> list[Row]:
    """The rows with an LDS: masks that change the measured log-probability (the `lds` command skips the others)."""
    return [r for r in rows if np.ptp(r["actual"]) > 0]


def lds_values(form: Form, params: Params, rows: list[Row]) -> np.ndarray:
    """(R,) each row's LDS under the form; NaN where the prediction is constant over the masks."""
    out = []
    for row in rows:
        value = spearman(row["actual"], row["masks"].astype(np.float64) @ form.scores(row, params))
        out.append(np.nan if value is None else value)
    return np.asarray(out, dtype=np.float64)


def folds(n: int, k: int = FOLDS, seed: int = 0) -> list[np.ndarray]:
    """k disjoint index sets covering range(n), shuffled with `seed`."""
    return [np.sort(part) for part in np.array_split(np.random.default_rng(seed).permutation(n), min(k, n))]


def cross_validate(form: Form, rows: list[Row], k: int = FOLDS) -> np.ndarray:
    """(R,) out-of-fold LDS of every training row: the form's parameters chosen on the other folds."""
    out = np.full(len(rows), np.nan)
    for part in folds(len(rows), k):
        left_out = set(part.tolist())
        rest = [row for i, row in enumerate(rows) if i not in left_out]
        out[part] = lds_values(form, form.choose(rest), [rows[i] for i in part])
    return out


def select(train: list[Row], candidates: dict[str, Form], k: int = FOLDS) -> dict[str, Any]:
    """Every form's out-of-fold LDS on the training rows, paired against MACS's, and the form chosen (the best mean).

    Returns:
        {"forms": [{"form", "cv_lds", "vs_macs": paired_difference}], "chosen": name}.
    """
    base = lds_values(candidates["macs"], {}, train)
    table = []
    for name, form in candidates.items():
        values = base if name == "macs" else cross_validate(form, train, k)
        table.append({"form": name, "cv_lds": float(np.nanmean(values)), "vs_macs": paired_difference(values, base)})
    chosen = max(table, key=lambda r: r["cv_lds"])["form"]
    return {"forms": table, "chosen": chosen}


def held_out(form: Form, train: list[Row], test: list[Row], baselines: dict[str, Form]) -> dict[str, Any]:
    """The chosen form fitted on every training row and scored once on `test`, paired against MACS; the `baselines`
    (fixed forms, nothing fitted on `test`) scored beside it for context.

    Returns:
        {"form", "params", "lds": mean, "vs_macs": paired_difference, "baselines": {name: {"lds", "vs_macs"}}}.
    """
    params = form.choose(train)
    values = lds_values(form, params, test)
    base = lds_values(baselines["macs"], {}, test)
    shown = {}
    for name, b in baselines.items():
        fixed = lds_values(b, b.fixed, test)
        shown[name] = {"lds": float(np.nanmean(fixed)), "vs_macs": paired_difference(fixed, base)}
    plain = {k: np.asarray(v, dtype=np.float64).tolist() for k, v in params.items()}  # numbers or lists, for JSON
    return {"form": form.name, "params": plain, "lds": float(np.nanmean(values)),
            "vs_macs": paired_difference(values, base), "baselines": shown}  # fmt: skip
