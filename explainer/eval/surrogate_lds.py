"""Sources' surrogate on the rows the `lds` command measures, at several ablation counts, as rows of its results file,
so that `python -m explainer lds --report LDS.jsonl,SOURCES.jsonl` joins them by question id with the other methods
and the peers (ContextCite's package at 64 ablations: docs/results/lds-peers-cc-f32-2026-11-28.jsonl).

Per row: the answer is generated greedily and the context is cut into sentences as `lds` cuts it; the `lds`
command's 32 random masks (its seeds: [seed, crc32(row id)]) are measured by removal. For each variant (`options`,
each k of `counts`, each pass kind of `passes`) the surrogate's own masks (`methods/sources.py`: the unperturbed
prompt, then `design` over its units) are measured, and it is fitted as the method fits them (`surrogate.fit`): the
same masks, passes and fit as `get_method("sources", ablations=k, passes=..., **options)` on the same answer (a test
checks it). Masks that several variants share are run once, so a row costs the distinct masks, not their sum. The
entry "sources:...:ablations=k[:passes=knockout]" holds the whole-answer and per-token LDS of the fitted weights over
the context's sentences, raw and centred as `lds` centres a map (each step's token scores minus their mean over the
context tokens), and "fits" the fit's cross-validated Spearman beside what a reader of one answer would get from
`CHECKS` extra random masks (the method's former default `check`): the Spearman on the first `CHECKS` evaluation masks
("check_spearman"), with the LDS on the other masks ("lds_rest") to judge both estimates against.

`paragraphs` > 1: long contexts instead (`datasets.haystack_rows`: the row's paragraph among others, as the
haystack test builds them). `reference` M adds ContextCite's surrogate as its paper defines it, without its package:
M random masks over the context's sentences (each kept with probability 1/2), least squares on the logit of the whole
answer's probability, as "least-squares:masks=M".
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..methods.sources import SourcesConfig, fitted_masks, keep_rows, passages, reread_from
from ..methods.surrogate import chosen_regulariser, spread, surrogate_fit
from ..result.ranks import spearman
from .ablate import response_logprobs
from .haystack import method_label
from .lds import (
    MASKS,
    ablation_masks,
    centred,
    centred_predictions,
    lds,
    lds_per_token,
    logit,
    predictions,
    sentence_keep,
    source_scores,
)
from .lds_eval import answer_row

CHECKS = 4  # extra random masks a reader of one answer would check the fit on (Sources' `check` before 2026-12-03)

@dataclass
class SurrogateLdsConfig:
    counts: tuple[int, ...] = (8, 16, 32, 64)
    options: dict[str, Any] = field(default_factory=dict)  # Sources' options besides `ablations` and `passes`
    more_options: tuple[dict[str, Any], ...] = ()  # further sets of them, each a variant on the same passages
    passes: tuple[str, ...] = ("removal",)
    reference: int = 0  # random masks of a least-squares ContextCite fit (0: none)
    seed: int = 0  # the `lds` command's seed of its masks
    max_new_tokens: int = 16
    command: str = ""


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


class _Pool:
    """Distinct token keep-rows of one pass kind, each measured once."""

    def __init__(self, n: int) -> None:
        self.n, self.rows, self.index = n, [], {}

    def add(self, keep: np.ndarray) -> list[int]:
        out = []
        for row in keep:
            key = row.tobytes()
            if key not in self.index:
                self.index[key] = len(self.rows)
                self.rows.append(row)
            out.append(self.index[key])
        return out


def _plans(attr, tokens: list[int], cfg: SurrogateLdsConfig, removal: _Pool, knockout: _Pool
           ) -> tuple[list, list[tuple]]:  # fmt: skip
    """The passages, and each variant's (label, masks, pool, its rows in the pool, regulariser); every set of options
    must cut the same passages. `tokens`: the prompt's and the scored answer's ids (a design may depend on them)."""
    n, groups, plans = attr.num_prompt_tokens, None, []
    positions = attr.user_positions or list(range(n))
    ids = np.asarray(tokens)  # (T,)
    for given in (cfg.options, *cfg.more_options):
        options = SourcesConfig(**given)
        mine = passages(attr.prompt_tokens, positions, options)
        if groups is not None and [(g.start, g.stop) for g in mine] != [(g.start, g.stop) for g in groups]:
            raise ValueError("every set of options must cut the same passages (the same `context` and `unit`)")
        groups = mine
        for passes in cfg.passes:
            pool = knockout if passes == "knockout" else removal
            for count in cfg.counts:
                drawn = fitted_masks(replace(options, ablations=count), groups, ids, positions, n)  # (A, U)
                masks = np.concatenate([np.ones((1, len(groups)), dtype=bool), drawn])
                label = method_label("sources", {**given, "ablations": count,
                                                 **({"passes": passes} if passes != "removal" else {})})  # fmt: skip
                plans.append((label, masks, pool, pool.add(keep_rows(masks, groups, n)),
                              chosen_regulariser(len(groups), count, options.regulariser)))
    return groups, plans


def measure(bundle, row: dict[str, Any], cfg: SurrogateLdsConfig) -> dict[str, Any]:
    """One row's entries (JSON-able, the `lds` command's row layout)."""
    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["random"], cfg.max_new_tokens)  # the answer (Random costs nothing)
    attr, sentences, k = answered.attr, answered.sentences, answered.k
    n = attr.num_prompt_tokens
    crc = zlib.crc32(str(row["id"]).encode("utf-8"))
    evaluation = ablation_masks(len(sentences), MASKS, 0.5, [cfg.seed, crc])  # (M, S) the `lds` command's
    removal, knockout = _Pool(n), _Pool(n)
    eval_rows = removal.add(sentence_keep(evaluation, sentences, n))
    reference = ablation_masks(len(sentences), cfg.reference, 0.5, [cfg.seed, crc, 1])  # (M', S)
    reference_rows = removal.add(sentence_keep(reference, sentences, n))
    tokens = attr.prompt_token_ids + attr.generated_token_ids[:k]
    groups, plans = _plans(attr, tokens, cfg, removal, knockout)
    ids = torch.as_tensor(tokens, device=bundle.device)
    logp = {}
    for name, pool in (("removal", removal), ("knockout", knockout)):
        if pool.rows:
            reread = reread_from(groups, n) if name == "knockout" else None
            keep = torch.as_tensor(np.stack(pool.rows), device=bundle.device)
            logp[id(pool)] = response_logprobs(bundle.model, ids[:n], ids[n:], keep, reread_from=reread)  # (R, K)
    measured = logp[id(removal)][eval_rows]  # (M, K)
    methods, fits = {}, {}
    for label, masks, pool, rows, regulariser in plans:
        y = logp[id(pool)][rows]  # (R, K)
        surrogate = surrogate_fit(masks, y, regulariser)
        raw = spread(surrogate.weights, [(g.start, g.stop) for g in groups], n)  # (K, N) the method's map
        scores = source_scores(raw, sentences)  # (K, S)
        zero_mean = source_scores(centred(raw, answered.positions), sentences)  # (K, S) as `lds` centres a map
        methods[label] = {
            "lds": lds(measured.sum(axis=1), predictions(evaluation, scores.sum(axis=0))),
            "lds_token": _mean(lds_per_token(measured, predictions(evaluation, scores))),
            "lds_centred": lds(measured.sum(axis=1), centred_predictions(evaluation, zero_mean.sum(axis=0))),
            "lds_token_centred": _mean(lds_per_token(measured, centred_predictions(evaluation, zero_mean))),
        }
        whole, check, rest = scores.sum(axis=0), slice(None, CHECKS), slice(CHECKS, None)  # (S,)
        fits[label] = {"regulariser": regulariser, "penalty": surrogate.penalty, "units": len(groups),
                       "masks": len(masks),
                       "cross_validated_spearman": spearman(y.sum(axis=1), surrogate.checked.sum(axis=1)),
                       "check_spearman": lds(measured[check].sum(axis=1), predictions(evaluation[check], whole)),
                       "lds_rest": lds(measured[rest].sum(axis=1), predictions(evaluation[rest], whole))}  # fmt: skip
    if cfg.reference:
        a = np.concatenate([np.ones((len(reference), 1)), reference.astype(float)], axis=1)
        coef = np.linalg.lstsq(a, logit(logp[id(removal)][reference_rows].sum(axis=1)), rcond=None)[0]
        methods[f"least-squares:masks={cfg.reference}"] = {"lds": lds(measured.sum(axis=1), evaluation @ coef[1:])}
    return {
        "id": row["id"], "answer": attr.generated_text, "dtype": attr.meta.get("dtype"), "n_prompt_tokens": n,
        "n_sentences": len(sentences), "n_response_tokens": k, "fits": fits, "methods": methods,
        "passes_run": {"removal": len(removal.rows), "knockout": len(knockout.rows)},
        "seconds": time.perf_counter() - t0, "command": cfg.command,
    }  # fmt: skip
