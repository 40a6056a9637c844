"""How Sources' surrogate should choose its masks, target and passes: measured once per development question, then any
design fitted offline (`scripts/sources_design.py` is its front end).

`collect_row`: the answer's per-token log-probabilities under a pool of keep-masks of the context's sentences, by
removal (ContextCite's ablation, exact) and by knockout (`ablate.response_logprobs(reread_from=...)`: only what
follows the context is recomputed, blind to the removed sentences; much cheaper). The pool is every mask where the
context has at most `EXHAUSTIVE` sentences, else the union of the candidate designs' masks (`DESIGNS` at `COUNTS`
and `FALLBACK_COUNTS`, `SEEDS_LONG` seeds) and 64 random ones; the `lds` command's 32 evaluation masks (same
seeds) are always in it.

`report`: each design, k and pass kind is a choice of pool rows; it is fitted as the method fits (`surrogate.fit`,
the unperturbed row first) and scored by the LDS of its weights on the evaluation masks' removal log-probabilities,
whole answer and per answer token, mean over questions (and seeds). ContextCite's surrogate as its paper defines it
(least squares on the logit of the whole answer's probability, 64 random masks) is the reference row.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np

from ..methods.surrogate import (
    HALF_FRACTION,
    chosen_regulariser,
    design,
    design_rng,
    fit,
    fold_order,
    folded,
    lasso_fit,
)
from ..result.ranks import average_ranks
from .intervals import paired_t
from .lds import MASKS, ablation_masks, lds, lds_per_token, logit, predictions, sentence_keep

EXHAUSTIVE = 8  # sentences up to which the pool holds all 2^S masks (256)
DESIGNS = ("random", "pairs", "loo_pairs", "hadamard")
COUNTS = (8, 16, 32)
FALLBACK_COUNTS = (4, 8)  # k at or below the sentences of enough development questions (16 or more have <= 11)
SEEDS_SHORT, SEEDS_LONG = 5, 2  # seeds per design in the report (pool exhaustive) and in a long context's pool
REFERENCE = 64  # ContextCite's random masks
PAIRS = (  # (design, k, passes) compared per question
    (("hadamard", 16, "removal"), ("loo_pairs", 16, "removal")),
    (("hadamard", 16, "removal"), ("random", 16, "removal")),
    (("hadamard", 16, "removal"), ("reference", REFERENCE, "removal")),
    (("hadamard", 8, "removal"), ("loo_pairs", 8, "removal")),
    (("hadamard", 16, "knockout"), ("hadamard", 16, "removal")),
    (("hadamard", 16, "removal-logit"), ("hadamard", 16, "removal")),
    (("hadamard", 8, "removal-lasso"), ("hadamard", 8, "removal")),
    (("hadamard", 16, "removal-lasso"), ("hadamard", 16, "removal")),
)


def _bits(mask) -> str:
    return "".join("1" if b else "0" for b in mask)


def _masks(strings) -> np.ndarray:
    """(M, S) bool keep-masks from their '0'/'1' strings (`_bits`' inverse)."""
    return np.array([[c == "1" for c in m] for m in strings], dtype=bool)


def pool_masks(s: int, row_id: str) -> tuple[list[str], list[str]]:
    """The pool's distinct masks (row 0 keeps every sentence) and the evaluation masks, as '0'/'1' strings."""
    evaluation = [_bits(m) for m in ablation_masks(s, MASKS, 0.5, [0, zlib.crc32(str(row_id).encode("utf-8"))])]
    if s <= EXHAUSTIVE:
        masks = [_bits(((i >> np.arange(s)) & 1) == 0) for i in range(2**s)]  # i = 0 keeps all
    else:
        masks = [_bits(np.ones(s, dtype=bool))]
        counts = sorted({*COUNTS, *FALLBACK_COUNTS})
        candidates = [design(s, k, kind, seed) for kind in DESIGNS for k in counts for seed in range(SEEDS_LONG)]
        for m in [*np.concatenate(candidates), *design(s, REFERENCE, "random", 0)]:
            masks.append(_bits(m))
    masks.extend(evaluation)
    return list(dict.fromkeys(masks)), evaluation


def collect_row(bundle, row: dict[str, Any], max_new_tokens: int = 16) -> dict[str, Any]:
    """One development question's pool (JSON-able; log-probabilities rounded to 1e-4)."""
    import torch

    from .ablate import response_logprobs
    from .lds_eval import answer_row

    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["random"], max_new_tokens)
    attr, n, ctx = answered.attr, answered.attr.num_prompt_tokens, answered.sentences
    masks, evaluation = pool_masks(len(ctx), row["id"])
    keep = sentence_keep(_masks(masks), ctx, n)
    ids = torch.as_tensor(attr.prompt_token_ids + attr.generated_token_ids[: answered.k], device=bundle.device)
    keep_t = torch.as_tensor(keep, device=bundle.device)
    reread = max(max(s) for s in ctx) + 1  # the first position after the context
    exact = response_logprobs(bundle.model, ids[:n], ids[n:], keep_t)  # (R, K)
    t1 = time.perf_counter()
    knockout = response_logprobs(bundle.model, ids[:n], ids[n:], keep_t, reread_from=min(reread, n - 1))
    t2 = time.perf_counter()
    return {
        "id": row["id"], "k": answered.k, "sentences": len(ctx), "n_prompt_tokens": n, "reread_from": reread,
        "masks": masks, "evaluation": [masks.index(m) for m in evaluation],
        "removal": np.round(exact, 4).tolist(), "knockout": np.round(knockout, 4).tolist(),
        "dtype": attr.meta.get("dtype"), "seconds": {"removal": t1 - t0, "knockout": t2 - t1},
    }  # fmt: skip


