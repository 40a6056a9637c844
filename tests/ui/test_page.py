"""The page's frame (`ui/page.py`) without a browser: a run button's busy and ready events, and the scroll a link to a
step runs. In the browser: tests/browser/test_first_screen.py."""

from __future__ import annotations

import json
import re

import gradio as gr

from ui import page


def _events(blocks: gr.Blocks) -> dict[str, object]:
    return {fn.api_name: fn for fn in blocks.fns.values()}


def test_a_run_button_is_busy_from_its_click_in_the_browser_until_its_request_ends_however_it_ends():
    with gr.Blocks() as blocks:
        button, out = gr.Button("Run"), gr.Textbox()
        page.busy_on_click(button, "Running…", "run")
        request = button.click(lambda: "done", outputs=out, api_name="request")
        page.ready_after(request, button, "run")
    fns = _events(blocks)
    busy, ready, after_error = fns["run_busy"], fns["run_ready"], fns["run_ready_after_error"]
    assert busy.fn is None and busy.targets == [(button._id, "click")] and busy.outputs == [button]
    update = json.loads(re.fullmatch(r"\(\) => \((.*)\)", busy.js).group(1))
    assert update == {"__type__": "update", "value": "Running…", "interactive": False}
    assert list(blocks.fns).index(busy._id) < list(blocks.fns).index(fns["request"]._id)  # registered first
    for fn in (ready, after_error):
        assert fn.trigger_after == fns["request"]._id and fn.outputs == [button]
        assert fn.fn() == gr.update(value="Run", interactive=True) and fn.fn.maps_library_errors
    assert not ready.trigger_only_on_success and after_error.trigger_only_on_failure
    assert all(fn.api_visibility == "private" for fn in (busy, ready, after_error))


def test_the_link_scroll_only_scrolls_the_views_and_only_for_a_link_to_a_step():
    js = page.SCROLL_TO_STEP_JS
    assert 'has("step")' in js and f'getElementById("{page.VIEWS_ID}")' in js and "scrollIntoView" in js
    assert not re.search(r"fetch|XMLHttpRequest|location\s*=|\.href|src=|import\(", js)  # never loads an address


def test_the_app_wires_both_run_buttons_and_the_link_scroll():
    import app

    fns = _events(app.demo)
    for run in ("generate", "ask"):
        assert fns[f"{run}_ready"].trigger_after == fns[f"{run}_ready_after_error"].trigger_after
    assert fns["generate_ready"].trigger_after == fns["page_explain"]._id
    assert fns["ask_ready"].trigger_after == fns["page_explain_image"]._id
    assert fns["scroll_to_step"].js == page.SCROLL_TO_STEP_JS
    assert fns["scroll_to_step"].trigger_after == fns["first_view"]._id
    assert page.VIEWS_ID in {b.elem_id for b in app.demo.blocks.values()}
