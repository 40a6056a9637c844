"""The needle test's scores (`explainer/eval/hitscore.py`) and the t intervals (`explainer/eval/intervals.py`) against
straightforward computations: blind maps land at chance, a map on the needle scores 1, the tie-aware AP equals the
mean over random tie-breaks, the chance AP equals the mean over random rankings, and the t quantile is the one whose
tail of Student's density (integrated numerically) is 2.5%."""

from __future__ import annotations

import math

import numpy as np
import pytest

from explainer.eval.hitscore import average_precision, blind_maps, chance_ap, mass_share, needle_map, score
from explainer.eval.intervals import excludes_zero, mean_t, paired_t, t975

N, SCORED, HITS = 60, list(range(10, 50)), list(range(25, 30))  # 10 template/instruction tokens, 40 scored, 5 hits


def _ap_by_ranking(order: list[int], hit: set[int]) -> float:
    """AP of one ranking (positions, best first): mean over hits of the precision at each hit's rank."""
    found, total = 0, 0.0
    for rank, p in enumerate(order, start=1):
        if p in hit:
            found += 1
            total += found / rank
    return total / len(hit)


def _ap_random_ties(m: np.ndarray, hit: np.ndarray, draws: int = 4000) -> float:
    rng = np.random.default_rng(0)
    aps = []
    for _ in range(draws):
        tie_break = rng.random(len(m))
        order = sorted(range(len(m)), key=lambda i: (-m[i], tie_break[i]))
        aps.append(_ap_by_ranking(order, set(np.flatnonzero(hit))))
    return float(np.mean(aps))


def test_a_map_exactly_on_the_needle_scores_one_on_both():
    raw = np.zeros((3, N))
    raw[:, HITS] = 1.0
    got = score(raw, [0, 1, 2], SCORED, HITS)
    assert got == {"mass": pytest.approx(1.0), "ap": pytest.approx(1.0)}


@pytest.mark.parametrize("blind", [7, 12, 49, 55])  # left-out tokens (instruction, question) or haystack tokens
def test_a_needle_blind_one_hot_map_scores_zero_mass_and_chance_ap(blind):
    raw = np.zeros((2, N))
    raw[:, blind] = 5.0
    got = score(raw, [0, 1], SCORED, HITS)
    assert got["mass"] == 0.0
    hit = np.isin(SCORED, HITS)
    assert got["ap"] <= chance_ap(len(SCORED), len(HITS)) + 1e-12  # at chance, or below when it ranks a non-hit first
    assert got["ap"] == pytest.approx(_ap_random_ties(needle_map(raw, [0, 1], SCORED), hit), abs=0.01)


def test_the_blind_maps_land_at_chance():
    question = list(range(52, 58))
    maps = blind_maps(N, question, edge=8)
    assert list(maps) == ["blind: question", "blind: first 8", "blind: last 8", "blind: uniform"]
    chance = len(HITS) / len(SCORED)
    for name, m in maps.items():
        got = score(m, [0, 1, 2], SCORED, HITS)  # one (N,) map used at every step
        assert got["mass"] <= chance + 1e-12, name
        assert got["ap"] <= chance_ap(len(SCORED), len(HITS)) + 1e-12, name
    uniform = score(maps["blind: uniform"], [0], SCORED, HITS)
    assert uniform == {"mass": pytest.approx(chance), "ap": pytest.approx(chance_ap(len(SCORED), len(HITS)))}
    assert score(maps["blind: question"], [0], SCORED, HITS)["mass"] == 0.0  # all of it on left-out tokens


def test_each_step_is_normalised_before_the_steps_are_averaged():
    rng = np.random.default_rng(1)
    raw = rng.normal(size=(4, N))
    raw[1] *= 1000.0  # a loud step weighs as much as a quiet one
    raw[3, SCORED] = -1.0  # no positive mass on the scored tokens: the zero map
    steps = [0, 1, 3]
    expected = np.zeros(len(SCORED))
    for k in steps:  # by hand
        row = [max(float(raw[k, p]), 0.0) for p in SCORED]
        total = sum(row)
        expected += np.array([v / total if total > 0 else 0.0 for v in row]) / len(steps)
    m = needle_map(raw, steps, SCORED)
    np.testing.assert_allclose(m, expected, rtol=1e-12)
    assert m.sum() == pytest.approx(2 / 3)
    hit = np.isin(SCORED, HITS)
    assert mass_share(m, hit) == pytest.approx(sum(expected[i] for i in range(len(SCORED)) if SCORED[i] in HITS))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tie_aware_ap_is_the_mean_over_random_tie_breaks(seed):
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 3, size=30).astype(float)  # many ties
    hit = rng.random(30) < 0.3
    hit[0] = True
    assert average_precision(m, hit) == pytest.approx(_ap_random_ties(m, hit), abs=0.01)
    distinct = rng.permutation(30).astype(float)  # no ties: exactly the ranking's AP
    order = list(np.argsort(-distinct))
    assert average_precision(distinct, hit) == pytest.approx(_ap_by_ranking(order, set(np.flatnonzero(hit))))


@pytest.mark.parametrize(("n", "r"), [(1, 1), (10, 1), (10, 3), (40, 5), (7, 7)])
def test_chance_ap_is_the_mean_over_random_rankings(n, r):
    rng = np.random.default_rng(n * 10 + r)
    hit = set(range(r))
    mc = np.mean([_ap_by_ranking(list(rng.permutation(n)), hit) for _ in range(20000)])
    assert chance_ap(n, r) == pytest.approx(mc, abs=0.005)
    assert average_precision(np.zeros(n), np.isin(np.arange(n), list(hit))) == pytest.approx(chance_ap(n, r))


def _t_tail(t: float, df: int, steps: int = 200_000) -> float:
    """P(T > t) for Student's t with df degrees of freedom: 1/2 minus the density integrated from 0 to t (Simpson)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    x = np.linspace(0.0, t, steps + 1)
    f = c * (1 + x**2 / df) ** (-(df + 1) / 2)
    h = t / steps
    return 0.5 - h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())


@pytest.mark.parametrize("df", [1, 2, 4, 9, 19, 30, 31, 45, 98, 400])
def test_t975_leaves_two_and_a_half_percent_in_the_tail(df):
    assert _t_tail(t975(df), df) == pytest.approx(0.025, abs=2e-5)


def test_mean_t_and_paired_t():
    values = [0.1, 0.4, 0.35, 0.8, None, float("nan")]
    mean, half, n = mean_t(values)
    known = np.array([0.1, 0.4, 0.35, 0.8])
    assert n == 4 and mean == pytest.approx(known.mean())
    assert half == pytest.approx(3.1824 * known.std(ddof=1) / 2)
    assert mean_t([]) == (pytest.approx(float("nan"), nan_ok=True), pytest.approx(float("nan"), nan_ok=True), 0)
    diff = paired_t([1.0, 2.0, None, 4.0], [0.5, 1.0, 3.0, 3.0])
    assert diff[2] == 3 and diff[0] == pytest.approx(np.mean([0.5, 1.0, 1.0]))
    assert excludes_zero(0.3, 0.2) and not excludes_zero(0.1, 0.2) and not excludes_zero(0.3, float("nan"))
    with pytest.raises(ValueError):
        t975(0)
