"""The app's models: chosen once, loaded on first use, and the lines naming them."""

from __future__ import annotations

import pytest

from explainer.errors import InputError
from explainer.models.loading import HUB_VISION_MODEL
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

    from explainer.models.loading import bundle_from_objects, load_model
    from explainer.runtime.precision import parse_dtype

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


class Flaky:
    """A loader whose first call fails (a download that timed out at start-up) and whose later calls succeed."""

    def __init__(self):
        self.calls: list[tuple[str | None, dict]] = []

    def __call__(self, name=None, **options):
        from explainer.errors import ModelLoadError

        self.calls.append((name, options))
        if len(self.calls) == 1:
            raise ModelLoadError(f"Could not load model {name!r}: the Hub timed out.")
        return FakeBundle()


def test_on_zerogpu_a_failed_preload_is_reported_and_not_tried_again(fake, monkeypatch):
    from explainer.errors import ModelLoadError

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(models, "model_ids", lambda: ("org/text", None))
    monkeypatch.setattr(models, "load_model", loader := Flaky())
    with pytest.raises(ModelLoadError, match="^The model 'org/text' was not loaded at start-up. On ZeroGPU"):
        models.get_bundle()  # no preload (not the app's way): still no load from a request's thread
    models.preload()  # start-up, in the main thread
    assert models.loaded_models() == 0 and loader.calls[0][1]["device"] == "cuda"
    for _ in range(2):  # every request, from any thread: the reason, and no second load (no CUDA outside a call)
        with pytest.raises(ModelLoadError) as info:
            models.get_bundle()
        assert str(info.value).startswith(
            "The model 'org/text' failed to load when the Space started: Could not load model 'org/text': the Hub "
            "timed out. On ZeroGPU the models load only at start-up"
        )
    assert len(loader.calls) == 1
    assert models.model_info() == (
        "**Model:** `org/text` · failed to load at start-up: Could not load model 'org/text': the Hub timed out."
    )


def test_off_zerogpu_a_failed_load_is_tried_again_by_the_next_request(fake, monkeypatch):
    from explainer.errors import ModelLoadError

    monkeypatch.setattr(models, "model_ids", lambda: ("org/text", None))
    monkeypatch.setattr(models, "load_model", loader := Flaky())
    with pytest.raises(ModelLoadError, match="the Hub timed out"):
        models.get_bundle()
    assert models.get_bundle() is models.get_bundle() and len(loader.calls) == 2
    models.forget_models()
    monkeypatch.setattr(models, "load_model", loader := Flaky())
    models.preload()  # a preload that failed (the app preloads only on ZeroGPU) does not stick either
    assert models.get_bundle() is not None and len(loader.calls) == 2
    assert models.model_info() == "**Model:** `fake-tiny` · prompts up to 32 tokens"


def test_on_zerogpu_the_vision_model_that_failed_is_named_on_its_tab(fake, monkeypatch):
    from explainer.errors import ModelLoadError

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(models, "model_ids", lambda: ("org/text", "org/vlm"))
    monkeypatch.setattr(models, "load_model", lambda name, **kw: Flaky()(name) if name == "org/vlm" else FakeBundle())
    models.preload()
    assert models.get_bundle() is not None and models.loaded_models() == 1
    with pytest.raises(ModelLoadError, match="'org/vlm' failed to load when the Space started: Could not load"):
        models.get_vl_bundle()
    assert models.vlm_info().startswith("**Vision-language model:** `org/vlm` · failed to load at start-up: Could")


def test_a_loaded_bundle_is_handed_out_while_another_thread_loads(fake, monkeypatch):
    """A request never waits for (or holds) the loading lock once its model is loaded: on ZeroGPU `spaces` forks
    its GPU worker while other threads run, and a lock held at that moment stays held in the worker."""
    import threading

    monkeypatch.setattr(models, "model_ids", lambda: ("one-vlm", "one-vlm"))
    loaded = models.get_bundle()
    got = []
    with models._load_lock:  # another thread loading (or a lock copied into a forked worker while held)
        for get in (models.get_bundle, models.get_vl_bundle):
            t = threading.Thread(target=lambda get=get: got.append(get()), daemon=True)
            t.start()
            t.join(timeout=10)
    assert got == [loaded, loaded]


def test_a_gpu_worker_forked_while_locks_are_held_gets_its_bundle_and_estimates(fake, monkeypatch):
    """What `spaces` does on ZeroGPU, for real: fork the worker while other threads hold the loading lock and the
    estimates' speed guard; the worker (child) gets the bundle and the assumed speed instead of waiting forever."""
    import os
    import time

    from explainer import estimate

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    models.preload()
    bundle = models.get_bundle()
    with models._load_lock, estimate._speeds_guard:
        pid = os.fork()
        if pid == 0:  # the worker: exit 0 when it got both, 1 otherwise; a deadlock never exits
            code = 1
            try:
                code = 0 if models.get_bundle() is bundle and estimate.speed(bundle, probe=False) else 1
            finally:
                os._exit(code)
    deadline, status = time.monotonic() + 20, None
    while status is None and time.monotonic() < deadline:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        else:
            time.sleep(0.05)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert status == 0, "the forked worker deadlocked" if status is None else f"the worker failed: {status}"


def test_the_model_lines_on_zerogpu_name_it_not_the_cpu(fake, monkeypatch):
    import torch

    from explainer.models.loading import bundle_from_objects

    from ..conftest import build_model, make_tokenizer

    class Vision:
        name, image_processor = "tiny-vlm", object()
        model = build_model("llama").to(torch.bfloat16)  # in the main process the weights report the CPU

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(models, "model_ids", lambda: ("tiny-llama", "tiny-vlm"))
    text = bundle_from_objects(build_model("llama").to(torch.bfloat16), make_tokenizer(), name="tiny-llama")
    monkeypatch.setattr(models, "load_model", lambda name, **kw: text if name == "tiny-llama" else Vision())
    models.preload()
    assert models.model_info() == "**Model:** `tiny-llama` · bfloat16 on ZeroGPU · prompts up to 4096 tokens"
    assert models.vlm_info().startswith("**Vision-language model:** `tiny-vlm` · bfloat16 on ZeroGPU · the image")


def test_the_start_up_summary_names_each_model_and_its_dtype(fake, monkeypatch, cpu_flags):
    monkeypatch.delenv("EXPLAINER_DTYPE", raising=False)
    monkeypatch.setattr(models, "model_ids", lambda: ("org/text", "org/vlm"))
    assert models.summary() == (
        "text model org/text (float32, loads with its tab's first request); "
        "image model org/vlm (float32, loads with its tab's first request)"
    )
    cpu_flags(" amx_bf16")  # a CPU with native bf16: "auto" loads bfloat16 there
    assert models.summary().startswith("text model org/text (bfloat16, loads")
    monkeypatch.setenv("EXPLAINER_DTYPE", "float16")
    assert "(float16, loads" in models.summary()
    monkeypatch.setenv("EXPLAINER_DTYPE", "bf15")
    assert "(unknown dtype 'bf15', loads" in models.summary()  # the start-up line does not fail; requests say why
    monkeypatch.delenv("EXPLAINER_DTYPE")
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(models, "model_ids", lambda: (None, None))
    models.preload()
    assert models.summary() == "text model embedded:SmolLM2-135M-Instruct (no weights, loaded); image model none"
    monkeypatch.setattr(models, "model_ids", lambda: ("one-vlm", "one-vlm"))
    assert models.summary() == "one model for both tabs: one-vlm (bfloat16, loads with its tab's first request)"
