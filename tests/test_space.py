"""Space readiness: the app's default models (Hub reachable or not, CPU or GPU) and the optional `spaces.GPU` wrapping.

No test touches the network: `models._open_url` is replaced by fakes, and conftest sets HF_HUB_OFFLINE for the rest.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
import types
import urllib.error
from pathlib import Path

import anyio
import gradio as gr
import pytest

from explainer.models import loading as models
from explainer.runtime import hardware

REPO = Path(__file__).resolve().parents[1]
# the events that run the model: the page's, and the public API's (ui/api.py)
GPU_HANDLERS = ("page_explain", "explain_contrast", "page_faithfulness", "page_explain_image", "image_faithfulness",
                "explain", "explain_image", "contrast", "faithfulness")


class _Answer:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def hub(monkeypatch):
    """A fake Hub: `hub.up = False` makes the opener fail like a machine without network; `hub.requests` records."""

    class Hub:
        up = True
        error: Exception | None = None
        requests: list = []

    state = Hub()
    state.requests = []

    def opener(request, timeout):
        state.requests.append((request.get_method(), request.full_url, timeout))
        if state.error is not None:
            raise state.error
        if not state.up:
            raise urllib.error.URLError(OSError(-2, "Name or service not known"))
        return _Answer()

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "EXPLAINER_MODEL", "EXPLAINER_VLM", "SPACES_ZERO_GPU"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(models, "_open_url", opener)
    monkeypatch.setattr(models.torch.cuda, "is_available", lambda: False)
    models.hub_reachable.cache_clear()
    yield state
    models.hub_reachable.cache_clear()


def test_online_cpu_defaults_to_the_small_instruct_model_and_the_vision_model(hub, monkeypatch):
    monkeypatch.setenv("EXPLAINER_MEMORY_BUDGET", "16GB")  # a free CPU Space
    assert models.default_model_ids() == ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2-VL-2B-Instruct")
    # asked once per process, with a HEAD request and the short timeout
    assert hub.requests == [
        ("HEAD", "https://huggingface.co/api/models/Qwen/Qwen2.5-0.5B-Instruct", models.HUB_CHECK_TIMEOUT)
    ]


def test_a_free_cpu_space_fits_both_defaults_and_starts_without_loading_them(hub, monkeypatch):
    """The Hub reachable (mocked) and 16 GB: the default models fit with room to spare, and a page visit loads
    neither (each loads with its tab's first request). The 2 CPUs' thread count: explainer/runtime/test_threads.py."""
    import torch

    from explainer.runtime import fit
    from ui import models as ui_models

    monkeypatch.setenv("EXPLAINER_MEMORY_BUDGET", "16GB")
    # the CPU has no native bf16: the autouse `cpu_flags` fixture (tests/conftest.py)
    text, vision = models.default_model_ids()
    need = sum(fit.model_bytes(fit.bundled_config(m), torch.float32) for m in (text, vision))
    assert 16e9 - need > 2.5e9
    loads = []
    monkeypatch.setattr(ui_models, "load_model", lambda *a, **k: loads.append(a))
    monkeypatch.setattr(ui_models, "model_ids", lambda: (text, vision))
    ui_models.forget_models()
    assert "loads with the first request" in ui_models.model_info()
    assert "loads with the first image question" in ui_models.vlm_info()
    assert loads == [] and ui_models.loaded_models() == 0


@pytest.mark.parametrize("how", ["cuda", "zerogpu"])
def test_online_gpu_defaults_to_the_larger_model(hub, monkeypatch, how):
    if how == "cuda":
        monkeypatch.setattr(models.torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr("explainer.runtime.memory.available_bytes", lambda device: 40 * 10**9)  # a 40 GB GPU, free
    else:  # ZeroGPU: no GPU is visible before a request, the variable says one will be
        monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert models.default_model_ids() == ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct")


@pytest.mark.parametrize(
    "error",
    [
        urllib.error.URLError(OSError(-2, "Name or service not known")),
        TimeoutError("timed out"),
        urllib.error.HTTPError("https://huggingface.co", 503, "Service Unavailable", {}, None),
    ],
)
def test_offline_gives_the_embedded_model_and_no_vision_model(hub, error):
    hub.error = error
    assert models.default_model_ids() == (None, None)
    assert models.default_model_ids() == (None, None) and len(hub.requests) == 1  # not asked again


def test_a_client_error_still_means_the_hub_is_there(hub):
    hub.error = urllib.error.HTTPError("https://huggingface.co", 429, "Too Many Requests", {}, None)
    assert models.hub_reachable() is True


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_variables_skip_the_check(hub, monkeypatch, variable):
    monkeypatch.setenv(variable, "1")
    assert models.default_model_ids() == (None, None)
    assert hub.requests == []


def test_mirror_endpoint_is_asked(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/")
    assert models.hub_reachable()
    assert hub.requests[0][1] == "https://mirror.example/api/models/Qwen/Qwen2.5-0.5B-Instruct"


def test_environment_variables_win(hub, monkeypatch):
    monkeypatch.setenv("EXPLAINER_MODEL", "some/model")
    monkeypatch.setenv("EXPLAINER_VLM", "./my-vlm")
    assert models.default_model_ids() == ("some/model", "./my-vlm")
    assert hub.requests == []  # both set: no network at all

    monkeypatch.setenv("EXPLAINER_VLM", "none")  # the image tab off on purpose
    assert models.default_model_ids() == ("some/model", None)

    monkeypatch.delenv("EXPLAINER_VLM")
    assert models.default_model_ids() == ("some/model", models.hardware_defaults().vision)
    hub.up = False
    models.hub_reachable.cache_clear()
    assert models.default_model_ids() == ("some/model", None)
    monkeypatch.setenv("EXPLAINER_MODEL", "embedded")
    assert models.default_model_ids() == ("embedded", None)


# --- spaces.GPU (ZeroGPU) ---


def _fake_spaces(monkeypatch) -> list:
    """Install a fake `spaces` module whose GPU decorator records what it wrapped and marks the result."""
    wrapped = []

    def GPU(fn, duration=None):  # noqa: N802 - the real name
        wrapped.append((fn, duration))
        if inspect.isgeneratorfunction(fn):  # as spaces does: a generator function stays one

            @functools.wraps(fn)
            def marked(*args, **kwargs):
                yield from fn(*args, **kwargs)

        else:

            @functools.wraps(fn)
            def marked(*args, **kwargs):
                return fn(*args, **kwargs)

        marked.zerogpu = fn
        return marked

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    return wrapped


async def _handler(n: int, *options, progress=None):
    """Like the app's handlers: an async generator that hands work to a thread and cleans up in `finally`."""
    try:
        for i in range(n):
            yield await anyio.to_thread.run_sync(lambda i=i: i * i)
    finally:
        _handler.closed += 1


_handler.closed = 0


def test_without_spaces_handlers_are_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` raises ImportError
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert hardware.on_gpu(_handler) is _handler


def test_with_spaces_off_zerogpu_the_async_handler_is_passed_as_it_is(monkeypatch):
    wrapped = _fake_spaces(monkeypatch)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)

    out = hardware.on_gpu(_handler)

    assert wrapped == [(_handler, hardware.ZERO_GPU_SECONDS)] and out.zerogpu is _handler


def test_on_zerogpu_async_handlers_become_generators_spaces_can_run(monkeypatch):
    wrapped = _fake_spaces(monkeypatch)
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")

    out = hardware.on_gpu(_handler, seconds=30)

    ((fn, seconds),) = wrapped
    assert seconds == 30 and inspect.isgeneratorfunction(fn) and not inspect.isasyncgenfunction(fn)
    assert inspect.signature(fn) == inspect.signature(_handler)  # Gradio still sees the parameters (progress too)
    assert fn.__name__ == "_handler" and out.zerogpu is fn
    assert list(out(4)) == [0, 1, 4, 9]


def test_sync_generator_closes_the_async_one_when_stopped_early_and_passes_errors():
    run = hardware.sync_generator(_handler)
    before = _handler.closed
    gen = run(10)
    assert [next(gen), next(gen)] == [0, 1]
    gen.close()
    assert _handler.closed == before + 1  # the handler's finally ran (the app cancels the library's work there)

    async def failing():
        yield 1
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        list(hardware.sync_generator(failing)())


def _registered(demo) -> dict:
    return {f.api_name: f.fn for f in demo.fns.values() if f.api_name in GPU_HANDLERS}


def _handlers() -> dict:
    from ui import api
    from ui.panels import contrast, faithfulness
    from ui.tabs import image_tab, text_tab

    return {
        "explain": api.explain,
        "explain_image": api.explain_image,
        "contrast": api.contrast,
        "faithfulness": api.faithfulness,
        "page_explain": text_tab.explain,
        "explain_contrast": contrast.explain_contrast,
        "page_faithfulness": faithfulness.faithfulness,
        "page_explain_image": image_tab.explain_image,
        "image_faithfulness": faithfulness.faithfulness,
    }


def _wrapped_chain(fn) -> list:
    """`fn` and every function it wraps (`functools.wraps`' `__wrapped__`), outermost first."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    return chain


def test_app_registers_its_handlers_unchanged_without_spaces():
    import app
    from ui import models as ui_models

    if "spaces" in sys.modules:  # pragma: no cover - only where a real `spaces` is installed
        pytest.skip("the spaces package is installed here")
    registered = _registered(app.demo)
    assert set(registered) == set(GPU_HANDLERS)
    for name, fn in registered.items():  # the admission gate over the handler (views turned into dicts); no GPU wrapper
        assert _handlers()[name] in _wrapped_chain(fn) and inspect.isasyncgenfunction(fn) and not hasattr(fn, "zerogpu")
    ui_models.model_ids.cache_clear()
    assert ui_models.model_ids() == (None, None)  # tests run offline: embedded model, no image tab


def test_app_with_spaces_on_zerogpu_wraps_the_gpu_handlers_and_asks_the_hub_only_when_needed(hub, monkeypatch):
    from ui import models as ui_models

    wrapped = _fake_spaces(monkeypatch)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    preloaded = []  # on ZeroGPU the app creates its models at import (tests/ui/test_zerogpu.py runs that for real)
    monkeypatch.setattr(ui_models, "preload", lambda: preloaded.append(1))
    spec = importlib.util.spec_from_file_location("app_on_zerogpu", REPO / "app.py")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # a second app, built with the fake `spaces`

    registered = _registered(fresh.demo)
    assert set(registered) == set(GPU_HANDLERS)
    for name, fn in registered.items():  # what Gradio runs: a generator over the GPU-wrapped generator
        assert fn.zerogpu.__wrapped__ is _handlers()[name] and inspect.isgeneratorfunction(fn.zerogpu)
        assert inspect.isgeneratorfunction(fn)
    assert len(wrapped) == len(GPU_HANDLERS)  # each event its own wrapper, the two faithfulness panels' too
    with pytest.raises(gr.Error, match="Select at least one"):  # runs through every wrapper, the error included
        list(registered["page_explain"](None, "Where is Paris?", [], 8, True, False))  # None: no Gradio request
    assert preloaded == [1] and hub.requests == []  # the (stubbed) preload was the only start-up work
    ui_models.model_ids.cache_clear()
    try:
        assert ui_models.model_ids() == (models.HUB_TEXT_MODEL_GPU, models.HUB_VISION_MODEL)
        assert len(hub.requests) == 1
    finally:
        ui_models.model_ids.cache_clear()
