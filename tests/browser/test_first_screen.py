"""The first screen of a live demo, at a laptop's and a projector's window (1280×900, 1920×1080): the first example's
saved result with the answer strip, the step slider and the method panels side by side, the prompt and Generate
beside them, all without scrolling; Generate busy while a request runs, with its progress in view; a link to a step
scrolls its views into the window. The first views' screenshots are `first-screen-<size>.png` (README's picture:
`docs/first-screen-1280x900.png`, copied from a run with `EXPLAINER_SCREENSHOTS`).
"""

from __future__ import annotations

import pytest

SIZES = [(1280, 900), (1920, 1080)]
SAVED = r"^Saved result of the example “Reading comprehension \(QA\)”"


@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_first_view_shows_the_answer_the_step_slider_and_the_panels_side_by_side(visit, width, height):
    app = visit(width, height)
    app.wait_status(SAVED)
    app.page.locator('.xai-heatmap:visible .xai-panel[data-method="rollout"]').wait_for()
    assert app.heatmap_methods() == ["macs", "rollout"]
    shown = app.first_screen()
    assert app.page.evaluate("window.scrollY") == 0
    assert app.outside_window(shown) == {}, app.shot(f"first-screen-{width}x{height}-FAILED", full_page=False)
    macs, rollout = (shown[f"panel:{m}"].bounding_box() for m in ("macs", "rollout"))
    assert macs["y"] == rollout["y"] and macs["x"] + macs["width"] <= rollout["x"]  # side by side, not stacked
    answer, prompt = shown["answer strip"].bounding_box(), shown["prompt"].bounding_box()
    assert prompt["x"] + prompt["width"] <= answer["x"]  # the controls beside the views, not above them
    app.page.mouse.move(0, 0)  # no hover outline in the picture
    app.shot(f"first-screen-{width}x{height}", full_page=False)


def test_generate_is_busy_while_a_request_runs_with_its_progress_in_view_and_ready_after(visit, app_server):
    app = visit(1280, 900)
    app.wait_status(SAVED)
    button = app.run_button()
    assert button.inner_text() == "Generate" and button.is_enabled()
    app.generate("Count from 1 to 300, one number per line.", max_new_tokens=256, methods=["macs"], wait=False)
    app.wait_status(r"^generating: ([3-9]|\d\d+) tokens")
    assert button.inner_text() == "Generating…" and button.is_disabled()
    assert app.outside_window({"status": app.first_screen()["status"]}) == {}  # the progress, by the answer
    app.shot("generate-busy", full_page=False)
    app.press("Cancel")
    app.wait_status(r"^Stopped after \d+ tokens", timeout=30)
    app.page.wait_for_function("b => b.innerText === 'Generate' && !b.disabled", arg=button.element_handle())
    app_server.wait_model_free(timeout=30)
    app.generate("", max_new_tokens=3, methods=["macs"], wait=False)  # fails at once: an empty prompt
    app.page.wait_for_function("b => b.innerText === 'Generate' && !b.disabled", arg=button.element_handle())
    app.generate("Name a colour.", max_new_tokens=3, methods=["macs"])  # and a request that finishes
    app.page.wait_for_function("b => b.innerText === 'Generate' && !b.disabled", arg=button.element_handle())


@pytest.mark.parametrize(("width", "height"), [(1280, 900), (800, 900)], ids=["side-by-side", "stacked"])
def test_a_link_to_a_step_scrolls_that_steps_views_into_the_window(visit, width, height):
    """At 800 px the columns stack, controls first, and the views start below the window: the link scrolls down to
    them; at 1280 px it brings the views' top to the window's top."""
    plain = visit(width, height)
    plain.wait_status(r"^Saved result")
    assert plain.page.evaluate("window.scrollY") == 0  # without a step, the page opens at its top
    if width < 1000:
        assert "answer strip" in plain.outside_window(plain.first_screen())
    app = visit(width, height, "?result=general-question&step=3")
    app.wait_status(r"^Saved result of the example “General question”")
    top = "document.getElementById('text-views').getBoundingClientRect().y"
    scrolled = f"() => window.scrollY > 0 && Math.abs({top}) < 2"
    app.page.wait_for_function(scrolled, timeout=10_000)  # the views' top at the window's top
    assert app.step_slider_value() == 3 and app.selected_step() == 2
    views = app.first_screen()
    shown = {name: views[name] for name in ("status", "answer strip", "step slider", "panel:macs", "panel:rollout")}
    shown["selected token"] = app.page.locator(".xai-answer:visible .xai-step[data-selected]").first
    assert app.outside_window(shown) == {}
    app.shot(f"link-to-step-{width}x{height}", full_page=False)
