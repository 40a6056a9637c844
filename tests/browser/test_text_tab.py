"""The text tab in a real browser: defaults and time estimates, generate, the step slider, faithfulness, cancel.

Each test is a new visitor (`app` fixture: a fresh browser context on the running app with the embedded model) and
keeps answers short so the whole folder stays within a couple of minutes on a 2-core machine.
"""

from __future__ import annotations

import re

PROMPT = "What is the capital of France?"


def test_first_visit_shows_the_first_examples_saved_result_and_estimates_the_slower_methods(app):
    assert app.checked_methods() == ["macs", "rollout"]
    assert app.status().startswith("Saved result of the example “Reading comprehension (QA)”")  # no model run
    assert app.heatmap_methods() == ["macs", "rollout"] and "Marta" in "".join(app.answer_tokens())
    app.page.get_by_text(re.compile(r"^Extra time for this prompt")).wait_for()  # the example's prompt
    app.type_prompt("")
    app.page.get_by_text(re.compile(r"^Type a prompt to see")).wait_for()
    app.type_prompt(PROMPT)
    app.page.get_by_text(re.compile(r"^Extra time for this prompt")).wait_for()
    text = app.estimate_text()
    for method in ("atman", "attnlrp", "grad_ellm", "input_x_gradient"):
        assert re.search(rf"{method} (about \d|under a second|not measured yet)", text), text
    assert "macs" not in text and "rollout" not in text
    assert "up to 64 new" in text
    app.set_max_new_tokens(8)
    app.page.get_by_text(re.compile(r"up to 8 new")).wait_for()  # follows the answer length
    app.shot("estimate")


def test_a_finished_slow_method_corrects_its_estimate(app):
    app.generate(PROMPT, max_new_tokens=3, methods=["macs", "input_x_gradient"])
    app.page.get_by_text(re.compile(r"input_x_gradient (about \d+(\.\d)? (s|min)|under a second) ✓")).wait_for()
    assert re.search(r"atman (about|under a second|not measured yet)", app.estimate_text())  # not run: no mark
    assert not re.search(r"atman [^·]*✓", app.estimate_text())
    assert app.heatmap_methods() == ["macs", "input_x_gradient"]


def test_generate_shows_the_answer_and_a_heatmap_per_default_method(app):
    app.generate(PROMPT, max_new_tokens=6)
    steps = app.answer_tokens()
    assert 1 <= len(steps) <= 6 and "".join(steps).strip()
    assert app.heatmap_methods() == ["macs", "rollout"]
    assert app.scored_tokens("macs") > 0 and app.scored_tokens("rollout") > 0
    assert app.selected_step() == app.last_content_step()  # the answer's last word, not a trailing <|im_end|>
    assert app.status().startswith(f"Done: {len(steps)} tokens")
    app.page.get_by_text(re.compile(r"float32 on cpu · prompts up to \d+ tokens")).wait_for()  # model line, loaded
    app.shot("generated")


def test_an_example_shows_its_saved_result_at_once_and_a_link_reopens_its_step(app):
    app.pick_example("General question")
    app.wait_status(r"^Saved result of the example “General question”")
    assert "blue" in "".join(app.answer_tokens()) and app.step_slider_enabled()
    app.page.get_by_text(re.compile(r"^Link to this view \(saved example, step \d+\)")).wait_for()
    app.page.goto(app.page.url.split("?")[0] + "?result=general-question&step=3")  # what the link opens
    app.wait_loaded()
    app.wait_status(r"^Saved result of the example “General question”")
    assert app.step_slider_value() == 3
    app.page.get_by_role("link", name="?result=general-question&step=3").wait_for()
    for name in ("Download JSON", "Download HTML report", "Download PNG of this view"):  # the result on screen
        app.page.wait_for_function(
            "name => [...document.querySelectorAll('button')].some(b => b.innerText.trim() === name && !b.disabled)",
            arg=name,
        )
    assert not app.page.get_by_text("· 0.00 s").first.is_visible()  # the saved timings, not zeros
    app.shot("saved-example")


def test_moving_the_step_slider_changes_the_view(app):
    app.generate(PROMPT, max_new_tokens=6)
    steps = len(app.answer_tokens())
    assert steps >= 2, "the answer needs two tokens for a slider to move"
    before = app.heatmap_html()
    app.move_step_slider(-(steps - 1))  # to the first token
    app.page.locator('.xai-answer:visible .xai-step[data-step="0"][data-selected]').wait_for()
    assert app.step_slider_value() == 1
    assert app.heatmap_html() != before  # the heatmaps now explain the first answer token
    app.shot("first-step")
    app.move_step_slider(1)
    app.page.locator('.xai-answer:visible .xai-step[data-step="1"][data-selected]').wait_for()


def test_measure_faithfulness_with_soft_skipped_draws_removal_curves(app):
    app.generate(PROMPT, max_new_tokens=4)
    app.measure_faithfulness(soft="skip π-Soft")
    legend = app.removal_curve_legend()
    assert [entry.split(" ")[0] for entry in legend] == ["macs", "rollout", "random"], legend
    assert all(re.fullmatch(r"\S+ \(SRG [+-]?\d\.\d+\)", entry) for entry in legend), legend
    summary = app.page.get_by_label("Summary")
    for method in ("macs", "rollout", "random"):
        assert summary.get_by_text(method, exact=True).count() >= 1
    for label in ("π-Soft-NS / π-Soft-NC", "LDS on this answer"):  # skipped, no Sources: no empty frame is left
        assert app.page.locator('[data-testid="block-label"]', has_text=label).count() == 0, label
    assert app.page.locator('[data-testid="block-label"]', has_text="Token removal: MIF / LIF").is_visible()
    app.shot("faithfulness")


def test_cancel_stops_a_running_request_frees_the_model_and_the_slider(app, app_server):
    """Cancel, three times over (the status once raced with the request's last update and lost about 3 times in 5):
    each time the status says the request stopped, the slider is free and no more tokens arrive."""
    for attempt in range(3):
        app.generate("Count from 1 to 300, one number per line.", max_new_tokens=256, methods=["macs"], wait=False)
        app.wait_status(r"^generating: ([3-9]|\d\d+) tokens")  # this request is a few tokens in
        app.press("Cancel")
        status = app.wait_status(r"^Stopped after \d+ tokens", timeout=30)
        app_server.wait_model_free(timeout=30)  # the worker stopped and released the model, long before 256 tokens
        shown = len(app.answer_tokens())
        app.page.wait_for_timeout(1000)  # several update intervals: a request still streaming would add tokens
        assert len(app.answer_tokens()) == shown < 256
        assert status == app.status() and status.startswith(f"Stopped after {shown} tokens"), (attempt, status)
        assert app.step_slider_enabled() and app.step_slider_value() == app.last_content_step() + 1
        assert app.selected_step() == app.step_slider_value() - 1  # the views show the step on the slider
    app.shot("cancelled")
    app.generate("Name a colour.", max_new_tokens=3, methods=["macs"])  # the next request gets the model
    assert app.heatmap_methods() == ["macs"]
    # events that read the step slider, sent before a new request shrank it, were refused with error toasts
    assert "greater than maximum" not in app_server.log_tail(10**8)


def test_the_embedded_model_is_offered_the_calibrated_method_its_weights_ship_for(app):
    app.page.locator("input[type=checkbox][name=macs_calibrated]:visible").wait_for()
    assert not app.page.get_by_text("needs weights for this model").is_visible()
