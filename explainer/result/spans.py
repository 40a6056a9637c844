"""Spans of the answer, words and sentences of the prompt: maps aggregated over answer steps and prompt groups.

Pure numpy on an `Attribution`; no model. Three steps, each usable alone:

1. `span_scores`: one method's map over an inclusive range of answer steps `[first, last]`, the **mean of the
   per-step z-scores** (a single step is the span `[k, k]`).
2. `word_groups` / `sentence_groups` (in `explainer/segments.py`; or `groups` by name): the prompt positions cut
   into consecutive runs of tokens, each with its text; together they cover the chosen positions exactly once.
3. `group_scores`: a group's score is the **mean of its tokens' z-scores**. This keeps the token view's units (a
   score of +1 means "one standard deviation above the average token", whatever the method), so groups compare
   across methods and with the token view, and a long sentence is not favoured over a short one as a sum would.

`top_sentences` chains the three. Steps are 0-based indices into the generated tokens, as everywhere in the library.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .attribution import Attribution, zscore
from .segments import Group, is_special, sentence_groups, sentence_starts, token_groups, word_groups
from .sinks import scored_positions

GRANULARITIES = ("token", "word", "sentence")


@dataclass(frozen=True)
class ScoredGroup:
    """A group with its score and 1-based rank (see `top_sentences`)."""

    rank: int
    score: float
    group: Group

    @property
    def text(self) -> str:
        return self.group.text

    @property
    def positions(self) -> range:
        return self.group.positions


def shown_positions(attr: Attribution, user_only: bool = True) -> tuple[np.ndarray, bool]:
    """The prompt positions a view shows, as the token heatmap chooses them.

    Returns:
        (n,) int64 ascending positions: `attr.user_positions` when `user_only` and there are any, else all N; and
        whether they are that user subset (then z-scores are re-standardised over them, see `span_scores`).
    """
    n = len(attr.prompt_tokens)
    if user_only and attr.user_positions:
        pos = np.unique(np.asarray([p for p in attr.user_positions if 0 <= p < n], dtype=np.int64))
        if pos.size:
            return pos, True
    return np.arange(n, dtype=np.int64), False


def _whole_step(value, name: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"The span's {name} step must be a whole number, got {value!r}.")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise InputError(f"The span's {name} step must be a whole number, got {value!r:.40}.") from None


def span_range(num_steps: int, first=None, last=None) -> tuple[int, int]:
    """Validate an inclusive, 0-based range of answer steps against an answer of `num_steps` tokens.

    Args:
        num_steps: how many steps there are (K).
        first: first step; None means the newest (K - 1).
        last: last step, inclusive; None means `first` (a single step).

    Returns:
        (first, last) as ints with 0 <= first <= last < K.

    Raises:
        InputError: no steps, steps that are not whole numbers, reversed or out of range (the message counts answer
            tokens from 1, as the app shows them).
    """
    k = int(num_steps)
    if k <= 0:
        raise InputError("There are no scored answer tokens yet: generate an answer first.")
    first = k - 1 if first is None else _whole_step(first, "first")
    last = first if last is None else _whole_step(last, "last")
    if first > last:
        raise InputError(f"The span runs backwards: answer token {first + 1} to {last + 1}. Put the earlier one first.")
    if first < 0 or last >= k:
        raise InputError(
            f"The span covers answer tokens {first + 1} to {last + 1}, but there are scores for tokens 1 to {k}."
        )
    return first, last


def check_span(attr: Attribution, method: str, first=None, last=None) -> tuple[int, int]:
    """Validate an inclusive, 0-based range of answer steps for one method's scores.

    Args:
        attr: the generation; `attr.methods[method].raw` is (K, N).
        method: the method whose K scored steps bound the range.
        first: first step, 0-based; None is the newest.
        last: last step, inclusive; None means `first` (a single step).

    Returns:
        (first, last) as ints with 0 <= first <= last < K.

    Raises:
        InputError: an unknown method, or as in `span_range`.
    """
    if method not in attr.methods:
        have = ", ".join(attr.methods) or "none"
        raise InputError(f"This result has no scores for the method {method!r}; it has: {have}.")
    try:
        return span_range(attr.methods[method].raw.shape[0], first, last)
    except InputError as e:
        raise InputError(f"{method}: {e}") from None


def span_scores(
    attr: Attribution, method: str, first=None, last=None, positions: Sequence[int] | np.ndarray | None = None
) -> np.ndarray:
    """One method's map over the answer steps `first..last` (inclusive): the mean of the per-step z-scores.

    Each step's row is z-scored on its own first, so every step weighs the same whatever the spread of its raw
    scores; averaging the raw scores instead would let one peaked step dominate the span. At a position, steps where
    it has no score (NaN) are skipped; a position with no score at any step of the span stays NaN.

    Args:
        attr: the generation; `attr.methods[method]` holds (K, N) `raw` and `z`.
        method: which method's scores.
        first: first step, 0-based; None is the newest.
        last: last step, inclusive; None means `first`.
        positions: None uses the stored z-scores (standardised over all N prompt tokens); otherwise each step's raw
            row is re-standardised over these positions (those with a finite score), as the token heatmap does for
            the user's tokens, and every other position is NaN.

    Returns:
        (N,) float32.

    Raises:
        InputError: see `check_span`.
    """
    first, last = check_span(attr, method, first, last)
    scores = attr.methods[method]
    if positions is None:
        z = np.asarray(scores.z[first : last + 1], dtype=np.float64)  # (S, N)
    else:
        pos = np.asarray(positions, dtype=np.int64)
        raw = np.asarray(scores.raw[first : last + 1], dtype=np.float32)  # (S, N)
        z = np.stack([zscore(row[None, :], pos[np.isfinite(row[pos])])[0] for row in raw]).astype(np.float64)
    known = np.isfinite(z)  # (S, N)
    count = known.sum(axis=0)  # (N,)
    total = np.where(known, z, 0.0).sum(axis=0)  # (N,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan).astype(np.float32)


def group_scores(z: np.ndarray, groups: Sequence[Group]) -> np.ndarray:
    """Each group's score: the mean of its tokens' z-scores, skipping tokens with no score (NaN).

    Args:
        z: (N,) token z-scores of one step or a span (`span_scores`).
        groups: groups of positions into `z`.

    Returns:
        (G,) float32; NaN for a group none of whose tokens has a score.
    """
    z = np.asarray(z, dtype=np.float64)  # (N,)
    if z.ndim != 1:
        raise ValueError(f"expected an (N,) row of z-scores, got shape {z.shape}")
    if not groups:
        return np.zeros(0, dtype=np.float32)
    starts = np.asarray([g.start for g in groups], dtype=np.int64)  # (G,)
    stops = np.asarray([g.stop for g in groups], dtype=np.int64)  # (G,)
    known = np.isfinite(z)
    total = np.concatenate([[0.0], np.cumsum(np.where(known, z, 0.0))])  # (N + 1,) prefix sums
    count = np.concatenate([[0], np.cumsum(known)])  # (N + 1,)
    n = count[stops] - count[starts]  # (G,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (total[stops] - total[starts]) / n, np.nan).astype(np.float32)


def groups(attr: Attribution, granularity: str, user_only: bool = True) -> list[Group]:
    """The groups of one granularity over the positions a view shows (`shown_positions`).

    Args:
        attr: the generation; only its prompt tokens and user positions are read.
        granularity: "token", "word" or "sentence".
        user_only: only the user's own text (falls back to all tokens when there is none).

    Raises:
        InputError: an unknown granularity (the message lists the valid ones).
    """
    builders = {"token": token_groups, "word": word_groups, "sentence": sentence_groups}
    if granularity not in builders:
        raise InputError(f"Unknown granularity {granularity!r}; choose one of: {', '.join(GRANULARITIES)}.")
    pos, _ = shown_positions(attr, user_only)
    return builders[granularity](attr.prompt_tokens, pos)


def top_sentences(
    attr: Attribution, method: str, first=None, last=None, k: int = 3, user_only: bool = True, hide_sinks: bool = False
) -> list[ScoredGroup]:
    """The k sentences of the prompt that support the answer span most, for one method.

    Sentences come from `sentence_groups` over `shown_positions`, scored by `group_scores` on `span_scores` (z
    re-standardised over the user's tokens when `user_only`, as in the token view). Only "sentence" groups are
    ranked (not special tokens, role names or whitespace), and not those with no score.

    Args:
        attr: the generation and its scores.
        method: which method's scores.
        first: first answer step, 0-based; None is the newest.
        last: last answer step, inclusive; None means `first`.
        k: how many at most.
        user_only: as in `shown_positions`.
        hide_sinks: leave the attention sinks out of each step's z-scores (`sinks.scored_positions`).

    Returns:
        Up to k entries, best first (ties keep prompt order), ranks from 1.

    Raises:
        InputError: see `check_span`.
    """
    pos, subset = shown_positions(attr, user_only)
    z = span_scores(attr, method, first, last, scored_positions(attr, pos, subset, hide_sinks)[0])  # (N,)
    sentences = sentence_groups(attr.prompt_tokens, pos)
    scores = group_scores(z, sentences)  # (G,)
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable").tolist()  # ties keep prompt order
    ranked = [i for i in order if sentences[i].kind == "sentence" and math.isfinite(scores[i])]
    return [ScoredGroup(r, float(scores[i]), sentences[i]) for r, i in enumerate(ranked[: max(int(k), 0)], start=1)]


__all__ = [
    "GRANULARITIES",
    "Group",
    "ScoredGroup",
    "check_span",
    "group_scores",
    "groups",
    "is_special",
    "sentence_groups",
    "sentence_starts",
    "shown_positions",
    "span_range",
    "span_scores",
    "token_groups",
    "top_sentences",
    "word_groups",
]
