"""The long-context design lab (`explainer/eval/design_lab_long.py`): Paley's matrix is a Hadamard matrix whose
interactions never fall on one column in full (Sylvester's do), the pool holds the method's own design, and on a
synthetic question whose log-probabilities are known a linear answer is ranked exactly by both designs."""

from __future__ import annotations

import numpy as np
import pytest

from explainer.eval import design_lab_long as lab
from explainer.methods.surrogate import design


@pytest.mark.parametrize("q", [11, 19, 23, 31, 43])
def test_paley_s_matrix_is_a_hadamard_matrix_with_balanced_columns(q):
    h = lab.paley(q)
    assert h.shape == (q + 1, q + 1) and set(np.unique(h)) == {-1, 1}
    assert (h @ h.T == (q + 1) * np.eye(q + 1)).all()
    assert (h[:, 0] == 1).all() and (h[:, 1:].sum(axis=0) == 0).all()


@pytest.mark.parametrize("q", [13, 15, 27, 1])
def test_paley_refuses_an_order_it_cannot_build(q):
    with pytest.raises(ValueError, match="prime q = 3 mod 4"):
        lab.paley(q)


def _largest_interaction_alias(masks: np.ndarray) -> float:
    """The largest |correlation| between a two-unit interaction column and a third unit's column (+-1 coding)."""
    z = np.where(masks, 1, -1)
    u, worst = z.shape[1], 0.0
    for a in range(u):
        for b in range(a + 1, u):
            r = np.abs(z.T @ (z[:, a] * z[:, b])) / len(z)
            r[[a, b]] = 0
            worst = max(worst, float(r.max()))
    return worst


def test_no_interaction_falls_on_one_unit_in_full_in_the_paley_design_as_it_does_in_sylvester_s():
    paley = lab.paley_design(25, 0)
    assert paley.shape == (32, 25) and (paley.sum(axis=0) == 16).all()
    z = np.where(paley, 1, -1)
    assert (z.T @ z == 32 * np.eye(25)).all()  # orthogonal, as the default design
    assert _largest_interaction_alias(paley) == 0.25
    assert _largest_interaction_alias(design(25, 32, "hadamard", 0)) == 1.0  # column a XOR b is another unit's
    assert not (lab.paley_design(25, 1) == paley).all()
    with pytest.raises(ValueError):
        lab.paley_design(32, 0)


def _row(s: int, interaction: float = 0.0) -> dict:
    designs = lab.long_designs(s, "long7")
    keys: dict[str, int] = {}
    index = {name: [keys.setdefault(lab._bits(m), len(keys)) for m in masks] for name, masks in designs.items()}
    x = np.array([[c == "1" for c in m] for m in keys], dtype=float)
    weights = np.random.default_rng(5).normal(size=s)  # no two subsets sum alike: no ties
    logp = (x @ weights + interaction * x[:, 0] * x[:, 1] - 9.0)[:, None] * np.array([[0.5, 0.5]])  # (R, K = 2)
    return {"id": "long7", "S": s, "masks": list(keys), "index": index, "logp": logp.tolist()}


def test_the_pool_holds_the_method_s_design_and_a_paley_design_only_where_it_fits():
    designs = lab.long_designs(25, "long7")
    assert (designs["hadamard0"] == design(25, 32, "hadamard", 0)).all()
    assert {"paley0", "paley1", "reference", "evaluation", "all"} <= set(designs)
    assert len(designs["reference"]) == 64 and len(designs["evaluation"]) == 32
    assert "paley0" not in lab.long_designs(40, "long7")


def test_a_linear_answer_is_ranked_exactly_by_both_designs_and_the_report_pairs_them():
    scores = lab.score_long(_row(25))
    assert scores["hadamard"] > 0.999 and scores["paley"] > 0.999
    assert scores["hadamard-logit"] > 0.999  # p near e^-9: the logit is the log-probability to 1e-4, still linear
    assert scores["hadamard-token-logit"] > 0.999
    assert scores["hadamard-saturating"] > 0.95  # a line is the saturating model with no saturation (its line's
    # penalty is fixed, not chosen by leave-one-out as the ridge's: near, not exact)
    assert set(scores) == set(lab.FITS)
    entries = lab.report_long([_row(25), _row(20, 2.0)])
    every = {e["fit"]: e for e in entries if e["sentences"] == "all"}
    assert every["hadamard"]["n"] == 2 and "minus hadamard" not in every["hadamard"]
    mean, _, n = every["paley"]["minus hadamard"]
    assert n == 2 and mean == pytest.approx(every["paley"]["lds"] - every["hadamard"]["lds"])
    assert {e["sentences"] for e in entries} == {"17-23", "24-31", "all"}  # no question of 2-16 sentences


