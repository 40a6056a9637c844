"""Views turned into `{component: value}`, and handlers put on the GPU in one place."""

from __future__ import annotations

import asyncio
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pytest

from ui.events import KEEP, Components, settle, view_updates
from ui.guards.errors import user_errors

SKIP = gr.skip()


@dataclass
class View:
    a: Any = KEEP
    b: Any = KEEP
    c: Any = KEEP


def test_kept_fields_are_left_out_and_unlisted_ones_refused():
    components = Components(a="A", b="B", c="C", extra="X")
    assert view_updates(View(a=1, c=None), components, ("a", "b", "c")) == {"A": 1, "B": SKIP, "C": None}
    assert view_updates(View(), components, ("a",)) == {"A": SKIP}  # an empty dict would read as one value
    with pytest.raises(RuntimeError, match=r"View\.b is set, but it is not among this event's outputs"):
        view_updates(View(b=2), components, ("a",))
    assert components("c", "a") == ["C", "A"]


@user_errors
def plain(x):
    return View(a=x)


@user_errors
async def streaming(n, progress=None):
    for i in range(n):
        yield View(b=i)


def test_bind_gives_the_outputs_and_converts_every_kind():
    components = Components(a="A", b="B", c="C")
    bound = components.bind(plain, ("a", "c"))
    assert bound["outputs"] == ["A", "C"] and bound["fn"](3) == {"A": 3, "C": SKIP}
    assert inspect.unwrap(bound["fn"]) is inspect.unwrap(plain)
    agen = components.bind(streaming, ("b",))["fn"]
    assert inspect.isasyncgenfunction(agen) and inspect.signature(agen) == inspect.signature(streaming)

    async def drain():
        return [item async for item in agen(2)]

    assert asyncio.run(drain()) == [{"B": 0}, {"B": 1}]


def test_only_gpu_handlers_are_put_on_the_gpu(monkeypatch):
    wrapped = []

    def gpu(fn, duration=None):  # a stand-in for spaces.GPU: records, keeps the kind
        wrapped.append(fn)
        return fn

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=gpu))
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    components = Components(a="A", b="B", c="C")
    components.bind(plain, ("a",))
    assert wrapped == []
    components.bind(streaming, ("b",), gpu=True)
    assert wrapped == [streaming]


def test_settle_runs_its_listener_after_every_ending():
    """`settle` registers the listener twice on the same event: as `then` (a finished or cancelled request) and as
    `failure` (one that raised: Gradio 6.31's page runs no `then` after an error)."""
    with gr.Blocks() as blocks:
        box = gr.Textbox()
        event = box.submit(lambda x: x, box, box, api_name="ask")
        after = settle(event, fn=lambda x: x, inputs=box, outputs=box, api_name="after_ask")
    fns = {f.api_name: f for f in blocks.fns.values()}
    asked, then, failure = fns["ask"], fns["after_ask"], fns["after_ask_after_error"]
    assert then.trigger_after == failure.trigger_after == asked._id
    assert not then.trigger_only_on_failure and not then.trigger_only_on_success
    assert failure.trigger_only_on_failure
    assert after["id"] == then._id  # the `then` dependency is what follow-ups chain to


def test_every_handler_that_says_how_a_request_ended_runs_after_an_error_too():
    """In the app, each `after_*` handler and each run button's ready state that follows an event also follows that
    event's failure (`settle`), so a request that fails mid-answer still gets its status and free sliders."""
    import app

    fns = list(app.demo.fns.values())
    follows = [f for f in fns if f.trigger_after is not None and not f.trigger_only_on_failure]
    enders = [f for f in follows if (f.name or "").startswith("after_") or (f.api_name or "").endswith("_ready")]
    assert len(enders) >= 7  # text, contrast, image, both faithfulness panels, Generate, Ask
    failures = {(f.trigger_after, f.name) for f in fns if f.trigger_only_on_failure}
    assert [f.api_name for f in enders if (f.trigger_after, f.name) not in failures] == []


