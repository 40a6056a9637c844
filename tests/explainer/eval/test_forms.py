"""The calibration forms (`explainer/eval/forms.py`) against the `lds` command's own arithmetic (`lds.py`) on random
rows; each form's neutral parameters give MACS's ranking; the selection never scores a row with parameters chosen on
it; the held-out score fits on training rows only; the paired t interval by hand. One model test: the measured row's
MACS map is the product of its layer factors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from explainer.eval import forms
from explainer.eval.lds import centred, lds, predictions, source_scores
from explainer.eval.metrics import paired_difference, spearman, t_quantile


def random_row(seed: int, k: int = 3, layers: int = 4, sizes=(3, 5, 2, 4), masks: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = sum(sizes)
    features = np.log(0.8 * rng.random((k, layers, p)) + 0.2).astype(np.float32)  # (K, L, P) MACS's log factors
    source = np.concatenate([np.full(n, i) for i, n in enumerate(sizes)])
    return {
        "features": features, "source": source, "masks": rng.random((masks, len(sizes))) < 0.5,
        "actual": rng.normal(size=masks), "macs": np.exp(features.astype(np.float64).sum(axis=1)).astype(np.float32),
        "sources": rng.normal(size=(k, p)).astype(np.float32),
    }  # fmt: skip


def sentences(row) -> list[list[int]]:
    return [np.flatnonzero(row["source"] == s).tolist() for s in range(row["masks"].shape[1])]


ROWS = [random_row(i) for i in range(12)]
FORMS = forms.forms(shipped_weights=[1.0, 1.0, 1.0, 1.0])


def lds_command(row, raw) -> float:
    """What the `lds` command reports for a (K, P) map of a row (`lds_eval.method_entries`)."""
    return lds(row["actual"], predictions(row["masks"], source_scores(raw, sentences(row)).sum(axis=0)))


def test_macs_is_scored_as_the_lds_command_scores_it():
    got = forms.lds_values(FORMS["macs"], {}, ROWS)
    np.testing.assert_allclose(got, [lds_command(r, r["macs"]) for r in ROWS], atol=1e-12)


@pytest.mark.parametrize(
    ("name", "params"),
    [("temperature", {"tau": 1.0}), ("intercept", {"beta": 0.0, "delta": 0.0}), ("blend", {"lambda": 0.0}),
     ("layer", {"weights": np.ones(4)}), ("shipped", {"weights": [1.0] * 4})],
)  # fmt: skip
def test_neutral_parameters_give_macs(name, params):
    np.testing.assert_allclose(forms.lds_values(FORMS[name], params, ROWS), forms.lds_values(FORMS["macs"], {}, ROWS))


def test_each_form_against_a_direct_computation():
    row = ROWS[0]
    c = np.exp(row["features"].astype(np.float64).sum(axis=1))  # (K, P)
    assert forms.lds_values(FORMS["temperature"], {"tau": 0.3}, [row])[0] == pytest.approx(lds_command(row, c**0.3))
    # beta = 1: zero-mean scores over the context's tokens, summed over steps (as `lds.centred` centres each step)
    zero_mean = centred(c, np.arange(c.shape[1]))
    assert forms.lds_values(FORMS["intercept"], {"beta": 1.0, "delta": 0.0}, [row])[0] == pytest.approx(
        lds_command(row, zero_mean)
    )
    per_source = source_scores(c, sentences(row)).sum(axis=0)  # (S,)
    with_count = (
        per_source - 0.5 * np.array([len(s) for s in sentences(row)]) * c.sum(0).mean() + 0.25 * per_source.mean()
    )
    expected = spearman(row["actual"], row["masks"] @ with_count)
    assert forms.lds_values(FORMS["intercept"], {"beta": 0.5, "delta": 0.25}, [row])[0] == pytest.approx(expected)
    assert forms.lds_values(FORMS["blend"], {"lambda": 1.0}, [row])[0] == pytest.approx(
        lds_command(row, row["sources"])
    )
    w = np.array([0.5, 2.0, 1.0, 0.0])
    weighted = np.exp(np.einsum("klp,l->kp", row["features"].astype(np.float64), w))
    assert forms.lds_values(FORMS["layer"], {"weights": w}, [row])[0] == pytest.approx(lds_command(row, weighted))


def test_folds_cover_every_row_once():
    parts = forms.folds(12, 5)
    assert sorted(np.concatenate(parts).tolist()) == list(range(12)) and len(parts) == 5


def test_cross_validation_never_scores_a_row_with_parameters_chosen_on_it():
    seen = []

    def fit(rows):
        seen.append({id(r) for r in rows})
        return {}

    spy = forms.Form("spy", FORMS["macs"].scores, fit=fit)
    forms.cross_validate(spy, ROWS, 4)
    parts = forms.folds(len(ROWS), 4)
    assert len(seen) == 4
    for part, used in zip(parts, seen):
        assert used.isdisjoint({id(ROWS[i]) for i in part}) and len(used) == len(ROWS) - len(part)


def test_held_out_fits_on_training_rows_only_and_pairs_against_macs():
    seen = []
    spy = forms.Form("spy", FORMS["temperature"].scores, fit=lambda rows: seen.append(rows) or {"tau": 0.5})
    train, test = ROWS[:8], ROWS[8:]
    out = forms.held_out(spy, train, test, {"macs": FORMS["macs"]})
    assert seen == [train]
    expected = paired_difference(forms.lds_values(spy, {"tau": 0.5}, test), forms.lds_values(FORMS["macs"], {}, test))
    assert out["vs_macs"] == expected and out["params"] == {"tau": 0.5}
    shipped = forms.held_out(FORMS["shipped"], train, test, {"macs": FORMS["macs"]})
    assert shipped["params"] == {"weights": [1.0] * 4} and shipped["vs_macs"]["mean"] == 0  # weights of 1 are MACS


def test_selection_reports_every_form_and_picks_the_best_mean():
    out = forms.select(ROWS, {k: FORMS[k] for k in ("macs", "temperature", "blend")}, k=3)
    assert [r["form"] for r in out["forms"]] == ["macs", "temperature", "blend"]
    assert out["forms"][0]["vs_macs"]["mean"] == 0
    assert out["chosen"] == max(out["forms"], key=lambda r: r["cv_lds"])["form"]


def test_the_grid_search_finds_a_planted_temperature():
    """Rows whose measured values are exactly the sum of kept sources under tau = 0.2: the grid finds 0.2 (8 sources,
    64 masks: no other grid value ranks every mask alike)."""
    rows = []
    for i in range(6):
        row = random_row(100 + i, sizes=(3, 5, 2, 4, 6, 1, 3, 2), masks=64)
        row["actual"] = row["masks"] @ FORMS["temperature"].scores(row, {"tau": 0.2})
        rows.append(row)
    assert FORMS["temperature"].choose(rows)["tau"] == 0.2
    assert np.mean(forms.lds_values(FORMS["temperature"], {"tau": 1.0}, rows)) < 1.0


def test_t_quantile_and_paired_difference_by_hand():
    assert t_quantile(4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(1) == pytest.approx(12.7062, abs=1e-3)
    assert t_quantile(98) == pytest.approx(1.9845, abs=1e-4)
    a, b = [0.5, 0.7, 0.2, np.nan, 0.4], [0.4, 0.7, 0.5, 0.1, 0.1]
    out = paired_difference(a, b)
    d = np.array([0.1, 0.0, -0.3, 0.3])
    assert out["n"] == 4 and (out["wins"], out["losses"], out["ties"]) == (2, 1, 1)
    assert out["mean"] == pytest.approx(d.mean())
    assert out["half_width"] == pytest.approx(3.1824 * d.std(ddof=1) / math.sqrt(4), rel=1e-4)  # t(3) = 3.1824


def test_a_measured_row_has_macs_as_the_product_of_its_layer_factors():
    from explainer import load_model
    from explainer.eval.calibrate import CalibrateConfig, collect_forms_row

    bundle = load_model(None, device="cpu", dtype="float32")
    row = {"id": "f0", "question": "What is the capital of France?",
           "context": "France is in Europe. Its capital is Paris. Lyon is its third city.",
           "answers": [{"text": "Paris", "answer_start": 0}]}  # fmt: skip
    arrays = collect_forms_row(bundle, row, CalibrateConfig(max_new_tokens=5, masks=6))
    k, _, p = arrays["features"].shape
    assert arrays["macs"].shape == arrays["sources"].shape == (k, p)
    np.testing.assert_allclose(arrays["macs"], np.exp(arrays["features"].astype(np.float64).sum(axis=1)), rtol=1e-4)
    assert np.isfinite(forms.lds_values(forms.forms()["blend"], {"lambda": 0.5}, [arrays])[0])


def test_a_grid_value_that_ranks_nothing_is_never_chosen():
    """beta = 1 with a map that is the same on every token makes every source's score 0: no LDS anywhere."""
    rows = []
    for i in range(3):
        row = random_row(200 + i, sizes=(2, 2, 2, 2))
        row["macs"] = np.ones_like(row["macs"])
        rows.append(row)
    form = forms.Form("flat", FORMS["intercept"].scores, {"beta": (1.0, 0.0), "delta": (0.0,)})
    assert np.isnan(forms.lds_values(form, {"beta": 1.0, "delta": 0.0}, rows)).all()
    assert form.choose(rows) == {"beta": 0.0, "delta": 0.0}
