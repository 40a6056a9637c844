"""The Sources accordion's handler and wiring."""

from __future__ import annotations

import gradio as gr

from ui.panels import sources
from visuals.sources import NO_SOURCES

from ...visuals.test_sources import result


def test_the_accordion_shows_the_sources_of_the_step_on_the_slider():
    assert "step 1" in sources.render_sources(result(), 1).sources
    assert "step 2" in sources.render_sources(result(), None).sources
    assert sources.render_sources(None, 1).sources == NO_SOURCES


def test_it_follows_the_result_and_the_step_unprocessed():
    with gr.Blocks() as demo:
        tab = {"result": gr.State(None), "step": gr.Slider(1, 3)}
        sources.create_event_handlers(sources.create_ui(), tab)
    (fn,) = [f for f in demo.fns.values() if f.api_name == "render_sources"]
    assert [t[1] for t in fn.targets] == ["change", "change"] and not fn.preprocess