def test_every_event_that_follows_a_request_reads_the_step_sliders_unprocessed():
    """A request's updates shrink the step sliders, Gradio's copy of them first. An event that follows another one
    (a `then`) or a widget's change may still carry the step the page showed before: Gradio's bounds check refused
    it ("Value 3 is greater than maximum value 2", after a Cancel, when the next request's first update came between
    `after_explain` and the views and PNG chained to it). Such events take the step unprocessed (`FOLLOWS_STEP`;
    the views clamp it); only a visitor's click on a button or on the image grid takes it processed."""
    import app

    def is_step_slider(block) -> bool:
        return isinstance(block, gr.Slider) and (block.label or "").startswith(("Generation step", "Span end"))

    fns = list(app.demo.fns.values())
    readers = [f for f in fns if any(is_step_slider(b) for b in f.inputs)]
    following = [f for f in readers if {kind for _, kind in f.targets} - {"click", "select"}]
    assert len(following) >= 20  # the panels', the views', the downloads'
    assert [f.api_name for f in following if f.preprocess] == []
    assert {"render_after_explain", "export_view_after_explain", "render", "export_image_view"} <= {
        f.api_name for f in following
    }


def test_events_that_write_one_widget_finish_in_the_order_they_arrive():
    """Gradio queues each listener apart and picks among the queues at random, so two listeners that write one widget
    can finish out of order: a span's render (chained after its controls) finishing after the render of a later
    "Prompt units" change left the token view on the page. Every queued event that writes a widget another queued
    event writes runs in one queue group of one at a time (`in_turn`), but the gated requests (their gate orders
    them). The rule is over the whole page, so a new listener of a view is held to it."""
    import app
    from ui.events import in_turn

    assert in_turn("views") == {"concurrency_id": "views", "concurrency_limit": 1}
    queued = [
        f for f in app.demo.fns.values()
        if f.fn is not None and f.queue is not False and not str(f.concurrency_id).startswith("gate_")
    ]  # fmt: skip
    default = app.demo._queue.default_concurrency_limit
    limits = {f.concurrency_id: default if f.concurrency_limit == "default" else f.concurrency_limit for f in queued}
    writers: dict[int, list] = {}
    for f in queued:
        for block in f.outputs:
            writers.setdefault(block._id, []).append(f)
    shared = [fs for fs in writers.values() if len(fs) > 1]
    assert len(shared) >= 20  # the views, the downloads, the panels' figures, the method checkboxes
    apart = [sorted(f.api_name for f in fs) for fs in shared if len({f.concurrency_id for f in fs}) > 1]
    assert apart == []
    assert {limits[fs[0].concurrency_id] for fs in shared} == {1}  # one listener's (the model line's) share its own
    events = {f.api_name: f for f in queued}
    pairs = [("render_span", "render"), ("render_image_after_explain", "render_image"),
             ("export_span_view", "export_view"), ("after_faithfulness", "render_faithfulness")]  # fmt: skip
    for first, later in pairs:
        assert events[first].concurrency_id == events[later].concurrency_id, (first, later)


def test_a_picture_for_an_image_component_goes_as_a_served_file_and_a_state_keeps_its_object(monkeypatch, tmp_path):
    from PIL import Image

    from ui import events

    served = []
    monkeypatch.setattr(events, "served_image", lambda image: served.append(image) or str(tmp_path / "image.png"))
    picture = Image.new("RGB", (4, 3), (200, 30, 30))
    with gr.Blocks():
        components = Components(a=gr.Image(), b=gr.State(), c=gr.Image())
    out = view_updates(View(a=picture, b=picture, c=None), components, ("a", "b", "c"))
    assert out[components["a"]] == str(tmp_path / "image.png") and served == [picture]
    assert out[components["b"]] is picture and out[components["c"]] is None
