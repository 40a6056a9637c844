"""The methods a visitor can tick and the "Method options" widgets generated from the methods' configs."""

from __future__ import annotations

import gradio as gr

from explainer import available_methods
from explainer.methods import method_options
from ui import options


def test_option_widgets_are_generated_from_the_configs():
    keys = [(m, o.name) for m in available_methods() for o in method_options(m)]
    with gr.Blocks():
        box, widgets = options.create_ui()
    assert options.option_keys() == keys and len(widgets) == len(keys) and isinstance(box, gr.Accordion)
    widget = dict(zip(keys, widgets))
    assert isinstance(widget[("macs", "pooling")], gr.Dropdown) and widget[("macs", "pooling")].value == "max"
    assert isinstance(widget[("atman", "fast")], gr.Checkbox) and isinstance(widget[("macs", "alpha")], gr.Number)


def test_only_the_selected_methods_options_are_passed():
    keys = options.option_keys()
    values = [0.5 if k == ("macs", "alpha") else None if k[0] == "rollout" else 1 for k in keys]
    chosen = options.chosen_options(["macs", "rollout"], values)
    assert set(chosen) == {"macs"} and chosen["macs"]["alpha"] == 0.5  # rollout's values are all None
    assert options.chosen_options([], values) == {}


def test_macs_and_rollout_are_ticked_on_first_use():
    choices, default = options.method_choices()
    assert default == ["macs", "rollout"] and choices == list(available_methods())
    assert options.method_choices(image=True)[1] == ["macs", "rollout"]


def test_image_defaults_keep_only_methods_that_explain_images(monkeypatch):
    from explainer.methods import METHODS

    monkeypatch.setattr(METHODS["input_x_gradient"], "explains_images", False)  # a method without image support
    monkeypatch.setattr(options, "DEFAULT_METHODS", ["macs", "input_x_gradient", "atman"])
    assert options.method_choices()[1] == ["macs", "input_x_gradient", "atman"]
    assert options.method_choices(image=True)[1] == ["macs", "atman"]
    assert not options.explains_images("input_x_gradient") and options.explains_images("atman")
    monkeypatch.setattr(options, "DEFAULT_METHODS", ["input_x_gradient"])
    assert options.method_choices(image=True)[1] == options.method_choices()[0][:1]  # never none ticked


def test_every_registered_method_can_be_ticked_for_image_prompts():
    from explainer.methods import METHODS

    assert options.method_choices(image=True)[0] == list(METHODS)
