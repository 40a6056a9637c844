"""Following the library's streams: request states, merging, a visitor who leaves, the shared explain driver."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from explainer import bundle_from_objects, explain
from explainer.errors import InputError
from explainer.result.attribution import Attribution
from explainer.runtime.session import model_lock, run_in_worker
from ui import models, stream
from ui.events import Components
from ui.stream import Phase, RequestState, Update
from ui.tabs import text_tab

from ..conftest import build_model
from ..explainer.runtime.test_session import PROMPTS, SlowMACS
from .conftest import FakeBundle, FakeStream, collect


def drive(items, empty="nothing") -> list[Update]:
    return collect(stream.run_stream(FakeBundle(), lambda cancel: FakeStream(items), empty))


def test_a_stream_is_a_note_then_running_updates_then_done():
    assert drive([1, 2]) == [
        Update(None, RequestState(Phase.STARTING), stream.STARTING),
        Update(1, RequestState(Phase.RUNNING)),
        Update(2, RequestState(Phase.RUNNING)),
        Update(2, RequestState(Phase.DONE)),
    ]


def test_a_failure_is_recorded_before_it_is_raised():
    def failing():
        yield 1
        raise InputError("Out of memory.")

    seen = []

    async def run():
        async for update in stream.run_stream(FakeBundle(), lambda cancel: FakeStream(failing()), "nothing"):
            seen.append(update)

    with pytest.raises(InputError, match="Out of memory"):
        asyncio.run(run())
    assert seen[-1] == Update(None, RequestState(Phase.RUNNING, error="Out of memory."))
    assert seen[-1].request.settled() == RequestState(Phase.FAILED, error="Out of memory.")
    with pytest.raises(InputError, match="nothing"):  # no update at all
        drive([])


def test_a_failure_before_the_first_token_replaces_the_starting_note():
    """An empty prompt (or a request refused for memory) fails before any update: the status line must not keep
    saying "Reading the prompt…" (seen in the browser; Gradio runs no follow-up handler after an error)."""

    def failing():
        raise InputError("The prompt is empty.")
        yield  # a generator

    seen = []

    async def run():
        async for update in stream.run_stream(FakeBundle(), lambda cancel: FakeStream(failing()), "nothing"):
            seen.append(update)

    with pytest.raises(InputError, match="empty"):
        asyncio.run(run())
    assert seen[0].note == stream.STARTING
    assert seen[-1] == Update(
        None,
        RequestState(Phase.STARTING, error="The prompt is empty."),
        "Stopped before the first token: The prompt is empty.",
    )


def test_settled_states():
    assert RequestState(Phase.RUNNING).settled() == RequestState(Phase.CANCELLED)
    assert RequestState(Phase.WAITING, error="x").settled() == RequestState(Phase.FAILED, error="x")
    for phase in (Phase.IDLE, Phase.DONE, Phase.CANCELLED, Phase.FAILED):
        assert RequestState(phase).settled() == RequestState(phase) and not RequestState(phase).in_flight


def test_a_request_behind_another_says_it_waits():
    bundle = FakeBundle()
    lock = model_lock(bundle.model)
    assert stream.waiting_note(bundle) is None
    lock.acquire(None)
    try:
        assert stream.waiting_note(bundle) == f"{stream.WAITING}: 1 request ahead (a cancelled one stops first)…"
        first = drive([1])[0]
        assert first.request == RequestState(Phase.WAITING) and first.note.startswith(stream.WAITING)
    finally:
        lock.release()


def test_follow_merges_what_arrives_between_updates(monkeypatch):
    monkeypatch.setattr(stream, "UPDATE_SECONDS", 0.05)
    release = threading.Event()

    def work():
        yield from range(5)
        release.wait(5)
        yield 5

    class Model:
        pass

    async def run():
        seen = []
        async for item in stream.follow(run_in_worker(work, Model())):
            seen.append(item)
            release.set()
        return seen

    seen = asyncio.run(run())
    assert seen[-1] == 5 and len(seen) < 6 and seen == sorted(seen)  # some merged away; the end always arrives


def test_follow_never_holds_back_the_first_or_the_last_update():
    """A crowd's streams wait longer between updates (`update_seconds`), but a visitor's first token and complete
    answer go out as soon as they exist."""
    release = threading.Event()

    def work():
        yield 0
        release.wait(5)
        yield from range(1, 4)

    class Model:
        pass

    async def run():
        seen, t0 = [], time.monotonic()
        async for item in stream.follow(run_in_worker(work, Model()), interval=lambda: 60.0):
            seen.append((item, time.monotonic() - t0))
            release.set()
        return seen, time.monotonic() - t0

    seen, took = asyncio.run(run())
    assert [item for item, _ in seen] == [0, 3]  # 1 and 2 merged away
    assert took < 30  # the end did not wait out the 60 s interval


def test_a_crowd_gets_fewer_updates_each(monkeypatch):
    bundle = FakeBundle()
    for decoding, seconds in [(0, stream.UPDATE_SECONDS), (1, stream.UPDATE_SECONDS), (4, 4 * stream.UPDATE_SECONDS),
                              (40, stream.CROWD_UPDATE_SECONDS)]:  # fmt: skip
        monkeypatch.setattr(stream.batching, "counts", lambda model, d=decoding: (d, 3))
        assert stream.update_seconds(bundle) == seconds


def _attr(tokens: list[str], **meta) -> Attribution:
    ids = list(range(len(tokens)))
    return Attribution(model="m", prompt_token_ids=[0], prompt_tokens=["a"], generated_token_ids=ids,
                       generated_tokens=tokens, meta=meta)  # fmt: skip


def test_the_step_slider_opens_on_the_last_content_token_once_finished():
    attr = _attr([" Yes", ".", "<|im_end|>"])
    assert stream.step_slider(attr, live=True) == {
        "__type__": "update", "minimum": 1, "maximum": 3, "value": 3, "interactive": False
    }  # fmt: skip
    assert stream.step_slider(attr, live=False)["value"] == 2 and stream.step_slider(attr, False)["interactive"]
    assert stream.step_slider(attr, live=False, value=1)["value"] == 1
    one = stream.step_slider(_attr(["<|im_end|>"]), live=False)
    assert one["value"] == 1 and one["maximum"] == 2 and not one["interactive"]  # gradio needs max > min


@pytest.mark.parametrize("live", [True, False])
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("value", [None, -2, 0, 1, 2, 3, 9, 2.6])
def test_every_step_slider_update_sets_its_value_within_the_bounds_it_sets(steps, value, live):
    """Each update carries the value and the bounds together, the value inside them (a step past the answer is its
    last step), so an update that arrives late never leaves the slider past its maximum."""
    update = stream.step_slider(_attr([" a"] * steps), live, value)
    assert {"minimum", "maximum", "value"} <= set(update) and update["minimum"] == 1
    assert 1 <= update["value"] <= max(steps, 1) < update["maximum"] + 1 and isinstance(update["value"], int)
    if value is not None and 1 <= value <= steps:
        assert update["value"] == int(value)


def test_stopped_requests_say_where_and_why():
    partial = _attr([" It", " is"], status="running")
    assert stream.stopped(RequestState(Phase.DONE), partial) is None and stream.stopped(None, partial) is None
    stop = stream.stopped(RequestState(Phase.RUNNING), partial)
    assert stop.partial and stop.request.phase is Phase.CANCELLED and stop.status.startswith("Stopped after 2 tokens")
    given = _attr([" It"], answer="given")
    assert "1 given answer's tokens (failed" in stream.stopped(RequestState(Phase.RUNNING, error="x"), given).status
    done = stream.stopped(RequestState(Phase.RUNNING), _attr([" It"], status="done"))
    assert done == stream.Stopped(RequestState(Phase.DONE), None, False)


def test_a_visitor_who_leaves_stops_the_work_and_the_next_request_starts_at_once(tokenizer, monkeypatch):
    """What Gradio does when a visitor closes the tab: it closes the handler it registered; the work must stop."""
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    real = stream.stream_request

    def slow_stream(b, request, **kw):  # the app's own call, with a method slow enough to be caught running
        return real(b, request.replace(methods=(SlowMACS(),), max_new_tokens=60), **kw)

    monkeypatch.setattr(models, "get_bundle", lambda: bundle)
    monkeypatch.setattr(stream, "stream_request", slow_stream)
    components = Components({name: name for name in text_tab.SHOWN})
    registered = components.bind(text_tab.explain, text_tab.SHOWN, gpu=True)["fn"]  # as the event runs it

    async def visit_then_leave():
        handler = registered(PROMPTS[0], ["macs"], 60, True, False)
        assert (await handler.__anext__())["status"] == stream.STARTING  # the status line first; no work yet
        first = await handler.__anext__()  # the first token
        assert model_lock(bundle.model).locked()  # the work is running
        await handler.aclose()
        return first

    async def leave_before_the_work_starts():
        handler = registered(PROMPTS[0], ["macs"], 60, True, False)
        await handler.__anext__()  # the status line
        await handler.aclose()

    asyncio.run(leave_before_the_work_starts())
    assert not model_lock(bundle.model).locked()  # nothing was started, so nothing holds the model
    assert asyncio.run(visit_then_leave())["result"].num_steps >= 1
    t0 = time.perf_counter()
    while model_lock(bundle.model).locked() and time.perf_counter() - t0 < 5:
        time.sleep(0.01)
    assert not model_lock(bundle.model).locked() and time.perf_counter() - t0 < 2.0
    t0 = time.perf_counter()
    assert explain(bundle, PROMPTS[0], methods=["macs"], max_new_tokens=2).num_steps == 2
    assert time.perf_counter() - t0 < 2.0


def test_a_waiting_request_sees_its_place_in_line_and_the_work_ahead(monkeypatch):
    """While the work waits for the model (`session.place`), the status note says where it stands and refreshes."""
    monkeypatch.setattr(stream, "UPDATE_SECONDS", 0.05)
    bundle = FakeBundle()
    lock = model_lock(bundle.model)
    lock.acquire(None, seconds=30.0)  # someone's 30 s of AtMan
    notes = []

    async def run() -> list[Update]:
        seen = []
        start = lambda cancel: run_in_worker(lambda: iter([1]), bundle.model, cancel)  # noqa: E731
        async for update in stream.run_stream(bundle, start, "nothing"):
            seen.append(update)
            if "in line" in update.note and lock.locked():
                notes.append(update.note)
                lock.release()
        return seen

    seen = asyncio.run(run())
    assert notes and notes[0] == stream.queue_note(1, 30.0) and "next in line, about 30 s of work ahead" in notes[0]
    assert seen[len(notes)].request == RequestState(Phase.WAITING)
    assert seen[-1] == Update(1, RequestState(Phase.DONE))
    assert stream.queue_note(3, None).startswith(f"{stream.WAITING}: number 3 in line, no estimate yet")
