"""Long contexts in the design lab: which 32-mask design Sources' surrogate should use where the passages are 17-31,
measured once per development long context, then fitted offline (`scripts/sources_design.py collect-long` and
`report-long` are its front end; `design_lab` is the short-context lab).

At 17-31 sentences 32 masks cannot fold (a resolution IV design holds at most 16 factors in 32 runs), so the default
(`surrogate.orthogonal`) is a plain Sylvester Hadamard design: each sentence's effect is orthogonal to the others' but
fully aliased with some two-sentence interactions (column a XOR b). A Paley Hadamard matrix of the same order (`paley`)
is orthogonal too, but no interaction falls on one column in full: each is spread over many, at most a quarter on any
(the "complex aliasing" of Plackett-Burman designs; Hamada & Wu, 1992), which may spare the effects a few large
interactions, and makes interactions with a dominant sentence partly estimable.

`collect_long_row`: the answer's per-token log-probabilities by removal under the unperturbed prompt, the default
design and a Paley design at k = 32 (two seeds each), ContextCite's 64 random masks (the `surrogate` command's
`--reference`, same seeds) and the `lds` command's 32 evaluation masks (removing the sentences as `lds` cuts them).
`report_long`: each design fitted as the method fits (the unperturbed row first) and scored by its LDS on the
evaluation masks, mean over the seeds, paired per question; with `per_token`, the per-token LDS of the fits that share
strength across the answer's tokens (`score_long_tokens`) beside the method's own per-token fit.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np

from ..methods.surrogate import chosen_regulariser, design, fit, ridge_path, surrogate_fit
from .design_lab import _bits, _masks
from .intervals import mean_t, paired_t
from .lds import MASKS, ablation_masks, lds, lds_per_token, logit, predictions, sentence_keep

K = 32  # the masks of every design (the long-context goal's budget)
SEEDS = (0, 1)
REFERENCE = 64  # ContextCite's random masks (least squares on the logit of the whole answer's probability)
ORDER = 32  # the Paley matrix's order: q = 31, prime and 3 mod 4


def paley(q: int) -> np.ndarray:
    """(q + 1, q + 1) Hadamard matrix of +-1 by Paley's first construction (q prime, q = 3 mod 4), rows signed so
    that the first column is all +1: every other column holds (q + 1) / 2 of each sign, any two are orthogonal."""
    if q < 3 or q % 4 != 3 or any(q % d == 0 for d in range(2, int(q**0.5) + 1)):
        raise ValueError(f"Paley's first construction needs a prime q = 3 mod 4, got {q}")
    residues = {(i * i) % q for i in range(1, q)}
    chi = np.array([0] + [1 if d in residues else -1 for d in range(1, q)])  # the quadratic character mod q
    jacobsthal = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]  # (q, q) Q[i, j] = chi(j - i)
    s = np.zeros((q + 1, q + 1), dtype=int)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jacobsthal
    h = np.eye(q + 1, dtype=int) + s  # a skew Hadamard matrix
    return h * h[:, :1]


def paley_design(units: int, seed: int) -> np.ndarray:
    """(32, U) keep-masks: U of the Paley matrix's 31 balanced columns, drawn and sign-flipped from `seed`."""
    if not 0 < units < ORDER:
        raise ValueError(f"a Paley design of order {ORDER} holds 1-{ORDER - 1} units, got {units}")
    rng = np.random.default_rng([seed, 13])
    return (paley(ORDER - 1)[:, 1 + rng.permutation(ORDER - 1)[:units]] * rng.choice([-1, 1], units)) > 0


def long_designs(s: int, row_id: str) -> dict[str, np.ndarray]:
    """Each design's (R, S) keep-masks over s sentences: "all" (the unperturbed row), "hadamard<seed>" (the method's
    default at k = 32), "paley<seed>" (at 31 sentences or fewer), "reference" and "evaluation"."""
    crc = zlib.crc32(str(row_id).encode("utf-8"))
    out = {"all": np.ones((1, s), dtype=bool)}
    for seed in SEEDS:
        out[f"hadamard{seed}"] = design(s, K, "hadamard", seed)
        if s < ORDER:
            out[f"paley{seed}"] = paley_design(s, seed)
    out["reference"] = ablation_masks(s, REFERENCE, 0.5, [0, crc, 1])
    out["evaluation"] = ablation_masks(s, MASKS, 0.5, [0, crc])
    return out


