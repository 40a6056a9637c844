"""The "MACS by layer" accordion in a real browser: after an answer it draws one row per layer and the product row for
the step on the slider, and follows the slider."""

from __future__ import annotations

import re

PROMPT = "What is the capital of France?"
FIGURE = "#macs-layers .js-plotly-plot"
_DRAWN = """([selector, step]) => {
  const plot = document.querySelector(selector);
  return !!plot && !!plot.data && !!plot.layout && plot.layout.title.text.includes(`step ${step} (`);
}"""


def _figure(app) -> dict:
    """What the drawn figure holds: its title, the factor rows and the product row (as Plotly decoded them: the
    figure sends its numbers as typed arrays)."""
    return app.page.locator(FIGURE).evaluate(
        """el => {
          const rows = z => Array.from(z, row => Array.from(row));
          const [factors, product] = el._fullData.map(trace => rows(trace.z));
          return {title: el.layout.title.text, layers: factors.length, tokens: factors[0].length,
                  product: product[0], factors: factors, hover: el._fullData[0].hovertemplate};
        }"""
    )


def _wait_drawn(app, step: int) -> dict:
    app.page.wait_for_function(_DRAWN, arg=[FIGURE, step], timeout=60_000)
    return _figure(app)


def test_the_layer_view_draws_the_step_on_the_slider_and_follows_it(app):
    app.generate(PROMPT, max_new_tokens=4, methods=["macs", "rollout"])
    app.page.get_by_role("button", name=re.compile(r"^MACS by layer")).first.click()
    step = app.step_slider_value()
    shown = _wait_drawn(app, step)
    assert shown["layers"] == 30 and shown["tokens"] > 3  # SmolLM2-135M's 30 layers, over the user's text
    for column in range(shown["tokens"]):  # the bottom row is the product of the column above it
        product = 1.0
        for row in shown["factors"]:
            assert 0.2 - 1e-6 <= row[column] <= 1.0 + 1e-6
            product *= row[column]
        assert abs(product - shown["product"][column]) <= 1e-6 * max(1.0, product)
    assert "layer %{y}" in shown["hover"]
    app.page.locator(FIGURE).scroll_into_view_if_needed()
    app.shot("layers-last-step")
    app.move_step_slider(-1)
    moved = _wait_drawn(app, step - 1)
    assert moved["factors"] != shown["factors"]
    app.page.locator(f"{FIGURE} .nsewdrag").first.hover()  # the middle of the factor map
    label = app.page.locator(f"{FIGURE} .hoverlayer .hovertext").first
    label.wait_for()
    assert re.search(r"layer \d+.*token .+ \(position \d+\).*factor 0\.\d{4}", label.text_content()), (
        label.text_content()
    )
    app.shot("layers-previous-step")
    app.page.get_by_label("Show all tokens (incl. chat template)").check()
    app.page.wait_for_function(
        "([selector, n]) => document.querySelector(selector)._fullData[0].z[0].length > n",
        arg=[FIGURE, shown["tokens"]],
    )
    app.shot("layers-all-tokens")
