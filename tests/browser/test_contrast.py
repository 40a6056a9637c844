"""The contrast accordion in a real browser: a foil picked from the step's alternatives explains the answer token
against it; attention methods say they cannot."""

from __future__ import annotations

import re

PROMPT = "What is the capital of France?"


def test_a_foil_from_the_alternatives_explains_the_first_token_against_it(app):
    app.generate(PROMPT, max_new_tokens=3, methods=["macs", "input_x_gradient"])
    steps = len(app.answer_tokens())
    if steps > 1:
        app.move_step_slider(-(steps - 1))  # the first answer token
    app.page.locator('.xai-answer:visible .xai-step[data-step="0"][data-selected]').wait_for()
    app.page.get_by_role("button", name=re.compile(r"^Why this token and not another")).click()
    foil = app.page.get_by_label("Foil: the model's alternatives at this step")
    foil.wait_for()
    app.page.wait_for_function(
        "() => [...document.querySelectorAll('input')].some(i => i.getAttribute('aria-label')?.startsWith('Foil') "
        "&& i.value.includes('p ='))"
    )  # the most probable alternative is preselected
    picked = foil.input_value()
    app.shot("contrast-foils")
    app.press("Explain against the foil")
    app.page.locator(".xai-heatmap:visible", has_text="rather than").wait_for(timeout=120_000)
    app.wait_done()
    caption = app.heatmap_caption()
    assert re.search(r"Step 1 of \d+ explains why .+ rather than .+ \(contrastive", caption), caption
    assert picked.split(" · ")[0].strip("'").replace(" ", "␣") in caption, (picked, caption)
    macs = app.page.locator('.xai-heatmap:visible .xai-panel[data-method="macs"]')
    assert "No contrastive map" in macs.inner_text()
    assert app.scored_tokens("input_x_gradient") > 0
    assert app.selected_step() == 0
    app.page.wait_for_function(  # the foils follow the slider, which the request moved: step 1's again
        "picked => [...document.querySelectorAll('input')].some(i => i.getAttribute('aria-label')?.startsWith('Foil') "
        "&& i.value === picked)",
        arg=picked,
    )
    app.shot("contrast-explained")
