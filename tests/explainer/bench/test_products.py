"""The forms of MACS's stacked product (`bench/products.py`) against a float64 product: the float32 ones agree to
float32 rounding, the bf16-out one is measured as far from it as bf16's rounding, and a form the device lacks is
recorded with its error instead of stopping the others."""

import torch

from explainer.bench.products import FORMS, measure


def test_each_form_of_the_product_is_measured_against_float64():
    rows = {r["form"]: r for r in measure((2, 2, 3, 16), 40, torch.device("cpu"), torch.bfloat16, repeats=2)}
    assert set(rows) == set(FORMS)
    for name in ("upcast-keys", "upcast-keys-by-layer"):  # bf16 operands are exact in float32
        assert rows[name]["error"] is None and rows[name]["relative_error"] < 1e-6 and rows[name]["ms"] > 0
    rounded = rows["model-dtype-then-float (not float32 arithmetic)"]
    assert 1e-4 < rounded["relative_error"] < 1e-2  # bf16's 8-bit significand shows
    replayed = rows["bmm-out-float32, replayed from a CUDA graph"]
    assert replayed["ms"] is None and "CUDA" in replayed["error"]  # no graphs here: recorded, not raised
    for name in ("bmm-out-float32 (current)", "swapped-out-float32"):  # CUDA's only: recorded, not raised
        row = rows[name]
        assert (row["error"] is None and row["relative_error"] < 1e-6) or (row["ms"] is None and row["error"])


def test_in_float32_every_form_that_runs_is_the_same_product():
    rows = measure((3, 1, 2, 8), 33, torch.device("cpu"), torch.float32, repeats=1)
    ran = [r for r in rows if r["error"] is None]
    assert len(ran) >= 3 and all(r["relative_error"] < 1e-6 for r in ran)
