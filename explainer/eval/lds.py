"""The field's attribution metrics over sources (sentences), in plain numpy (no model, no torch).

- **LDS**, the linear datamodeling score (ContextCite, Cohen-Wang et al. 2024, section 4; AT2, 2025): draw M random
  ablation masks over the S sources (each kept with probability 1/2), measure the model's log-probability of the
  fixed response under each, predict it from the method as the sum of the kept sources' scores, and take the
  Spearman correlation of the two over the M masks. ContextCite and AT2 regress the response's logit-probability,
  log p - log(1 - p), rather than log p: an increasing function of log p, so the ranks, hence the LDS, are the same.
- **Top-k log-probability drop** (ContextCite, section 4): log p(response | all sources) - log p(response | all but
  the method's k highest-scored sources); higher is better.
- **Hit ratio** (ABO, "The Fragile Truth of Saliency", the long-context needle test): the share of a map's positive
  saliency that lies on the tokens that matter (system prompt, needle, query) among the evaluated tokens.

A source's score is the **sum** of the method's raw token scores over its tokens, not their mean: the surrogate
predicts log p(masked) as a constant plus the scores of the kept tokens, so a sentence weighs what its tokens weigh
together: a long sentence whose every token matters a little counts as much as removing it does, where a mean would
rank it with a one-token sentence of the same average. For the whole answer, a source's score is the sum of its
per-step scores over the answer's steps, the surrogate of log p(response) = sum over steps of log p(token): each
step's row is taken as that step's surrogate. Tokens without a score (NaN) count as 0.

**Which scale enters.** The method's raw scores, as it returns them (not z-scores): the surrogate adds scores up, and
a sum means something only on the scale the method produces; a z-score per step would divide each step by its own
spread, which changes how much each answer token counts in the whole-answer sum. Spearman's correlation makes the LDS
blind to any one positive factor of the whole map, so the raw scale's unit does not matter, only its zero and the
steps' relative weights do.

**Raw and centred.** Scores that are positive everywhere (Random, attention methods, MACS) predict more for masks that
keep more sources (more tokens), and the answer's log-probability also tends to grow with the context kept: such a map
gets a positive LDS without any ranking (Random: about 0.56). `centred` gives zero-mean scores (each step's row minus
its mean over the context tokens, before the tokens are summed into sentences), which takes the token-count term out;
then a sentence scores above 0 only where its tokens score above the step's mean, and keeping every sentence predicts 0,
as keeping none does: the two masks tie (`centred_predictions`), whatever the rounding. The field's LDS (ContextCite,
AT2) scores signed surrogate weights, raw; a surrogate fits on purpose that keeping more context raises the answer's
log-probability, so centring lowers it too (ContextCite 0.885 raw, 0.590 centred: docs/results.md). Both are reported
for every method and reference (`centred_sources` for a sentence-level map): the raw LDS is what a user of the raw map
gets, the centred one what its ranking alone earns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..faithfulness.lds import lds, predictions, source_scores  # noqa: F401  (the LDS of one answer; re-exported)

MASKS = 32  # ablation masks per example (ContextCite and AT2)
KEEP_PROBABILITY = 0.5  # each source kept with this probability (ContextCite's ablation_keep_prob, AT2's alpha)
TOP_K = (1, 3, 5)  # sources removed for the top-k log-probability drop


def ablation_masks(n_sources: int, n_masks: int = MASKS, keep: float = KEEP_PROBABILITY, seed=0) -> np.ndarray:
    """Random ablation masks: (M, S) booleans, True = the source is kept, each independently with probability `keep`.

    Args:
        seed: anything `np.random.default_rng` takes (an int, or a list of ints such as [run seed, row number]);
            the same seed gives the same masks.
    """
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must lie in [0, 1], got {keep}")
    return np.random.default_rng(seed).random((n_masks, n_sources)) < keep


def spread(scores: Sequence[float], sources: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """One (N,) token map of S source scores, each shared evenly by its source's tokens (other positions 0): a
    sentence-level map read at token level, with `source_scores` of it giving `scores` back.

    Args:
        scores: (S,) one score per source.
        sources: S lists of prompt positions, disjoint.
        n: the prompt's length N.
    """
    out = np.zeros(n, dtype=np.float64)
    for score, positions in zip(scores, sources):
        if len(positions):
            out[list(positions)] = float(score) / len(positions)
    return out


def logit(logp: np.ndarray) -> np.ndarray:
    """logit p = log p - log(1 - p) of log-probabilities (ContextCite's target), elementwise; float64."""
    lp = np.asarray(logp, dtype=np.float64)
    return lp - np.log(-np.expm1(np.minimum(lp, -1e-7)))


def sentence_keep(masks: np.ndarray, sentences: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """(M, N) token keep-rows of (M, S) sentence keep-masks over an N-token prompt (the last prompt token always stays:
    it predicts the answer's first one)."""
    keep = np.ones((len(masks), n), dtype=bool)
    for s, positions in enumerate(sentences):
        keep[np.ix_(~np.asarray(masks, dtype=bool)[:, s], list(positions))] = False
    keep[:, n - 1] = True
    return keep


def centred(raw: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    """Zero-mean scores: each step's row minus its mean over `positions` (finite scores only); (K, N) float64."""
    r = np.atleast_2d(np.asarray(raw, dtype=np.float64))  # (K, N)
    pos = np.asarray(positions, dtype=np.int64)
    sub = r[:, pos]  # (K, P)
    known = np.isfinite(sub)
    count = np.maximum(known.sum(axis=1, keepdims=True), 1)
    mean = np.where(known, sub, 0.0).sum(axis=1, keepdims=True) / count  # (K, 1)
    return r - mean


def centred_sources(scores: Sequence[float], sources: Sequence[Sequence[int]], positions: Sequence[int],
                    n: int) -> np.ndarray:  # fmt: skip
    """(S,) source scores as the centred LDS reads a token map's (`lds_eval`): each shared evenly by its source's
    tokens (`spread`), each token minus the mean over `positions` (`centred`), summed back per source: a score minus
    the mean times the source's length, so no term grows with the tokens a mask keeps. For a sentence-level map (a
    reference's)."""
    return source_scores(centred(spread(scores, sources, n), positions), sources)[0]


CENTRED_TIE = 1e-9  # predictions of a centred map this close to 0, relative to its scores' absolute sum, are 0


def centred_predictions(masks: np.ndarray, centred_scores: np.ndarray) -> np.ndarray:
    """`predictions` of a centred map ((S,) or (K, S) scores from `centred` or `centred_sources`; (M,) or (M, K)).

    Centring makes the sources' scores sum to 0 (where the sources cover the centred positions), so a mask that keeps
    every source predicts exactly what one that keeps none does: 0. Float rounding leaves the first at about 1e-16 of
    the scores' scale, above or below 0 depending on the order a CPU sums in, and the Spearman would rank the two
    masks apart (on a few sentences, where such masks are drawn, by up to 0.09 of LDS between two CPUs). Predictions
    within `CENTRED_TIE` of the scores' absolute sum of 0 are therefore 0: the two masks tie, as they do exactly.
    """
    p = predictions(masks, centred_scores)
    scale = np.abs(np.asarray(centred_scores, dtype=np.float64)).sum(axis=-1)  # () or (K,)
    return np.where(np.abs(p) <= CENTRED_TIE * scale, 0.0, p)


def raw_and_centred(total: np.ndarray, masks: np.ndarray, scores: np.ndarray, centred_scores: np.ndarray) -> dict:
    """{"lds", "lds_centred"}: a sentence-level map's LDS over (M, S) masks, `total` (M,) the whole answer's log p
    under each, from its (S,) scores and from their `centred_sources`."""
    return {"lds": lds(total, predictions(masks, scores)),
            "lds_centred": lds(total, centred_predictions(masks, centred_scores))}  # fmt: skip


def lds_per_token(actual: np.ndarray, predicted: np.ndarray) -> list[float | None]:
    """The LDS of each answer token: column k of `actual` (M, K), the token's log-probability under each mask, against
    column k of `predicted` (M, K), from the method's scores at step k. Returns K values (None where undefined)."""
    a, p = np.asarray(actual), np.asarray(predicted)
    if a.shape != p.shape or a.ndim != 2:
        raise ValueError(f"expected two (M, K) arrays, got {a.shape} and {p.shape}")
    return [lds(a[:, k], p[:, k]) for k in range(a.shape[1])]


def top_sources(scores: np.ndarray, k: int) -> list[int]:
    """The k highest-scored sources of a (S,) row, highest first; ties go to the earlier source."""
    s = np.asarray(scores, dtype=np.float64)
    return np.argsort(-s, kind="stable")[: max(0, k)].tolist()


def without(n_sources: int, removed: Sequence[int]) -> np.ndarray:
    """The (S,) keep mask that removes the sources `removed` and keeps every other."""
    keep = np.ones(n_sources, dtype=bool)
    keep[list(removed)] = False
    return keep


def hit_ratio(scores: np.ndarray, hits: Sequence[int], evaluated: Sequence[int]) -> float | None:
    """The share of positive saliency on the `hits` positions among the `evaluated` ones (ABO's hit ratio).

    Args:
        scores: (N,) one map over the prompt (NaN counts as 0).
        hits: the positions that should hold the saliency (a subset of `evaluated`).
        evaluated: the positions the saliency is shared over.

    Returns:
        sum(max(s, 0) over hits) / sum(max(s, 0) over evaluated), in [0, 1]; None when no evaluated score is positive.
    """
    s = np.clip(np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0), 0.0, None)
    total = float(s[list(evaluated)].sum())
    if total <= 0.0:
        return None
    inside = sorted(set(hits) & set(evaluated))
    return float(s[inside].sum()) / total