def test_the_interaction_fit_recovers_an_interaction_with_the_dominant_unit_in_a_paley_design():
    """An answer with one interaction, between the dominant unit 0 and unit 1, over 10 units (fewer terms than the 33
    rows): in the Paley design the fit that models unit 0's interactions gets the linear projection's weights back
    (x0 * x1 -> (x0 + x1) / 2 - 1/4, up to the ridge's smallest penalty), where the plain ridge puts the interaction
    on other units."""
    masks = np.concatenate([np.ones((1, 10), dtype=bool), lab.paley_design(10, 0)])
    x = masks.astype(float)
    main = np.linspace(-0.5, 0.5, 10)
    main[0] = 6.0
    y = (x @ main + 2.0 * x[:, 0] * x[:, 1] - 3.0)[:, None] * np.array([[0.5, 0.5]])
    weights = lab.interaction_weights(masks, y)
    expected = main.copy()
    expected[[0, 1]] += 1.0
    assert weights == pytest.approx(expected, abs=0.1)
    plain = lab.surrogate_fit(masks, y, "ridge").weights.sum(axis=0)
    assert np.abs(plain - expected).max() > 0.2


def _token_row(s: int, shared: bool) -> dict:
    """A synthetic long context whose K = 3 tokens' log-probabilities are linear in the kept units: one profile for
    every token scaled per token (`shared`), or each token on its own units."""
    row = _row(s)
    x = np.array([[c == "1" for c in m] for m in row["masks"]], dtype=float)
    rng = np.random.default_rng(7)
    if shared:
        weights = np.outer([1.0, 0.3, 2.0], rng.normal(size=s))  # (K, S)
    else:
        weights = np.zeros((3, s))
        for t in range(3):  # token t reads units t*4 .. t*4 + 3 only, with weights no two subsets sum alike
            weights[t, 4 * t : 4 * t + 4] = rng.normal(size=4) * 3 + np.array([1, 2, 4, 8]) * 0.01
    row["logp"] = (x @ weights.T - 40.0).tolist()  # p below e^-20: the logit is the log-probability, still linear
    return row


def test_sharing_strength_recovers_a_profile_every_token_shares_and_the_whole_answer_s_map_cannot_tell_tokens_apart():
    shared = lab.score_long_tokens(_token_row(25, shared=True))
    assert set(shared) == set(lab.TOKEN_FITS)
    assert shared["hadamard-shared"] > 0.999 and shared["hadamard-rank2"] > 0.999 and shared["hadamard"] > 0.999
    assert shared["hadamard-logit"] > 0.999
    assert shared["hadamard-saturating"] > 0.95  # its line's penalty is fixed, not chosen: near, not exact
    assert shared["whole-answer"] > 0.999  # every token is the same profile, scaled
    apart = lab.score_long_tokens(_token_row(25, shared=False))
    assert apart["hadamard"] > 0.99 and apart["hadamard64"] > 0.99 and apart["reference64"] > 0.99
    assert apart["whole-answer"] < 0.9  # one map for three tokens that read different units
    weights = lab.shared_weights(np.concatenate([np.ones((1, 6), bool), design(6, 32, "hadamard", 0)]),
                                 np.zeros((33, 2)))  # fmt: skip
    assert weights.shape == (2, 6) and np.allclose(weights, 0.0)


def test_the_per_token_report_pairs_every_fit_with_the_method_s_own_and_not_with_the_whole_answer_reference():
    entries = lab.report_long([_token_row(25, True), _token_row(20, False)], per_token=True)
    every = {e["fit"]: e for e in entries if e["sentences"] == "all"}
    assert set(every) == set(lab.TOKEN_FITS)
    assert all("minus reference" not in e for e in entries)
    mean, _, n = every["whole-answer"]["minus hadamard"]
    assert n == 2 and mean == pytest.approx(every["whole-answer"]["lds"] - every["hadamard"]["lds"])
