"""The "Which answer tokens used this?" accordions' handlers with hand-built results: clicks select cells (toggled,
or a rectangle from two corners), the chart follows the selection and the step, words are chosen from the prompt."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from explainer.result.attribution import Attribution, MethodScores
from explainer.result.regions import image_region_strengths, word_region_strengths
from ui.panels import regions
from ui.panels.regions import EMPTY_SELECTION, MODES
from ui.tabs.image_tab import ImageResult

from ..conftest import image_attr


def image_result() -> ImageResult:
    return ImageResult(image_attr(3, ["macs", "random"]), Image.new("RGB", (45, 31), (40, 90, 200)), "What?", 64)


def click(x: float, y: float) -> SimpleNamespace:
    return SimpleNamespace(index=[x, y])  # what gr.SelectData carries for a click on an image


def test_clicks_toggle_cells_or_span_a_rectangle():
    one = regions.apply_click(EMPTY_SELECTION, (0, 1), MODES[0])
    two = regions.apply_click(one, (1, 2), MODES[0])
    assert one == {"cells": [[0, 1]], "corner": None, "image": 0} and two["cells"] == [[0, 1], [1, 2]]
    assert regions.apply_click(two, (0, 1), MODES[0])["cells"] == [[1, 2]]  # a second click deselects
    corner = regions.apply_click(two, (1, 0), MODES[1])
    assert corner == {"cells": [[0, 1], [1, 2]], "corner": [1, 0], "image": 0}  # the first corner; the selection...
    box = regions.apply_click(corner, (0, 1), MODES[1])
    assert box == {"cells": [[0, 0], [0, 1], [1, 0], [1, 1]], "corner": None, "image": 0}  # ...until the second


def test_the_image_accordion_shows_the_grid_then_the_chart_of_the_selected_cells():
    result = image_result()
    empty = regions.render_image_region(result, None, ["macs"], 2)
    assert empty.plot is None and empty.note == regions.IMAGE_NOTE and empty.picker.size == (360, 248)
    picked = regions.pick_cell(result, empty.selection, MODES[0], ["macs", "random"], 2, click(359, 247))
    assert picked.selection == {"cells": [[1, 2]], "corner": None, "image": 0}  # the bottom-right cell of 2 x 3
    expected = image_region_strengths(result.attr, ["macs", "random"], [(1, 2)])
    bars = {trace.name: list(trace.y) for trace in picked.plot.data}
    assert bars.keys() == expected.keys() and np.allclose(np.asarray(bars["macs"], dtype=float), expected["macs"])
    assert picked.plot.layout.shapes[0].x0 == 0.5 and "1 cell." in picked.note  # step 2 of the slider shaded
    assert picked.which["visible"] is False  # one image: no chooser
    assert regions.clear_region(result, picked.selection, ["macs"], 2).selection == EMPTY_SELECTION
    stale = regions.render_image_region(result, {"cells": [[5, 5], [0, 0]], "corner": [9, 9], "image": 3}, ["macs"], 1)
    assert stale.selection == EMPTY_SELECTION  # an image or cells of another question are dropped
    empty = regions.render_image_region(None, None, ["macs"], 1)
    assert empty.picker is None and empty.plot is None and empty.note == regions.NO_RESULT


def test_with_two_images_a_chooser_picks_the_image_whose_cells_are_selected():
    one = image_attr(3, ["macs"])
    records = [one.image, {"token_positions": [11, 12], "grid": [1, 2], "size": [20, 10]}]
    tokens = [*one.prompt_tokens, "<|image_pad|>", "<|image_pad|>"]
    raw = np.random.default_rng(1).random((3, len(tokens))).astype(np.float32)
    fields = {"prompt_tokens": tokens, "prompt_token_ids": list(range(len(tokens))),
              "methods": {"macs": MethodScores.from_raw(raw)}, "image": {**one.image, "images": records}}  # fmt: skip
    attr = Attribution(**{**one.__dict__, **fields})
    result = ImageResult(attr, [Image.new("RGB", (45, 31)), Image.new("RGB", (20, 10))], "What?", 64)
    first = regions.render_image_region(result, None, ["macs"], 1)
    assert first.which["visible"] is True and first.which["choices"] == ["image 1", "image 2"]
    second = regions.choose_image(result, "image 2", ["macs"], 1)
    assert second.selection == {**EMPTY_SELECTION, "image": 1} and second.picker.size == (360, 180)
    picked = regions.pick_cell(result, second.selection, MODES[0], ["macs"], 1, click(300, 10))
    assert picked.selection == {"cells": [[0, 1]], "corner": None, "image": 1}
    expected = image_region_strengths(attr, ["macs"], [(0, 1)], index=1)["macs"]  # token 12, over all 8 image tokens
    np.testing.assert_allclose(np.asarray(picked.plot.data[0].y, dtype=float), expected)
    over = [2, 3, 4, 5, 6, 7, 11, 12]
    z = (raw[:, 12] - raw[:, over].mean(axis=1)) / raw[:, over].std(axis=1)
    np.testing.assert_allclose(expected, z, rtol=1e-5)


def test_the_text_accordion_offers_the_prompts_words_and_charts_the_chosen_ones():
    attr = image_attr(3, ["macs"])
    text = Attribution(**{**attr.__dict__, "image": None})  # the question " What" "?" as a text prompt
    view = regions.render_word_region(text, None, ["macs"], None)
    assert view.words["choices"] == ["1: What", "2: ?"]
    assert view.plot is None and view.note == regions.TEXT_NOTE
    chosen = regions.render_word_region(text, ["1: What", "gone"], ["macs"], 3)
    assert chosen.words["value"] == ["1: What"]  # a word of an earlier prompt is dropped
    np.testing.assert_allclose(
        np.asarray(chosen.plot.data[0].y, dtype=float), word_region_strengths(text, ["macs"], ["1: What"])["macs"]
    )
    assert regions.render_word_region(None, ["1: What"], ["macs"], 1).words["choices"] == []


def test_the_accordions_follow_their_tab():
    with gr.Blocks() as demo:
        tab = {"result": gr.State(None), "step": gr.Slider(1, 3), "methods": gr.CheckboxGroup(["macs"])}
        image = regions.create_ui(image=True, elem_id="image-region")
        text = regions.create_ui(image=False, elem_id="text-region")
        regions.create_event_handlers(image, tab, api="render_image_region")
        regions.create_event_handlers(text, tab, api="render_word_region")
    fns = {f.api_name: f for f in demo.fns.values()}
    assert [t[1] for t in fns["render_image_region"].targets] == ["change"] * 3
    assert [t[1] for t in fns["render_image_region_pick"].targets] == ["select"]
    assert [t[1] for t in fns["render_word_region"].targets] == ["change"] * 3 + ["input"]
    assert fns["render_word_region"].trigger_mode == "always_last"


@pytest.mark.parametrize("mode", MODES)
def test_a_click_without_a_result_changes_nothing_but_the_note(mode):
    assert regions.pick_cell(None, None, mode, ["macs"], 1, click(0, 0)) == regions.RegionView(note=regions.NO_RESULT)