def _lds(weights: np.ndarray, masks: np.ndarray, logp: np.ndarray) -> tuple[float | None, float | None]:
    """Whole-answer and mean per-token LDS of (K, S) weights on masks (M, S) against measured logp (M, K), as the
    `surrogate` command scores the method; no per-token LDS for a whole-answer fit (one row of weights)."""
    whole = lds(logp.sum(axis=1), predictions(masks, weights.sum(axis=0)))
    if len(weights) != logp.shape[1]:
        return whole, None
    tokens = [v for v in lds_per_token(logp, predictions(masks, weights)) if v is not None]
    return whole, (float(np.mean(tokens)) if tokens else None)


def score_row(r: dict[str, Any], kind: str, k: int, passes: str, seed: int) -> tuple[float | None, float | None]:
    """The LDS of one design fitted on one question's pool. passes: "removal" or "knockout", fitted as the method
    fits by default (`regulariser=auto`: the ridge, or each token's Lasso where k <= S); "removal-ridge": the ridge
    always; "removal-logit": the fit's target is each token's logit probability, as ContextCite's; "removal-lasso":
    the method's Lasso (`regulariser=lasso`) on the whole answer's log-probability, ContextCite's regulariser, no
    per-token maps; "removal-lasso-tokens": each token's Lasso, as the method fits it. Kind "folded": the fold the
    default drew for `seed` before the half fraction replaced it (`half_fraction`). Kind "reference" is
    ContextCite's least squares on the logit of the whole answer's probability, on `k` random masks."""
    s, index = r["sentences"], {m: i for i, m in enumerate(r["masks"])}
    evaluation = _masks(r["masks"][i] for i in r["evaluation"]).astype(float)
    measured = np.asarray(r["removal"])[r["evaluation"]]  # (32, K)
    y_all = np.asarray(r[passes.split("-")[0]])
    if kind == "reference":
        masks = design(s, k, "random", seed)
        y = y_all[[index[_bits(m)] for m in masks]].sum(axis=1)
        a = np.concatenate([np.ones((len(masks), 1)), masks.astype(float)], axis=1)
        coef = np.linalg.lstsq(a, logit(y), rcond=None)[0]
        return _lds(coef[None, 1:], evaluation, measured)
    drawn = folded(s, fold_order(k), design_rng(seed)) if kind == "folded" else design(s, k, kind, seed)
    masks = np.concatenate([np.ones((1, s), dtype=bool), drawn])
    if any(_bits(m) not in index for m in masks):  # a design drawn after the pool was (`distinct_pairs` beyond
        return None, None  # `EXHAUSTIVE` sentences): this pool cannot score it
    y = y_all[[index[_bits(m)] for m in masks]]
    if passes.endswith("-lasso"):
        return _lds(lasso_fit(masks, y.sum(axis=1, keepdims=True)).weights, evaluation, measured)
    default = passes in ("removal", "knockout")  # fitted as the method fits: each token's Lasso where k <= S
    if passes.endswith("-lasso-tokens") or (default and chosen_regulariser(s, k, "auto") == "lasso"):
        return _lds(lasso_fit(masks, y).weights, evaluation, measured)
    if passes.endswith("-logit"):
        y = logit(y)  # each token's logit p
    return _lds(fit(masks, y)[0], evaluation, measured)