def collect_long_row(bundle, row: dict[str, Any], max_new_tokens: int = 16) -> dict[str, Any]:
    """One long context's pool (JSON-able; log-probabilities rounded to 1e-4): its distinct masks ("masks", the
    evaluation masks last), each design's rows in it ("index") and the (R, K) log-probabilities ("logp")."""
    import torch

    from ..methods.sources import SourcesConfig, keep_rows, passages
    from .ablate import response_logprobs
    from .lds_eval import answer_row

    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["random"], max_new_tokens)
    attr, sentences, k = answered.attr, answered.sentences, answered.k
    n = attr.num_prompt_tokens
    groups = passages(attr.prompt_tokens, attr.user_positions or list(range(n)), SourcesConfig(context="Context"))
    if len(groups) != len(sentences):
        raise ValueError(f"{row['id']}: {len(groups)} passages but {len(sentences)} sentences")
    designs = long_designs(len(groups), row["id"])
    evaluation = designs.pop("evaluation")
    keys: dict[str, int] = {}
    index = {name: [keys.setdefault(_bits(m), len(keys)) for m in masks] for name, masks in designs.items()}
    pooled = _masks(keys)  # (P, S) in first-seen order
    index["evaluation"] = list(range(len(keys), len(keys) + len(evaluation)))
    keep = np.concatenate([keep_rows(pooled, groups, n), sentence_keep(evaluation, sentences, n)])
    ids = torch.as_tensor(attr.prompt_token_ids + attr.generated_token_ids[:k], device=bundle.device)
    logp = response_logprobs(bundle.model, ids[:n], ids[n:], torch.as_tensor(keep, device=bundle.device))
    return {"id": row["id"], "S": len(groups), "n": n, "k": k, "masks": [*keys, *map(_bits, evaluation)],
            "index": index, "logp": np.round(np.asarray(logp, dtype=float), 4).tolist(),
            "seconds": time.perf_counter() - t0}  # fmt: skip


def _rows(r: dict[str, Any], name: str) -> tuple[np.ndarray, np.ndarray]:
    masks = _masks(r["masks"][i] for i in r["index"][name])
    return masks, np.asarray(r["logp"], dtype=float)[r["index"][name]]


FITS = ("hadamard", "paley", "paley-interactions", "hadamard-lasso", "hadamard-logit", "hadamard-token-logit",
        "hadamard-saturating", "random32", "reference")  # the fits `report_long` scores
PENALTIES = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)  # ridge penalties of the interaction fit (times R / 4)


