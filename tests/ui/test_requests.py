"""Each tab's explain request is built by one function (`ui/requests.py`, `contrast.contrast_request`) from its
handler's own arguments, and the ZeroGPU duration of the handler (`gpu_time`) reads the very same request: these
tests fail if the handler and its duration ever read the widget values in different orders."""

from __future__ import annotations

import inspect

import pytest
from PIL import Image

from explainer.methods import available_methods, method_options
from explainer.request import ExplainRequest
from ui import gpu_time, options, requests, stream
from ui.panels import contrast
from ui.tabs import image_tab, text_tab

from .. import upload_files
from .conftest import FakeStream, collect, image_attr
from .panels.test_contrast import result


def handler_parameters(handler) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(handler).parameters.values() if p.name != "progress"]


@pytest.mark.parametrize(
    "builder, handler",
    [
        (requests.text_request, text_tab.explain),
        (requests.image_request, image_tab.explain_image),
        (contrast.contrast_request, contrast.explain_contrast),
    ],
)
def test_each_builder_takes_its_handlers_arguments_in_order(builder, handler):
    assert handler_parameters(builder) == handler_parameters(handler)


def option_values(chosen: dict | None = None) -> list:
    """The "Method options" widgets' values in their order: the defaults, but `chosen` {(method, option): value}."""
    defaults = {(m, o.name): o.default for m in available_methods() for o in method_options(m)}
    return [(chosen or {}).get(key, defaults[key]) for key in options.option_keys()]


@pytest.fixture
def seen(monkeypatch):
    """The requests that reach the library (from a handler) and `gpu_time.request_seconds` (from a duration)."""
    out = {"library": [], "duration": []}

    def library(bundle, request, progress=None, cancel=None):
        out["library"].append(request)
        methods = list(request.method_names)
        return FakeStream([image_attr(1, methods, len(request.images) > 1) if request.images else result()])

    def duration(request):
        out["duration"].append(request)
        return 60

    monkeypatch.setattr(stream, "stream_request", library)
    monkeypatch.setattr(gpu_time, "request_seconds", duration)
    return out


def test_the_text_tab_and_its_duration_read_the_same_request(fake, seen):
    values = option_values({("macs", "alpha"): 0.25, ("macs", "pooling"): "mean"})
    asked = ("Where is Paris", ["random", "macs"], 5, False, True, None, True, "word", *values)
    collect(text_tab.explain(*asked))
    assert gpu_time.text_seconds(*asked) == 60
    (handler,), (duration,) = seen["library"], seen["duration"]
    assert handler == duration == requests.text_request(*asked)
    assert handler.method_names == ("random", "macs") and handler.max_new_tokens == 5
    assert not handler.chat_template and handler.unit == "word" and handler.answer is None
    assert handler.method_options["macs"]["alpha"] == 0.25 and handler.method_options["macs"]["pooling"] == "mean"


def test_the_image_tab_and_its_duration_read_the_same_request(vl_fake, seen, tmp_path):
    path = upload_files.uploaded(tmp_path / "blue.png")
    Image.new("RGB", (45, 31), (40, 90, 200)).save(path)
    gallery = [{"image": {"path": str(path), "orig_name": "b.png"}, "caption": None}]
    asked = (str(path), "What?", ["rollout", "macs"], 3, 0.3, False, 128, None, gallery, *option_values())
    collect(image_tab.explain_image(*asked))
    assert gpu_time.image_seconds(*asked) == 60
    (handler,), (duration,) = seen["library"], seen["duration"]
    assert handler == duration
    assert handler.prompt == "What?" and handler.method_names == ("rollout", "macs") and handler.max_new_tokens == 3
    assert handler.max_image_tokens == 128 and len(handler.images) == 2 and handler.images[0].size == (45, 31)


def test_the_contrast_accordion_and_its_duration_read_the_same_request(fake, seen):
    asked = ("Where is it?", ["macs", "atman"], False, True, "sentence", result(), 2, "21", "", *option_values())
    collect(contrast.explain_contrast(*asked))
    assert contrast.contrast_seconds(*asked) == 60
    (handler,), (duration,) = seen["library"], seen["duration"]
    assert handler == duration
    assert handler.answer == (10, 20) and handler.max_new_tokens == 2 and handler.contrast == {1: 21}
    assert handler.unit == "sentence" and not handler.chat_template


def test_a_refused_request_asks_for_the_minimum_and_never_reaches_the_estimate(fake, seen):
    least = gpu_time.gpu_duration(None)
    assert gpu_time.text_seconds("Where is Paris", [], 5, True) == least  # no method
    assert gpu_time.text_seconds("Where is Paris", ["macs"], 5, True, False, None, False, "pages") == least
    assert seen["duration"] == []
    assert isinstance(requests.text_request("Where is Paris", ["macs"], 5, True), ExplainRequest)
