"""The app's models: chosen once, loaded on first use, and the lines naming them."""

from __future__ import annotations

import gradio as gr
import pytest

from explainer.errors import InputError
from explainer.models import HUB_VISION_MODEL
from ui import models

from .conftest import FakeBundle


def test_bundles_load_once_on_first_use(fake):
    assert models.loaded_models() == 0
    assert models.get_bundle() is models.get_bundle() and fake.loads == 1
    assert models.model_info() == "**Model:** `fake-tiny` · prompts up to 32 tokens"
    models.forget_models()
    models.get_bundle()
    assert fake.loads == 2


def test_without_a_vision_model_the_image_tab_says_how_to_set_one(fake):
    assert models.vlm_info() == models.NO_VLM and HUB_VISION_MODEL in models.NO_VLM  # the id comes from the library
    with pytest.raises(InputError, match="EXPLAINER_VLM=Qwen") as info:
        models.get_vl_bundle()
    assert "`" not in str(info.value) and "**" not in str(info.value)  # plain text in an error popup


def test_the_vision_model_line(fake, monkeypatch):
    class Vision(FakeBundle):
        name = "my-vlm"
        image_processor = object()

    monkeypatch.setattr(models, "model_ids", lambda: (None, "my-vlm"))
    monkeypatch.setattr(models, "load_model", lambda name: Vision() if name == "my-vlm" else FakeBundle())
    assert models.vlm_info().startswith("**Vision-language model:** `my-vlm`")
    models.forget_models()
    monkeypatch.setattr(models, "load_model", lambda name: FakeBundle())  # a text-only model given as the VLM
    assert models.vlm_info().startswith("**`fake-tiny` reads text only.**")


def test_a_model_that_cannot_load_is_named(fake, monkeypatch):
    from explainer.errors import ModelLoadError

    def broken(name=None):
        raise ModelLoadError(f"Model {name!r} not found.")

    monkeypatch.setattr(models, "model_ids", lambda: ("nope", "nope-vl"))
    monkeypatch.setattr(models, "load_model", broken)
    assert models.vlm_info() == "**Could not load the vision-language model `nope-vl`:** Model 'nope-vl' not found."
    with pytest.raises(gr.Error, match="Model 'nope' not found"):
        models.model_info()
