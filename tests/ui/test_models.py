"""The app's models: chosen once, loaded on first use, and the lines naming them."""

from __future__ import annotations

import pytest

from explainer.errors import InputError
from explainer.models import HUB_VISION_MODEL
from ui import models

from .conftest import FakeBundle


def test_bundles_load_once_on_first_use(fake):
    assert models.loaded_models() == 0
    assert models.model_info() == "**Model:** `embedded:SmolLM2-135M-Instruct` · loads with the first request"
    assert models.vlm_info() == models.NO_VLM and fake.loads == 0  # a page visit loads nothing
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
    monkeypatch.setattr(models, "load_model", lambda name, **kw: Vision() if name == "my-vlm" else FakeBundle())
    assert models.vlm_info() == "**Vision-language model:** `my-vlm` · loads with the first image question"
    assert models.loaded_models() == 0
    models.get_vl_bundle()
    assert models.vlm_info().startswith("**Vision-language model:** `my-vlm` · the image is resized")
    models.forget_models()
    monkeypatch.setattr(models, "load_model", lambda name, **kw: FakeBundle())  # a text-only model given as the VLM
    models.get_vl_bundle()
    assert models.vlm_info().startswith("**`fake-tiny` reads text only.**")


def test_one_id_for_both_tabs_is_loaded_once(fake, monkeypatch):
    monkeypatch.setattr(models, "model_ids", lambda: ("one-vlm", "one-vlm"))
    assert models.get_bundle() is models.get_vl_bundle() and fake.loads == 1


def test_a_model_that_cannot_load_is_named(fake, monkeypatch):
    from explainer.errors import ModelLoadError

    def broken(name=None, **kwargs):
        raise ModelLoadError(f"Model {name!r} not found.")

    monkeypatch.setattr(models, "model_ids", lambda: ("nope", "nope-vl"))
    monkeypatch.setattr(models, "load_model", broken)
    with pytest.raises(ModelLoadError, match="Model 'nope-vl' not found"):
        models.get_vl_bundle()
    with pytest.raises(ModelLoadError, match="Model 'nope' not found"):
        models.get_bundle()
    models.preload()  # start-up on ZeroGPU: a model that cannot load is left for its tab to report
    assert models.loaded_models() == 0


def test_model_line_names_the_precision_set_by_explainer_dtype(fake, monkeypatch):
    import torch

    from explainer.models import bundle_from_objects, load_model
    from explainer.precision import parse_dtype

    from ..conftest import build_model, make_tokenizer

    tokenizer = make_tokenizer()
    asked = []

    def load(name=None, dtype=None, **options):
        asked.append(dtype)
        model = build_model("llama").to(parse_dtype(dtype) or torch.float32)
        return bundle_from_objects(model, tokenizer, name="tiny-llama")

    monkeypatch.setattr(models, "load_model", load)
    monkeypatch.setenv("EXPLAINER_DTYPE", "bfloat16")
    models.get_bundle()
    line = models.model_info()
    assert asked == ["bfloat16"] and "`tiny-llama` · bfloat16 on cpu · prompts up to" in line
    models.forget_models()
    monkeypatch.delenv("EXPLAINER_DTYPE")
    models.get_bundle()
    assert "· float32 on cpu ·" in models.model_info() and asked[-1] is None  # unset: the device's default
    models.forget_models()
    monkeypatch.setattr(models, "load_model", load_model)  # the real loader refuses a bad name before loading
    monkeypatch.setenv("EXPLAINER_DTYPE", "bf15")
    with pytest.raises(InputError, match="Unknown dtype 'bf15': use one of auto, float32, bfloat16, float16"):
        models.get_bundle()


def test_device_map_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("EXPLAINER_DEVICE_MAP", "auto")
    models.get_bundle()
    assert fake.load_options["device_map"] == "auto"
    models.forget_models()
    monkeypatch.delenv("EXPLAINER_DEVICE_MAP")
    models.get_bundle()
    assert fake.load_options["device_map"] is None
