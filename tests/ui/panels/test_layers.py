"""The "MACS by layer" accordion's handler with hand-built results: the figure of the step on the slider over the
user's text (or every token), and a note while there is nothing to show; the app keeps MACS's layers on."""

from __future__ import annotations

import dataclasses

import gradio as gr
import numpy as np

from explainer.result.attribution import Attribution, MethodScores
from ui import options
from ui.panels import layers

STEPS, LAYERS, N = 3, 4, 6


def result(with_layers: bool = True, **meta) -> Attribution:
    rng = np.random.default_rng(0)
    factors = (0.2 + 0.8 * rng.random((STEPS, LAYERS, N))).astype(np.float32)  # (K, L, N)
    macs = MethodScores.from_raw(factors.astype(np.float64).prod(axis=1), meta={"alpha": 0.8})
    return Attribution(
        model="fake-tiny",
        prompt_token_ids=list(range(N)),
        prompt_tokens=["<s>", " Where", " is", " Paris", "?", "</s>"],
        generated_token_ids=[10, 20, 30],
        generated_tokens=[" It", " is", " there"],
        methods={"macs": macs.with_layers(factors) if with_layers else macs},
        user_positions=[1, 2, 3, 4],
        meta={"status": "done", **meta},
    )


def test_the_step_on_the_slider_over_the_users_text():
    attr = result()
    view = layers.render_layers(attr, 2, False)  # the slider is 1-based
    z = np.asarray(view.plot.data[0].z)
    np.testing.assert_allclose(z, attr.methods["macs"].layers[1][:, [1, 2, 3, 4]], rtol=1e-6)
    assert view.note == layers.NOTE
    every = layers.render_layers(attr, 3, True)
    np.testing.assert_allclose(np.asarray(every.plot.data[0].z), attr.methods["macs"].layers[2], rtol=1e-6)
    newest = layers.render_layers(attr, None)
    np.testing.assert_allclose(np.asarray(newest.plot.data[1].z)[0], attr.methods["macs"].raw[2, 1:5], rtol=1e-6)


def test_an_image_result_is_read_through_its_attribution():
    @dataclasses.dataclass(frozen=True)
    class ImageResult:  # the image tab's State holds the result and its image
        attr: Attribution
        image: object = None

    attr = result()
    attr.image = {"token_positions": [0], "grid": [1, 1], "size": [14, 14]}
    view = layers.render_layers(ImageResult(attr), 1)
    assert np.asarray(view.plot.data[0].z).shape == (LAYERS, 5)  # the image token and the question's


def test_notes_instead_of_a_figure():
    assert layers.render_layers(None, 1) == layers.LayersView(plot=None, note=layers.NO_RESULT)
    no_macs = dataclasses.replace(result(), methods={})
    assert layers.render_layers(no_macs, 1).note == layers.NO_RESULT
    assert layers.render_layers(result(False, status="generating: 2 tokens"), 1).note == layers.LIVE
    assert layers.render_layers(result(False), 1).note == layers.NO_LAYERS
    old_file = result(False)
    del old_file.meta["status"]
    assert layers.render_layers(old_file, 1) == layers.LayersView(plot=None, note=layers.NO_LAYERS)


def test_the_app_keeps_macs_layers_on_and_a_visitor_may_turn_them_off():
    with gr.Blocks():
        _, widgets = options.create_ui()
    widget = dict(zip(options.option_keys(), widgets))
    assert widget[("macs", "keep_layers")].value is True and widget[("macs", "alpha")].value == 0.8
    values = [w.value for w in widgets]
    assert options.chosen_options(["macs"], values)["macs"]["keep_layers"] is True


def test_the_accordion_follows_result_step_and_show_all():
    with gr.Blocks() as demo:
        tab = {"result": gr.State(None), "step": gr.Slider(1, 3), "show_all": gr.Checkbox()}
        panel = layers.create_ui()
        layers.create_event_handlers(panel, tab)
    (fn,) = [f for f in demo.fns.values() if f.api_name == "render_layers"]
    assert [t[1] for t in fn.targets] == ["change", "change", "change"] and fn.trigger_mode == "always_last"
    assert [b._id for b in fn.inputs] == [tab["result"]._id, tab["step"]._id, tab["show_all"]._id]
