"""The methods a visitor can tick and the "Method options" widgets generated from the methods' configs."""

from __future__ import annotations

import gradio as gr
import pytest

from explainer import available_methods
from explainer.methods import method_options
from explainer.methods.calibration import CalibrationWeights, config_fingerprint
from explainer.models.loading import EMBEDDED_MODEL
from ui import models, options
from ui.guards.markup import markdown_code

from ..conftest import build_model


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


# macs_calibrated is offered only for a model with weights (`models.calibrated`, `options.offer_methods`)


@pytest.fixture
def text_model(monkeypatch):
    """Choose the app's text model (a folder or None: the embedded one); nothing is loaded."""

    def choose(model_id, vlm=None) -> None:
        monkeypatch.setattr(models, "model_ids", lambda: (model_id, vlm))
        models.forget_models()

    yield choose
    models.forget_models()


def test_a_model_without_weights_is_not_offered_the_method_and_is_told_how_to_make_them(
    text_model, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path))  # an empty folder: no weights for the tiny model
    text_model(str(tiny_model_dir))
    view = options.offer_methods(["macs", "macs_calibrated", "rollout"])
    assert options.CALIBRATED not in view.methods["choices"] and "macs" in view.methods["choices"]
    assert view.methods["value"] == ["macs", "rollout"]  # a tick it cannot run is taken off
    command = f"python -m explainer calibrate --model {tiny_model_dir} --data squad_v2-train"
    assert view.methods_note == {"__type__": "update", "visible": True, "value": (
        f"*MACS (calibrated)* needs weights for this model: make them with `{command}`, then reload the page."
    )}  # fmt: skip
    assert options.offered_choices() == view.methods["choices"]
    CalibrationWeights(config_fingerprint(build_model("llama")), "tiny", [1.0, 1.0, 1.0]).save(
        tmp_path / f"{config_fingerprint(build_model('llama'))}.json"
    )  # made as the note says: offered on the next page view
    view = options.offer_methods(["macs_calibrated"])
    assert options.CALIBRATED in view.methods["choices"] and view.methods["value"] == ["macs_calibrated"]
    assert view.methods_note["visible"] is False


def test_the_note_escapes_the_model_name(text_model, monkeypatch):
    hostile = "evil`](http://x.example)<img src=x>"
    monkeypatch.setattr(models, "calibrated", lambda vision=False: (hostile, False))
    note = options.calibration_note()
    span = markdown_code(f"python -m explainer calibrate --model {hostile} --data squad_v2-train")
    assert span.startswith("`` ") or span.startswith("``p")  # fenced with more backticks than the name holds
    assert note == f"*MACS (calibrated)* needs weights for this model: make them with {span}, then reload the page."


def test_the_embedded_model_is_offered_its_shipped_weights(text_model, tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path))  # nothing in the user's folder
    text_model(None)
    assert models.calibrated() == (EMBEDDED_MODEL, True)  # read from its configuration: no model is loaded
    assert models.loaded_models() == 0
    view = options.offer_methods(["macs", "macs_calibrated"])
    assert options.CALIBRATED in view.methods["choices"] and not view.methods_note["visible"]


def test_a_loaded_model_is_judged_by_its_own_config(text_model, tokenizer, tmp_path, monkeypatch):
    from explainer import bundle_from_objects

    text_model("tiny-2")  # no such folder: its configuration cannot be read, but the loaded model's is used
    assert models.calibrated() is None and options.offered_choices() == options.method_choices()[0]
    monkeypatch.setattr(models, "load_model", lambda *a, **k: bundle_from_objects(
        build_model("llama", num_hidden_layers=2), tokenizer, name="tiny-2"))  # fmt: skip
    models.get_bundle()
    assert models.calibrated() == ("tiny-2", False)
    assert options.CALIBRATED not in options.offered_choices()


def test_an_api_call_naming_the_method_for_a_model_without_weights_gets_the_librarys_message(
    text_model, tokenizer, monkeypatch
):
    from explainer import bundle_from_objects
    from ui import api

    from .conftest import collect

    text_model("tiny-2")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: bundle_from_objects(
        build_model("llama", num_hidden_layers=2), tokenizer, name="tiny-2"))  # fmt: skip
    with pytest.raises(gr.Error, match=r"no weights for .*Make them with: explainer calibrate --model "):
        collect(api.endpoint(api.explain, None)("Paris is", ["macs_calibrated"], 2))


def test_the_image_tab_offers_it_by_the_vision_models_weights(text_model, tmp_path, monkeypatch):
    from tests.vl_tiny import make_vl_tokenizer, vl_config

    text_model(None)
    assert options.offer_image_methods(["macs"]) == options.MethodsView()  # no vision model: nothing changes
    folder = tmp_path / "vlm"
    vl_config(make_vl_tokenizer()).save_pretrained(folder)  # its configuration alone: no weights are read
    monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path / "weights"))
    text_model(None, str(folder))
    view = options.offer_image_methods(["macs", "macs_calibrated"])
    assert options.CALIBRATED not in view.methods["choices"] and view.methods["value"] == ["macs"]
    assert f"`python -m explainer calibrate --model {folder} --images FOLDER`" in view.methods_note["value"]
    fingerprint = config_fingerprint(vl_config(make_vl_tokenizer()))
    CalibrationWeights(fingerprint, "tiny-vl", [1.0] * 3).save(tmp_path / "weights" / f"{fingerprint}.json")
    assert options.CALIBRATED in options.offer_image_methods([]).methods["choices"]
