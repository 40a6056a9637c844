"""The image tab in a real browser, with the tiny random Qwen2.5-VL as its model (no real weights offline): an image
question with MACS and a gradient method, the faithfulness panel over the image tokens, and a region of the image
picked on its patch grid."""

from __future__ import annotations

import re

import numpy as np
from PIL import Image


def _image(folder) -> object:
    path = folder / "square.png"
    pixels = np.zeros((84, 112, 3), dtype=np.uint8)
    pixels[..., 2], pixels[20:60, 30:80] = 200, (220, 30, 30)  # a red square on blue
    Image.fromarray(pixels).save(path)
    return path


def test_with_a_vision_model_the_tab_shows_its_controls_answer_box_and_downloads(vl_app):
    panel = vl_app.page.locator('[role="tabpanel"]:visible')
    panel.get_by_role("button", name="Ask about the image", exact=True).wait_for()
    assert panel.get_by_label("Answer (optional)", exact=True).is_visible()
    for name in ("Download JSON", "Download HTML report", "Download PNG of this view", "Download GIF"):
        button = vl_app.page.get_by_role("button", name=name, exact=True).filter(visible=True)
        assert button.count() == 1 and not button.is_enabled()  # nothing asked yet


def test_an_image_question_with_a_gradient_method_its_faithfulness_and_a_region(vl_app, tmp_path):
    status = vl_app.ask_image([_image(tmp_path)], "What is in the image?", 3, ["macs", "input_x_gradient"], busy=True)
    assert re.match(r"Done: \d+ tokens", status), status
    width, height = vl_app.image_overlay_size()
    assert width > 2 * 112 and height > 84  # two methods side by side, each with its caption strip
    strip = vl_app.page.locator("#image-reliance .xai-rel")  # the reliance strip: one token per answer step
    strip.first.wait_for(timeout=60_000)
    drops = strip.evaluate_all("els => els.map(e => parseFloat(e.dataset.drop))")
    assert len(drops) == int(re.match(r"Done: (\d+) tokens", status).group(1)), drops
    assert all(d == d for d in drops)  # each token has its measured drop in log p (no NaN)
    assert "hidden" in vl_app.page.locator("#image-reliance").inner_text()  # the legend says what is coloured
    vl_app.shot("image-tab-answer")

    vl_app.open_accordion("Faithfulness")
    vl_app.page.get_by_label("image+question", exact=True).check()
    vl_app.press("Measure faithfulness")
    vl_app.page.get_by_text(re.compile(r"^Measured on \d+ answer tokens")).wait_for(timeout=180_000)
    legend = vl_app.page.locator(".js-plotly-plot:visible", has_text="most influential first").first
    legend.locator(".legendtext").first.wait_for()
    names = legend.locator(".legendtext").evaluate_all("els => els.map(e => e.textContent)")
    assert any(n.startswith("macs") for n in names) and any(n.startswith("input_x_gradient") for n in names)
    assert any(n.startswith("random") for n in names), names
    assert not vl_app.page.get_by_label("skip π-Soft", exact=True).is_visible()  # no pi-Soft on images...
    assert not vl_app.page.get_by_text("π-Soft-NS / π-Soft-NC", exact=True).is_visible()  # ...nor its empty figure
    legend.scroll_into_view_if_needed()
    vl_app.shot("image-tab-faithfulness")

    vl_app.open_accordion("Which answer tokens used this?")
    picker = vl_app.page.locator("#image-region img").first
    picker.wait_for()
    vl_app.click_image_at(picker, 0.45, 0.5)  # a cell in the red square
    vl_app.page.get_by_text(re.compile(r"1 cell\.")).wait_for()
    bars = vl_app.region_bars("image-region")
    assert set(bars) == {"macs", "input_x_gradient"} and all(len(v) >= 1 for v in bars.values())
    vl_app.page.get_by_label("Rectangle (click two corners)", exact=True).check()
    vl_app.click_image_at(picker, 0.05, 0.05)
    vl_app.page.wait_for_timeout(500)  # the corner is drawn on a new picker image
    vl_app.click_image_at(picker, 0.95, 0.4)
    vl_app.page.get_by_text(re.compile(r"[2-9]\d* cells\.")).wait_for()  # the rectangle's cells
    vl_app.page.locator("#image-region").scroll_into_view_if_needed()
    vl_app.shot("image-tab-region")


