"""The needle test's scores, in plain numpy: how much of a map lies on the needle, and how well it ranks the needle's
tokens first (`hitratio.py` builds the prompts and reads the maps; ABO, "The Fragile Truth of Saliency", defines the
hit ratio).

Everything is over the **scored tokens**: the needle(s) and the haystack. The instruction, the question and the chat
template are left out, because a map that looks only at the question would otherwise win without seeing the needle.
The **hits** are the tokens of the needle whose password the model wrote (with contradictory needles the other two
needles are scored tokens that are not hits).

- **Normalisation.** Each answer step's map is cut to its positive part over the scored tokens and divided by its
  sum there, so that every step weighs 1 whatever a method's scale (MACS's raw scores are products of 30 factors; a
  gradient's are signed and small). A step with no positive mass on the scored tokens gives the zero map: it put
  nothing on the needle. The needle map is the mean of the normalised maps of the steps that write the password.
- **Mass share** (ABO's hit ratio): the needle map's sum over the hits, in [0, 1]. Chance (a uniform map) is the hits'
  share of the scored tokens.
- **Average precision**: the scored tokens ranked by the needle map, the mean over the hits of the precision at each
  hit's rank. Tied scores are ranked at random, and the AP is its exact expectation over those orders, so a map that
  is flat where it is blind scores what a random ranking scores (`chance_ap`) instead of what the token order gives.
  A one-hot map saturates a mass share (all or nothing); AP still tells a map that ranks the needle's other tokens
  next from one that does not.
- **Blind maps** (`blind_maps`): the question only, the first and the last `EDGE` tokens of the whole prompt, and a
  uniform map. They never see where the needle is, so they must land at chance (or at 0 mass, when they fall on
  left-out tokens only); a table where they do not is measuring something else.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EDGE = 64  # tokens of the blind "first k" and "last k" maps (the template, instruction and haystack's edges)


def needle_map(raw: np.ndarray, steps: Sequence[int], scored: Sequence[int]) -> np.ndarray:
    """The mean over `steps` of each step's map, positive part, divided by its sum over `scored`.

    Args:
        raw: (K, N) a method's raw scores (NaN counts as 0), or (N,) one map used at every step.
        steps: the answer steps to average (those writing the password).
        scored: the P scored prompt positions.

    Returns:
        (P,) float64 summing to 1 (or to less, when some steps have no positive mass on the scored tokens; 0 then).
    """
    r = np.atleast_2d(np.nan_to_num(np.asarray(raw, dtype=np.float64), nan=0.0))  # (K, N)
    rows = r[[0] * len(steps)] if r.shape[0] == 1 else r[list(steps)]  # (S, N)
    pos = np.clip(rows[:, list(scored)], 0.0, None)  # (S, P)
    total = pos.sum(axis=1, keepdims=True)  # (S, 1)
    normalised = np.divide(pos, total, out=np.zeros_like(pos), where=total > 0)
    return normalised.mean(axis=0) if len(steps) else np.zeros(len(scored))


def mass_share(m: np.ndarray, hit: np.ndarray) -> float:
    """The needle map's mass on the hits: sum of `m` (P,) where `hit` (P,) bool is True."""
    return float(np.asarray(m, dtype=np.float64)[np.asarray(hit, dtype=bool)].sum())


def chance_ap(n: int, r: int) -> float:
    """The expected average precision of a uniformly random ranking of `n` items of which `r` are hits:
    (1/n) ((r - 1)/(n - 1) (n - H_n) + H_n), H_n the n-th harmonic number."""
    if not 0 < r <= n:
        raise ValueError(f"need 0 < r <= n, got r = {r}, n = {n}")
    if n == 1:
        return 1.0
    h = float(np.sum(1.0 / np.arange(1, n + 1)))
    return ((r - 1) / (n - 1) * (n - h) + h) / n


def average_precision(m: np.ndarray, hit: np.ndarray) -> float:
    """The expected average precision of the hits when the P scored tokens are ranked by `m`, ties in random order.

    Within a tie group of g tokens holding r hits, after b tokens and h hits ranked above it, a hit at place p
    (0-based, uniform over the group) has on average p (r - 1)/(g - 1) other hits before it in the group, and its
    precision is (h + 1 + those)/(b + p + 1); the group adds that, averaged over p, once per hit.
    """
    m = np.asarray(m, dtype=np.float64)
    hit = np.asarray(hit, dtype=bool)
    n_hits = int(hit.sum())
    if n_hits == 0:
        raise ValueError("no hit tokens to rank")
    values, inverse = np.unique(-m, return_inverse=True)  # groups, highest score first
    total, before, hits_before = 0.0, 0, 0
    for g_index in range(len(values)):
        members = inverse == g_index
        g, r = int(members.sum()), int(hit[members].sum())
        if r:
            p = np.arange(g, dtype=np.float64)
            others = p * (r - 1) / (g - 1) if g > 1 else np.zeros(1)
            total += r * float(np.mean((hits_before + 1 + others) / (before + p + 1)))
        before, hits_before = before + g, hits_before + r
    return total / n_hits


def blind_maps(n: int, question: Sequence[int], edge: int = EDGE) -> dict[str, np.ndarray]:
    """The maps that cannot see the needle, over a prompt of `n` positions: 1 on the question's positions, on the
    first and the last `edge` positions, and everywhere; 0 elsewhere. Each is used at every answer step."""

    def on(positions) -> np.ndarray:
        out = np.zeros(n, dtype=np.float64)
        out[list(positions)] = 1.0
        return out

    return {
        "blind: question": on(question),
        f"blind: first {edge}": on(range(min(edge, n))),
        f"blind: last {edge}": on(range(max(n - edge, 0), n)),
        "blind: uniform": np.ones(n, dtype=np.float64),
    }


def score(raw: np.ndarray, steps: Sequence[int], scored: Sequence[int], hits: Sequence[int]) -> dict[str, float]:
    """A map's mass share and average precision over the scored tokens (`needle_map` of `raw` at `steps`)."""
    m = needle_map(raw, steps, scored)
    hit = np.isin(np.asarray(scored), np.asarray(list(hits)))
    return {"mass": mass_share(m, hit), "ap": average_precision(m, hit)}
