"""The image tab's reliance strip (`ui/panels/reliance.py`): drawn from the tab's result at the slider's step, empty
before a question, placed above the overlays and following the result and the step through an internal event."""

from __future__ import annotations

import gradio as gr
from PIL import Image

from ui.panels import reliance
from ui.tabs import image_tab
from ui.tabs.image_tab import ImageResult
from visuals.reliance import reliance_html

from ...visuals.test_reliance import result


def test_the_strip_is_the_results_at_the_sliders_step():
    image = ImageResult(result(), Image.new("RGB", (28, 14)))
    assert reliance.render_reliance(image, 2).reliance == reliance_html(image.attr, 1)  # 1-based slider
    assert reliance.render_reliance(image, None).reliance == reliance_html(image.attr, None)
    assert reliance.render_reliance(image.attr, 1).reliance == reliance_html(image.attr, 0)  # an Attribution too
    assert reliance.render_reliance(None, 1) == reliance.RelianceView(reliance="")


def test_the_image_tab_shows_it_above_the_overlays_and_it_follows_result_and_step():
    with gr.Blocks() as demo:
        tab = image_tab.create_ui()
    order = [block._id for block in demo.blocks.values()]
    assert order.index(tab["step"]._id) < order.index(tab["reliance"]._id) < order.index(tab["overlay"]._id)
    (fn,) = [f for f in demo.fns.values() if f.api_name == "render_image_reliance"]
    assert [t[1] for t in fn.targets] == ["change", "change"] and fn.trigger_mode == "always_last"
    assert [b._id for b in fn.inputs] == [tab["result"]._id, tab["step"]._id]
    assert [b._id for b in fn.outputs] == [tab["reliance"]._id]
    assert fn.api_visibility == "private"  # an internal event, not part of the public API