def interaction_weights(masks: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(U,) linear weights of a fit that also models the interactions of the dominant unit: the method's ridge finds
    the unit of the largest |effect|, a; then the whole answer's log-probability is fitted on the units and the
    products x_a * x_b for every other b (the ridge, its penalty by leave-one-out error), and projected back on the
    units under the masks LDS draws (each kept with probability 1/2: x_a * x_b -> (x_a + x_b) / 2 - 1/4). In a
    Sylvester design the products are other units' columns and cannot be told apart; in a Paley design they are
    partly estimable (Hamada & Wu's heredity)."""
    x = masks.astype(float)
    a = int(np.argmax(np.abs(surrogate_fit(masks, y, "ridge").weights.sum(axis=0))))
    others = [b for b in range(x.shape[1]) if b != a]
    coef = fit(np.concatenate([x, x[:, others] * x[:, [a]]], axis=1), y.sum(axis=1, keepdims=True), PENALTIES)[0][0]
    weights, gamma = coef[: x.shape[1]].copy(), coef[x.shape[1] :]
    weights[others] += gamma / 2
    weights[a] += gamma.sum() / 2
    return weights


def score_long(r: dict[str, Any]) -> dict[str, float]:
    """One question's whole-answer LDS per entry of `FITS` (seed-averaged): the method's default fit on the Hadamard
    design and on the Paley design, the Paley design with the dominant unit's interactions
    (`interaction_weights`), each token's Lasso on the Hadamard design, the ridge on the Hadamard design fitted to the
    logit of the whole answer's probability (ContextCite's target) instead of each token's log-probability, the sum
    over the answer's tokens of each token's ridge on the logit of its own probability ("hadamard-token-logit"), the
    method's `regulariser=saturating` on the Hadamard design ("hadamard-saturating", `saturating.py`), the
    ridge on the first 32 reference masks (random ones), and ContextCite's least squares on all 64 (the logit of the
    whole answer's probability)."""
    evaluation, measured = _rows(r, "evaluation")
    y_eval, e = measured.sum(axis=1), evaluation.astype(float)
    everything, y_all = _rows(r, "all")

    def fitted(masks: np.ndarray, y: np.ndarray, regulariser: str) -> float:
        masks, y = np.concatenate([everything, masks]), np.concatenate([y_all, y])
        if regulariser == "interactions":
            return lds(y_eval, predictions(e, interaction_weights(masks, y)))
        if regulariser == "logit":  # the ridge on ContextCite's target: the logit of the whole answer's probability
            target = logit(y.sum(axis=1))[:, None]  # (R, 1)
            return lds(y_eval, predictions(e, surrogate_fit(masks, target, "ridge").weights[0]))
        if regulariser == "token-logit":  # each token's ridge on the logit of its own probability, summed
            return lds(y_eval, predictions(e, surrogate_fit(masks, logit(y), "ridge").weights.sum(axis=0)))
        return lds(y_eval, predictions(e, surrogate_fit(masks, y, regulariser).weights.sum(axis=0)))

    s, out = r["S"], {}
    auto = chosen_regulariser(s, K, "auto")
    for name, regulariser in (("hadamard", auto), ("paley", auto), ("paley-interactions", "interactions"),
                              ("hadamard-lasso", "lasso"), ("hadamard-logit", "logit"), ("hadamard-token-logit",
                              "token-logit"), ("hadamard-saturating", "saturating")):  # fmt: skip
        kind = name.split("-")[0]
        scores = [fitted(*_rows(r, f"{kind}{seed}"), regulariser) for seed in SEEDS if f"{kind}{seed}" in r["index"]]
        if scores:
            out[name] = float(np.mean(scores))
    masks, y = _rows(r, "reference")
    out["random32"] = fitted(masks[:K], y[:K], auto)
    a = np.concatenate([np.ones((len(masks), 1)), masks.astype(float)], axis=1)
    out["reference"] = lds(y_eval, e @ np.linalg.lstsq(a, logit(y.sum(axis=1)), rcond=None)[0][1:])
    return out


TOKEN_FITS = ("hadamard", "hadamard-logit", "hadamard-saturating", "hadamard-shared", "hadamard-rank2", "whole-answer",
              "hadamard64", "reference64")  # the per-token fits `report_long(per_token=True)` scores


def shared_weights(masks: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(K, U) per-token weights that share strength across the answer's tokens: token t's are a_t * w + d_t, w the
    whole answer's weights (the method's ridge on the summed log-probability), a_t free, d_t ridge-penalised (one
    penalty for every token, by leave-one-out error, from `PENALTIES` times R / 4)."""
    x = masks.astype(float)
    w = surrogate_fit(masks, y.sum(axis=1, keepdims=True), "ridge").weights[0]  # (U,)
    a = np.concatenate([(x @ w)[:, None], x], axis=1)  # (R, 1 + U): the whole answer's prediction, free, then the units
    best = None
    for penalty in PENALTIES:
        coef, loo = ridge_path(a, y, np.r_[0.0, np.full(x.shape[1], penalty * len(x) / 4)])
        error = float((loo**2).sum())
        if best is None or error < best[0]:
            best = (error, coef)
    coef = best[1]  # (2 + U, K): intercept, a_t, d_t
    return coef[1][:, None] * w[None, :] + coef[2:].T


def reduced_rank(masks: np.ndarray, y: np.ndarray, rank: int) -> np.ndarray:
    """(K, U) the method's per-token ridge weights cut to their `rank` largest singular directions: every token's map
    a mix of `rank` shared profiles."""
    weights = surrogate_fit(masks, y, "ridge").weights  # (K, U)
    u, s, vt = np.linalg.svd(weights, full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vt[:rank]


def score_long_tokens(r: dict[str, Any]) -> dict[str, float]:
    """One question's per-token LDS (the mean over the answer's tokens where it is defined) per entry of `TOKEN_FITS`,
    seed-averaged: the method's per-token ridge on the Hadamard design (its default at k = 32 below 32 sentences;
    every fit here is a ridge, so a pool of 32 sentences or more is scored as such, not as the method's Lasso), the
    same fitted to each token's logit probability ("hadamard-logit"; ContextCite's target, per token), the method's
    `regulariser=saturating` ("hadamard-saturating"), the fits that
    share strength across tokens on the same masks (`shared_weights`, `reduced_rank` at rank 2, and the whole
    answer's weights for every token), and two ceilings at 64 masks: the method's fit on both Hadamard seeds
    together, and on ContextCite's 64 random masks."""
    evaluation, measured = _rows(r, "evaluation")
    e = evaluation.astype(float)
    everything, y_all = _rows(r, "all")

    def per_token(weights: np.ndarray) -> float:
        known = [v for v in lds_per_token(measured, predictions(e, weights)) if v is not None]
        return float(np.mean(known)) if known else float("nan")

    def rows(*names: str) -> tuple[np.ndarray, np.ndarray]:
        parts = [(everything, y_all), *(_rows(r, name) for name in names)]
        return np.concatenate([m for m, _ in parts]), np.concatenate([y for _, y in parts])

    fits = {"hadamard": lambda m, y: surrogate_fit(m, y, "ridge").weights,
            "hadamard-logit": lambda m, y: surrogate_fit(m, logit(y), "ridge").weights,
            "hadamard-saturating": lambda m, y: surrogate_fit(m, y, "saturating").weights,
            "hadamard-shared": shared_weights,
            "hadamard-rank2": lambda m, y: reduced_rank(m, y, 2),
            "whole-answer": lambda m, y: np.repeat(surrogate_fit(m, y.sum(axis=1, keepdims=True), "ridge").weights,
                                                   y.shape[1], axis=0)}  # fmt: skip
    seeds = [f"hadamard{seed}" for seed in SEEDS if f"hadamard{seed}" in r["index"]]
    out = {name: float(np.mean([per_token(fitted(*rows(seed))) for seed in seeds])) for name, fitted in fits.items()}
    out["hadamard64"] = per_token(surrogate_fit(*rows(*seeds), "ridge").weights)
    out["reference64"] = per_token(surrogate_fit(*rows("reference"), "ridge").weights)
    return out


BINS = ((2, 16), (17, 23), (24, 31), (2, 99))  # sentence counts the report splits by (the last: every question)


def report_long(rows: list[dict[str, Any]], per_token: bool = False) -> list[dict[str, Any]]:
    """Per bin of sentence counts and per fit: N, mean LDS and its 95% t half-width ("half"), and the paired
    difference (mean, 95% t half-width, N) against the default ("hadamard") and against ContextCite's least squares
    ("reference"); with `per_token`, the per-token LDS of `TOKEN_FITS` against the default."""
    scored = [(r["S"], score_long_tokens(r) if per_token else score_long(r)) for r in rows]
    fits, bases = (TOKEN_FITS, ("hadamard",)) if per_token else (FITS, ("hadamard", "reference"))
    out = []
    for lo, hi in BINS:
        chosen = [o for s, o in scored if lo <= s <= hi]
        for name in fits:
            values = [o.get(name) for o in chosen]
            known = [v for v in values if v is not None]
            if not known:
                continue
            mean, half, n = mean_t(known)
            entry = {"sentences": f"{lo}-{hi}" if hi < 99 else "all", "fit": name, "n": n, "lds": mean, "half": half}
            for base in bases:
                if name != base:
                    entry[f"minus {base}"] = paired_t(values, [o.get(base) for o in chosen])
            out.append(entry)
    return out