def test_two_images_get_a_row_of_overlays_each_and_the_sink_toggle_redraws(vl_app, tmp_path):
    first = _image(tmp_path)
    second = tmp_path / "stripes.png"
    pixels = np.zeros((56, 84, 3), dtype=np.uint8)
    pixels[:, ::14] = (250, 250, 0)  # yellow stripes on black
    Image.fromarray(pixels).save(second)
    status = vl_app.ask_image([first, second], "What is in the image?", 2, ["macs", "rollout"])
    assert re.match(r"Done: \d+ tokens", status), status
    width, height = vl_app.image_overlay_size()
    assert height > 84 + 56  # one row per image, one under the other
    vl_app.shot("image-tab-two-images")

    vl_app.open_accordion("Which answer tokens used this?")
    chooser = vl_app.page.get_by_label("image 2", exact=True)
    chooser.check()  # the second image's grid
    picker = vl_app.page.locator("#image-region img").first
    vl_app.page.wait_for_function(
        "el => el.naturalWidth > 0 && el.naturalWidth / el.naturalHeight > 1.4", arg=picker.element_handle()
    )  # 84 x 56: wider than the first image's 112 x 84 grid picker ratio
    vl_app.click_image_at(picker, 0.5, 0.5)
    vl_app.page.get_by_text(re.compile(r"1 cell\.")).wait_for()
    bars = vl_app.region_bars("image-region")
    assert set(bars) == {"macs", "rollout"}
    vl_app.page.locator("#image-region").scroll_into_view_if_needed()
    vl_app.shot("image-tab-two-images-region")

    toggle = vl_app.page.get_by_label("Leave out attention sinks (both tabs)")
    with vl_app.page.expect_request(lambda r: "queue/join" in r.url) as redraw:
        toggle.check()  # the tiny random model has no sinks: the overlays are drawn again, unhatched
    assert '"data"' in (redraw.value.post_data or "")
    vl_app.page.wait_for_timeout(1500)
    assert vl_app.image_overlay_size()[1] > 84 + 56 and "sink" not in vl_app.status()
    assert not vl_app.page.locator(".toast-body").count()  # no error on the way


def test_the_macs_by_layer_plot_is_drawn_at_its_height_when_its_accordion_opens(vl_app, tmp_path):
    """The layer figure, drawn while its accordion was closed, came out 0 px high when it opened (the tiny VLM has
    3 layers; the figure asks for 320 px at least): opening the accordion draws it again, visible."""
    status = vl_app.ask_image([_image(tmp_path)], "What is in the image?", 2, ["macs"])
    assert re.match(r"Done: \d+ tokens", status), status
    vl_app.page.wait_for_timeout(1000)  # the layer view of the finished result, drawn in the closed accordion
    vl_app.open_accordion("MACS by layer")
    drawn = """() => { const p = document.querySelector('#image-macs-layers .js-plotly-plot');
        return !!p && !!p.data && p.getBoundingClientRect().height >= 300; }"""
    vl_app.page.wait_for_function(drawn, timeout=30_000)
    plot = vl_app.page.locator("#image-macs-layers .js-plotly-plot")
    assert plot.evaluate("el => el._fullData[0].z.length") == 3  # one row per layer
    vl_app.page.locator("#image-macs-layers").scroll_into_view_if_needed()
    vl_app.shot("image-tab-macs-by-layer")


def test_the_tiny_vision_model_has_no_calibration_weights_and_the_tab_says_how_to_make_them(vl_app):
    panel = vl_app.page.locator('[role="tabpanel"]:visible')
    note = panel.get_by_text(re.compile(r"needs weights for this model"))
    note.wait_for()
    assert "python -m explainer calibrate --model " in note.inner_text()
    assert panel.locator("input[type=checkbox][name=macs_calibrated]").count() == 0  # not offered
    assert panel.locator("input[type=checkbox][name=macs]").count() == 1
