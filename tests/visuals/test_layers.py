"""The MACS-by-layer view of hand-built results: factors, product, positions, hovers and ticks checked against values
computed here."""

from __future__ import annotations

import numpy as np
import pytest

from explainer.result.attribution import Attribution, MethodScores
from visuals.layers import MAX_TICKS, MIN_HEIGHT, has_layers, layer_figure, layer_positions

from .test_export import HOSTILE

USER = [3, 4, 5, 6, 7]


def make_attr(steps: int = 3, layers: int = 4, n: int | None = None, alpha: float = 0.8, seed: int = 0):
    tokens = HOSTILE if n is None else [f"t{i}" for i in range(n)]
    n = len(tokens)
    rng = np.random.default_rng(seed)
    factors = (1 - alpha + alpha * rng.random((steps, layers, n))).astype(np.float32)  # (K, L, N) in [1 - a, 1]
    raw = factors.astype(np.float64).prod(axis=1)
    scores = MethodScores.from_raw(raw, meta={"alpha": alpha, "pooling": "max"}).with_layers(factors)
    return Attribution(
        model="m",
        prompt_token_ids=list(range(n)),
        prompt_tokens=list(tokens),
        generated_token_ids=list(range(steps)),
        generated_tokens=[f" a{k}" for k in range(steps)],
        methods={"macs": scores, "random": MethodScores.from_raw(rng.random((steps, n)))},
        user_positions=[p for p in USER if p < n],
    )


def test_factors_and_their_product_of_the_chosen_step():
    attr = make_attr()
    layers = attr.methods["macs"].layers
    cols = [3, 5, 6]
    fig = layer_figure(attr, step=1, positions=cols)
    factors, product = fig.data
    np.testing.assert_allclose(np.asarray(factors.z), layers[1][:, cols], rtol=1e-6)
    expected = [float(np.prod([float(layers[1, layer, p]) for layer in range(4)])) for p in cols]
    np.testing.assert_allclose(np.asarray(product.z)[0], expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(product.z)[0], attr.methods["macs"].raw[1, cols], rtol=1e-6)
    assert list(factors.y) == [1, 2, 3, 4] and factors.zmin == pytest.approx(0.2) and factors.zmax == 1.0
    assert "step 2" in fig.layout.title.text and "a1" in fig.layout.title.text


def test_the_newest_step_by_default_and_steps_are_clamped():
    attr = make_attr()
    newest = np.asarray(layer_figure(attr).data[0].z)
    np.testing.assert_allclose(newest, attr.methods["macs"].layers[2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(layer_figure(attr, step=99).data[0].z), newest)
    first = np.asarray(layer_figure(attr, step=-5).data[0].z)
    np.testing.assert_allclose(first, attr.methods["macs"].layers[0], rtol=1e-6)


def test_hovers_name_layer_token_and_position_and_tokens_are_escaped():
    attr = make_attr()
    fig = layer_figure(attr, step=0)
    factors, product = fig.data
    assert "layer %{y}" in factors.hovertemplate and "%{z" in factors.hovertemplate
    assert "token %{text}" in factors.hovertemplate and "product" in product.hovertemplate
    text = np.asarray(factors.text)
    assert text.shape == (4, len(HOSTILE)) and (text[0] == text[3]).all()
    script = HOSTILE.index(" </script><script>alert(1)</script>")
    assert text[2, script] == f" &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; (position {script})"
    shown = " ".join(map(str, [*text.ravel(), *fig.layout.xaxis2.ticktext, fig.layout.title.text]))
    assert "<script" not in shown and "</script" not in shown


def test_positions_follow_the_user_text_and_the_image():
    attr = make_attr()
    assert layer_positions(attr).tolist() == USER
    assert layer_positions(attr, show_all=True).tolist() == list(range(len(HOSTILE)))
    attr.image = {"token_positions": [0, 1], "grid": [1, 2], "size": [28, 14]}
    assert layer_positions(attr).tolist() == [0, 1, *USER]
    attr.user_positions = []
    assert layer_positions(attr).tolist() == list(range(len(HOSTILE)))


def test_a_long_prompt_keeps_every_hover_and_few_tick_labels():
    attr = make_attr(steps=1, layers=2, n=500)
    fig = layer_figure(attr)
    assert np.asarray(fig.data[0].z).shape == (2, 500)
    assert len(fig.layout.xaxis2.tickvals) <= MAX_TICKS and fig.layout.xaxis2.ticktext[1] == "t9"


def test_results_without_layers_are_told_apart():
    attr = make_attr()
    assert has_layers(attr) and not has_layers(attr, "random") and not has_layers(None)
    assert not has_layers(make_attr(steps=0)) and not has_layers(attr, "rollout")
    with pytest.raises(ValueError, match="keep_layers"):
        layer_figure(attr, method="random")


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_a_model_of_few_layers_gets_room_for_its_labels_and_colour_bars(layers):
    """The page grows the margins to fit the rotated token labels and the colour bars; a 320-px figure of a 2- or
    3-layer model had no plot left and was drawn 0 px high (tests/browser/test_image_tab.py draws one)."""
    fig = layer_figure(make_attr(layers=layers))
    assert fig.layout.height >= MIN_HEIGHT >= 400
    for bar in (trace.colorbar for trace in fig.data):  # inside the plot's height: no bar pushes the margins
        anchor = bar.yanchor or "middle"
        low = bar.y - {"bottom": 0, "middle": 0.5, "top": 1}[anchor] * bar.len
        assert 0 <= low and low + bar.len <= 1, bar
    assert layer_figure(make_attr(layers=40)).layout.height > MIN_HEIGHT  # many layers: a row each
