"""A result shown in a notebook (`Attribution._repr_html_`) in a real browser: the report's step slider works inside
its sandboxed frame, and two results in one page keep their own state."""

from __future__ import annotations

import explainer  # noqa: F401 - sets the notebook view

from ..visuals.test_export import hostile_attr


def test_the_step_slider_of_a_result_in_a_notebook_cell_moves_its_own_report(browser):
    first, second = hostile_attr(steps=4, seed=0), hostile_attr(steps=3, seed=1)
    page = browser.new_page()
    try:
        page.set_content(f"<h1>notebook</h1><div>{first._repr_html_()}</div><div>{second._repr_html_()}</div>")
        frames = [page.frame_locator("iframe.xai-notebook").nth(i) for i in range(2)]
        outputs = [f.locator("#xai-step-out") for f in frames]
        assert [o.inner_text() for o in outputs] == ["4 / 4", "3 / 3"]  # each opens on its last step
        slider = frames[0].locator("#xai-step")
        slider.focus()
        slider.press("Home")  # the first step: the script redraws the report inside the frame
        assert outputs[0].inner_text() == "1 / 4" and outputs[1].inner_text() == "3 / 3"
        caption = frames[0].locator("#xai-view .xai-heatmap > div").first.inner_text()
        assert caption.startswith("Step 1 of 4")
        assert page.evaluate("() => document.querySelectorAll('#xai-step').length") == 0  # ids stay in the frames
    finally:
        page.close()