def half_fraction(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a half fraction replaced the fold (`surrogate.orthogonal`; U units and k = 2^(U - 1) masks, U from
    `HALF_FRACTION` to `EXHAUSTIVE`): `report`'s entries for the default (now the half fraction), the fold drawn as the
    default drew it before ("folded", its seeds), and every mask (k = 2^U - 1, the ceiling), over the questions of
    exactly U sentences, with "minus folded": the default's paired difference to the fold, whole answer and per
    token (each question's mean over the seeds)."""
    out = []
    for units in range(HALF_FRACTION, EXHAUSTIVE + 1):
        chosen = [r for r in rows if r["sentences"] == units]
        if not chosen:
            continue
        k = 2 ** (units - 1)
        entries = [_entry(chosen, kind, count, "removal") for kind, count in
                   (("hadamard", k), ("folded", k), ("hadamard", 2**units - 1))]  # fmt: skip
        default, fold = entries[0], entries[1]
        default["minus folded"] = paired_t(default["per_question"], fold["per_question"])
        default["minus folded, per token"] = paired_t(default["per_question_token"], fold["per_question_token"])
        out.extend({**e, "units": units} for e in entries)
    return out


def report(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per design, k and pass kind: mean whole-answer and per-token LDS, and the per-question whole LDS
    (seed-averaged) for paired comparisons."""
    cases = [(kind, k, passes) for k in COUNTS for kind in DESIGNS for passes in ("removal", "knockout")]
    cases += [("hadamard", k, passes) for k in COUNTS for passes in ("removal-logit", "removal-lasso")]
    cases.append(("reference", REFERENCE, "removal"))
    return [_entry(rows, *case) for case in cases]


# the candidate fallbacks; the last is the default (sparse columns and each token's Lasso where k <= S; distinct
# pairs before 2026-12-03: pools collected before then lack the sparse masks of long questions, left unscored)
FALLBACKS = (("loo_pairs", "removal-ridge"), ("pairs", "removal-ridge"), ("loo_pairs", "removal-lasso-tokens"),
             ("pairs", "removal-lasso-tokens"), ("distinct_pairs", "removal"), ("hadamard", "removal"))  # fmt: skip


def fallback(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where no orthogonal design fits (the sentences as many as the masks or more): `report`'s entries for the
    candidate fallbacks, leave-one-out then pairs or complementary pairs, each fitted by the ridge or by each token's
    Lasso, the former default (`distinct_pairs`) and the default (`sparse_columns`), each by the Lasso, over the
    questions with at least k sentences."""
    return [_entry([r for r in rows if r["sentences"] >= k], kind, k, passes)
            for k in FALLBACK_COUNTS for kind, passes in FALLBACKS]  # fmt: skip


def _entry(rows: list[dict[str, Any]], kind: str, k: int, passes: str) -> dict[str, Any]:
    """One case's entry over `rows` (the seeds of `report`)."""
    per_question, per_token, tokens = [], [], []
    for r in rows:
        seeds = range(SEEDS_SHORT if r["sentences"] <= EXHAUSTIVE else SEEDS_LONG)
        if kind == "reference" and r["sentences"] > EXHAUSTIVE:
            seeds = range(1)
        scores = [score_row(r, kind, k, passes, seed) for seed in seeds]
        whole = [w for w, _ in scores if w is not None]
        per_question.append(float(np.mean(whole)) if whole else None)
        token = [t for _, t in scores if t is not None]
        per_token.append(float(np.mean(token)) if token else None)
        tokens.extend(token)
    known = [v for v in per_question if v is not None]
    return {"design": kind, "k": k, "passes": passes, "n": len(known), "lds": float(np.mean(known)) if known else None,
            "lds_token": float(np.mean(tokens)) if tokens else None, "per_question": per_question,
            "per_question_token": per_token}  # fmt: skip


TARGETS = ("log p", "logit p", "p", "ranks of log p")  # monotone scales of the whole answer a projection may fit


def _target(name: str, logp: np.ndarray) -> np.ndarray:
    """(M,) the whole answer's target on scale `name` from its (M,) log-probabilities."""
    if name == "logit p":
        return logit(logp)
    if name == "p":
        return np.exp(logp)
    if name == "ranks of log p":
        return average_ranks(logp)
    return logp


def projections(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The ceiling of a linear surrogate, per target scale: on each question whose pool holds every mask (up to
    `EXHAUSTIVE` sentences), the least-squares projection of the whole answer's target on the sentences over all
    2^S masks (what any k >= 2^S - 1 fits), scored by its LDS on the evaluation masks against the log-probability.
    The weights are rounded to 1e-9 of the largest, so that masks a scale ties (ranks give effects in halves) stay
    tied whatever the solver's rounding. Returns {scale: per-question LDS}, the questions in `rows`' order."""
    out: dict[str, list[float]] = {name: [] for name in TARGETS}
    for r in rows:
        if r["sentences"] > EXHAUSTIVE:
            continue
        masks = _masks(r["masks"]).astype(float)  # (2^S, S)
        logp = np.asarray(r["removal"]).sum(axis=1)  # (2^S,)
        a = np.concatenate([np.ones((len(masks), 1)), masks], axis=1)
        for name in TARGETS:
            weights = np.linalg.lstsq(a, _target(name, logp), rcond=None)[0][1:]
            scale = float(np.abs(weights).max()) or 1.0
            weights = np.round(weights / scale, 9) * scale  # ties stay ties
            out[name].append(lds(logp[r["evaluation"]], predictions(masks[r["evaluation"]], weights)))
    return out


def paired(entries: list[dict[str, Any]], a: tuple, b: tuple) -> tuple[float, float, int]:
    """Mean per-question difference of two report entries (design, k, passes), its 95% t half-width and N."""
    pick = {(e["design"], e["k"], e["passes"]): e["per_question"] for e in entries}
    return paired_t(pick[a], pick[b])
