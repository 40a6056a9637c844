"""The "Leave out attention sinks" view option in a real browser, with the embedded SmolLM2-135M-Instruct: its first
token (`<|im_start|>`) is a real attention sink. Off by default, the heatmap of all tokens scores it; ticked, it is
hatched and the caption says it is left out; unticked, it is back."""

from __future__ import annotations

import re

PROMPT = "What is the capital of France?"
HATCHED = '.xai-heatmap:visible .xai-panel[data-method="macs"] .xai-flow i.xs'
TOGGLE = "Leave out attention sinks (both tabs)"


def test_the_first_token_sink_is_left_out_when_ticked_and_back_when_not(app):
    toggle = app.page.get_by_label(TOGGLE)
    assert not toggle.is_checked()  # off by default
    app.generate(PROMPT, max_new_tokens=4, methods=["macs"])
    app.page.get_by_label("Show all tokens (incl. chat template)").check()
    app.page.wait_for_function("() => /over all \\d+ prompt/.test(document.querySelector('.xai-heatmap').innerText)")
    assert app.page.locator(HATCHED).count() == 0
    first = app.page.locator('.xai-panel[data-method="macs"] .xai-flow i').first
    assert re.fullmatch(r"[+-]\d+\.\d\d", first.get_attribute("title"))  # scored as computed
    toggle.check()
    app.page.locator(HATCHED).first.wait_for()
    assert app.page.locator(HATCHED).count() == 1 and app.page.locator(HATCHED).inner_text() == "<|im_start|>"
    assert "1 attention sink left out (hatched)" in app.heatmap_caption()
    app.page.locator(".xai-heatmap:visible").first.scroll_into_view_if_needed()
    app.shot("sinks-left-out")
    toggle.uncheck()
    app.page.locator(HATCHED).first.wait_for(state="detached")
    assert "left out" not in app.heatmap_caption()
