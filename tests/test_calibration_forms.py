"""scripts/calibration_forms.py: its per-head log factors, taken from one eager forward, have MACS's layer factors (kept
while generating) as their maximum over heads; each form starts at MACS where it says so; the comparison runs end to
end on a few rows of the embedded model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from explainer import load_model
from explainer.eval.calibrate import CalibrateConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import calibration_forms as forms  # noqa: E402

ROWS = [
    {"id": f"f{i}", "question": q, "context": c, "answers": [{"text": "x", "answer_start": 0}]}
    for i, (q, c) in enumerate([
        ("Where do penguins live?", "Penguins live in the Southern Hemisphere. They cannot fly. Most eat fish."),
        ("What colour is the sky?", "The sky is blue on a clear day. Grass is green. Snow is white."),
        ("What is the capital of France?", "France is in Europe. Its capital is Paris. Lyon is its third city."),
    ])
]  # fmt: skip
CFG = CalibrateConfig(max_new_tokens=5, masks=6)


@pytest.fixture(scope="module")
def measured():
    bundle = load_model(None, device="cpu", dtype="float32")
    implementation = bundle.model.config._attn_implementation
    rows = [forms.measure(bundle, row, CFG) for row in ROWS]
    assert bundle.model.config._attn_implementation == implementation  # the eager switch does not outlive it
    return rows


def test_the_heads_maximum_is_macs_layer_factor(measured):
    for arrays in measured:
        k, layers, p = arrays["features"].shape
        assert arrays["heads"].shape[:2] == (k, layers) and arrays["heads"].shape[3] == p
        np.testing.assert_allclose(arrays["heads"].max(axis=2), arrays["features"], atol=2e-5)


def test_each_form_starts_where_it_says(measured):
    rows = forms.tensors(measured)
    layers, heads = rows[0]["heads"].shape[1:3]
    macs = [forms.predict("macs", {}, e) for e in rows]
    for form in ("layer", "layer+head"):
        start = forms.start(form, layers, heads)
        for e, expected in zip(rows, macs):
            torch.testing.assert_close(forms.predict(form, start, e), expected)
    assert forms.pull("layer+head", forms.start("layer+head", layers, heads), 1.0) == 0
    assert forms.pull("head", forms.start("head", layers, heads), 1.0) < 1e-12


def test_the_comparison_runs_and_macs_is_its_own_baseline(measured):
    rows = forms.tensors(measured)
    table = forms.compare(rows[:2], rows[2:])
    assert [(r["form"], r["l2"]) for r in table] == [(f, l2) for f, pulls in forms.FORMS.items() for l2 in pulls]
    assert table[0]["form"] == "macs" and table[0]["vs_macs"] == 0 and table[0]["parameters"] == 0
