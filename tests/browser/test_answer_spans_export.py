"""Issue 11 in a real browser: a given answer with step scores, a span at sentence units, downloads and reopening.

One visitor explains one given answer (teacher-forced, so the tokens are known and the run is short) for the whole
module; the tests then only re-render, download and reopen, in this order. Reopening uses a second, fresh visitor:
it has never run the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from .app_page import AppPage

QA_EXAMPLE = "Reading comprehension (QA)"
ANSWER = "Marta Lindqvist kept the lamp. She wrote a log."
METHODS = ["macs", "rollout"]


@pytest.fixture(scope="module")
def answered(browser, app_server, screenshots) -> Iterator[AppPage]:
    """A visitor who gave `ANSWER` to the built-in QA example with MACS and Rollout and waited until it was done."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(app_server.url)
    app = AppPage(page, screenshots)
    try:
        app.wait_loaded()
        app.pick_example(QA_EXAMPLE)
        app.generate(None, max_new_tokens=2, methods=METHODS, answer=ANSWER)  # the answer raises max new tokens
        yield app
    except BaseException:
        page.screenshot(path=str(screenshots / "FAILED-answered.png"), full_page=True)
        raise
    finally:
        context.close()


def test_a_given_answer_is_teacher_forced_and_shows_step_scores(answered):
    app = answered
    status = app.status()
    assert re.match(r"Done: \d+ tokens of the given answer \(teacher-forced\)", status), status
    tokens = app.answer_tokens()
    assert "".join(tokens) == ANSWER and len(tokens) > 2  # all of it, past the slider's 2 new tokens
    assert app.answer_text().startswith("Given answer (teacher-forced)")
    assert "dotted underline: p < 0.1" in app.answer_text()
    titles = app.answer_titles()
    probabilities = []
    for i, title in enumerate(titles):
        m = re.fullmatch(rf"step {i + 1}: '.*' · p = ([0-9.e+-]+) · entropy ([0-9.]+) nats", title)
        assert m, title
        probabilities.append(float(m[1]))
        assert 0 <= probabilities[-1] <= 1 and float(m[2]) >= 0
    low = app.page.locator(".xai-answer:visible .xai-step[data-low]")
    assert low.count() == sum(p < 0.1 for p in probabilities)  # three decimals shown: no value sits on the edge
    assert app.heatmap_methods() == METHODS and app.step_slider_value() == len(tokens)
    app.shot("given-answer")


def test_a_span_at_sentence_units_lists_the_top_sentences(answered):
    app = answered
    steps = len(app.answer_tokens())
    prompt = app.page.get_by_label("Prompt", exact=True).input_value()
    app.explain_span(True)
    app.set_units("sentence")
    app.page.locator(".xai-top:visible").wait_for()
    app.page.locator('.xai-heatmap:visible[data-granularity="sentence"]').wait_for()
    app.page.get_by_text(re.compile(rf"^Steps 1-{steps} of {steps} explain")).first.wait_for()
    assert app.selected_steps() == list(range(steps))  # ticking the box spans the whole answer
    for method in METHODS:
        sentences = app.top_sentences(method)
        assert 1 <= len(sentences) <= 3, sentences
        assert all(s.strip() and s.strip() in prompt for s in sentences), sentences
    app.expect_download("Download PNG of this view", enabled=False)  # the PNG draws one step's token view only
    app.shot("span-sentences")
    app.set_span_end(2)
    app.page.get_by_text(re.compile(rf"^Steps 1-2 of {steps} explain")).first.wait_for()
    assert app.selected_steps() == [0, 1]
    app.explain_span(False)
    app.set_units("token")
    app.page.locator('.xai-heatmap:visible[data-granularity="sentence"]').wait_for(state="detached")
    app.page.wait_for_function("() => !document.querySelector('.xai-top')")
    assert len(app.selected_steps()) == 1


def test_downloads_reopen_to_the_same_views_without_a_model(answered, browser, app_server, tmp_path):
    app = answered
    app.page.wait_for_function(  # back on the single-step token view of the last token, as a reopened result shows
        "() => !document.querySelector('.xai-heatmap[data-granularity]')"
    )
    steps = len(app.answer_tokens())
    app.move_step_slider(steps)  # to the end (clamped): the newest token
    app.page.locator(f'.xai-answer:visible .xai-step[data-step="{steps - 1}"][data-selected]').wait_for()
    heatmap, answer = app.view_dom(), app.view_dom(".xai-answer:visible")

    saved = app.download("Download JSON", tmp_path)
    assert saved.suffix == ".json" and saved.name.endswith(f"-{steps}steps.json")
    data = json.loads(saved.read_text(encoding="utf-8"))
    assert "".join(data["generated_tokens"]) == ANSWER and set(data["methods"]) == set(METHODS)
    assert data["meta"]["answer"] == "given" and len(data["step_scores"]["probability"]) == steps
    report = app.download("Download HTML report", tmp_path).read_text(encoding="utf-8")
    assert report.startswith("<!DOCTYPE html>") and 'id="xai-step"' in report and "teacher-forced" in report
    png = app.download("Download PNG of this view", tmp_path).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # a new visitor: no result, no model run
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(app_server.url)
        other = AppPage(page, app.screenshots)
        other.wait_loaded()
        status = other.open_saved(saved)
        assert (
            status.startswith(f"Opened {saved.name}: {steps} answer tokens of a given answer") and "no model" in status
        )
        page.locator(".xai-heatmap:visible .xai-panel").first.wait_for()
        assert other.checked_methods() == METHODS
        assert other.view_dom() == heatmap and 'data-method="rollout"' in heatmap
        assert other.view_dom(".xai-answer:visible") == answer
        assert other.step_slider_value() == steps and other.step_slider_enabled()
        other.page.wait_for_function(  # the reopened result can be saved again
            "() => [...document.querySelectorAll('button')].some(b => b.innerText.trim() === 'Download JSON' "
            "&& !b.disabled)"
        )
        (tmp_path / "again").mkdir()
        again = other.download("Download JSON", tmp_path / "again")
        assert json.loads(again.read_text(encoding="utf-8")) == data
        other.shot("reopened")
    finally:
        context.close()


def test_without_a_vision_model_the_image_tab_is_one_readable_line(answered):
    """This app has no vision-language model (offline): its image tab says, in full, how to turn image questions on,
    and shows no upload box, button, answer box, examples or downloads (tests/browser/test_image_tab.py checks the
    tab with a model)."""
    page = answered.page
    page.get_by_role("tab", name="Image + question").click()
    try:
        panel = page.locator('[role="tabpanel"]:visible')
        line = panel.get_by_text(re.compile(r"^Image questions are off:"))
        line.wait_for()
        text = " ".join(line.locator("xpath=..").inner_text().split())
        assert re.search(r"restart the app with EXPLAINER_VLM set to a Hub id or a local folder .* e\.g\. "
                         r"EXPLAINER_VLM=\S+ python app\.py\.$", text), text  # not cut at "EXPLAINER_VLM="
        for name in ("Ask about the image", "Download JSON", "Download GIF"):
            assert page.get_by_role("button", name=name, exact=True).filter(visible=True).count() == 0, name
        assert panel.locator("input[type=file]").count() == 0 and panel.locator("textarea").count() == 0
        assert not panel.get_by_text(re.compile("^Example images")).is_visible()
        answered.shot("image-tab-offline")
    finally:
        page.get_by_role("tab", name="Text prompt").click()
