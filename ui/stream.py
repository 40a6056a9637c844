"""Following the library's streams in a handler: updates merged to a few a second, cancellation, the request state.

The work runs in the library's worker thread, which holds the model (`runtime.session`). A handler drives it with
`run_stream` (or `explain_updates`, for the explain request both tabs send) and renders each `Update`. Every update
carries the request's `RequestState`, which the handler keeps in a `gr.State`; the handler that Gradio runs after the
request, however it ended, reads it to say what happened: a request still "in flight" there was
cancelled, or failed if it recorded an error (`stopped`).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import gradio as gr

from explainer.decoding import batched as batching
from explainer.errors import InputError
from explainer.estimate import format_seconds
from explainer.explain import stream_request
from explainer.models.loading import ModelBundle
from explainer.request import ExplainRequest, fit_answer
from explainer.result.attribution import Attribution
from explainer.result.steps import last_content_step
from explainer.runtime.session import CancelToken, WorkerStream, model_lock, place

from .guards.markup import markdown_text

T = TypeVar("T")
UPDATE_SECONDS = 0.25  # at most ~4 streamed updates per second; the final state is always sent
CROWD_UPDATE_SECONDS = 2.0  # while visitors decode together, each one's stream waits up to this long between updates
WAITING = "Waiting for the model"  # how the status note of a request queued behind another starts
STARTING = "Reading the prompt…"  # the status note until the first update
NO_TOKENS = "The model produced no tokens. Try another prompt or more new tokens."


class Phase(enum.Enum):
    IDLE = "idle"  # nothing asked yet (or a saved result opened)
    WAITING = "waiting"  # queued behind another request on the model
    STARTING = "starting"  # sent; no update yet
    RUNNING = "running"  # updates arriving
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


IN_FLIGHT = frozenset({Phase.WAITING, Phase.STARTING, Phase.RUNNING})


@dataclass(frozen=True)
class RequestState:
    """Where a visitor's newest request stands (kept in a `gr.State`).

    Attributes:
        phase: see `Phase`; a handler only ever leaves it in flight or DONE, the after-handler settles the rest.
        error: the message of a request that failed (the visitor saw it as an error).
    """

    phase: Phase = Phase.IDLE
    error: str = ""

    @property
    def in_flight(self) -> bool:
        return self.phase in IN_FLIGHT

    def settled(self) -> RequestState:
        """What an in-flight request became once it stopped: FAILED with its error, else CANCELLED."""
        if not self.in_flight:
            return self
        return dataclasses.replace(self, phase=Phase.FAILED if self.error else Phase.CANCELLED)


@dataclass(frozen=True)
class Update(Generic[T]):
    """One thing for a handler to show: the newest result (None for a note alone) and the request's state."""

    item: T | None
    request: RequestState
    note: str = ""  # the status line before the first result (waiting for the model, reading the prompt)


def update_seconds(bundle: ModelBundle) -> float:
    """How long a visitor's stream waits between two updates: `UPDATE_SECONDS`, times the number of visitors whose
    answers decode together on the model (`decoding.batched`), at most `CROWD_UPDATE_SECONDS`. A crowd then gets
    about 4 updates a second in all rather than 4 each: every update re-sends the growing result, and on a small CPU
    the formatting and sending of those updates took the cores the batch decodes on. The first update and the last
    are never held back."""
    decoding, _ = batching.counts(bundle.model)
    return min(CROWD_UPDATE_SECONDS, UPDATE_SECONDS * max(1, decoding))


async def follow(
    stream: WorkerStream[T], idle: Callable[[], Any] | None = None, interval: Callable[[], float] | None = None
) -> AsyncIterator[Any]:
    """The newest update of a library stream, at most every `interval()` seconds (default `UPDATE_SECONDS`; the
    first and the last update go out at once), until it ends; when no update came for `UPDATE_SECONDS`, what
    `idle()` returns, unless None.

    When the visitor cancels or closes the tab, Gradio cancels this coroutine: the `finally` cancels the work, which
    stops within one forward pass and only then releases the model, so the next visitor's request starts on a
    quiet model. An error of the work is raised here.
    """

    def take() -> tuple[str, Any]:
        try:
            return "item", stream.latest(UPDATE_SECONDS)
        except StopIteration:
            return "end", None

    try:
        last = 0.0
        while True:
            kind, item = await anyio.to_thread.run_sync(take, abandon_on_cancel=True)
            if kind == "end":
                return
            if item is None:
                item = idle() if idle is not None else None
                if item is None:
                    continue
            yield item
            wait = (UPDATE_SECONDS if interval is None else interval()) - (time.monotonic() - last)
            last = time.monotonic()
            if wait > 0:
                await _pause(stream, wait)  # updates arriving meanwhile are merged into the newest one
    finally:
        stream.cancel("The visitor cancelled the request or left the page.")


async def _pause(stream: Any, seconds: float) -> None:
    """Wait `seconds`, or less once the work has ended: its last update then goes out at once."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if not getattr(stream, "running", True):
            return
        await anyio.sleep(min(left, 0.05))


@dataclasses.dataclass(frozen=True)
class _Queued:
    note: str


def queue_note(position: int, seconds: float | None) -> str:
    """The status of a request waiting its turn on the model (`session.place`): its place in line and the estimated
    work ahead of it; visitors' text decoding goes first (`explainer/runtime/turns.py`)."""
    ahead = "no estimate yet of the work ahead" if seconds is None else f"{format_seconds(seconds)} of work ahead"
    line = "next in line" if position == 1 else f"number {position} in line"
    return f"{WAITING}: {line}, {ahead} (visitors' text answers are generated first, short work next)…"


def _with_status(item: Any, note: str) -> Any:
    """A streamed result with `note` as its status (a new snapshot; the work's own is never changed)."""
    if not isinstance(item, Attribution):
        return item
    return dataclasses.replace(item, meta={**item.meta, "status": note})


def waiting_note(bundle: ModelBundle) -> str | None:
    """The note "Waiting for the model: N requests ahead…" while another request holds the model, else None; while
    visitors' text requests decode together (`decoding.batched`), how many decode and how many wait to join."""
    decoding, joining = batching.counts(bundle.model)
    if decoding or joining:
        return f"{WAITING}: {decoding} decoding together, {joining} joining (text requests share the steps)…"
    lock = model_lock(bundle.model)
    if not lock.locked():
        return None
    ahead = lock.waiting + 1
    return f"{WAITING}: {ahead} request{'s' if ahead > 1 else ''} ahead (a cancelled one stops first)…"


async def run_stream(
    bundle: ModelBundle, start: Callable[[CancelToken], WorkerStream[T]], empty: str
) -> AsyncIterator[Update[T]]:
    """Drive one library stream on `bundle` for a handler.

    Yields a note first (the status line carries Gradio's progress bar, so it says something at once), then each
    update as RUNNING, then the last one again as DONE. A failure is recorded in the request state (one more update,
    without a result) before it is raised.

    Args:
        bundle: the model the work holds (for the waiting note).
        start: starts the work with the request's cancel token (e.g. `stream_request(..., cancel=token)`).
        empty: the message when the work ends without a single update.
    """
    note = waiting_note(bundle)
    request = RequestState(Phase.WAITING if note else Phase.STARTING)
    yield Update(None, request, note or STARTING)
    item = None
    token = CancelToken()
    shown = [note]

    def idle() -> _Queued | None:  # while the work waits for the model: its place in line, when that changed
        where = place(bundle.model, token)
        text = None if where is None else queue_note(*where)
        if text is None or text == shown[0]:
            return None
        shown[0] = text
        return _Queued(text)

    try:
        updates = follow(start(token), idle, lambda: update_seconds(bundle))
        async with aclosing(updates) as items:  # a visitor who leaves closes it at once
            async for got in items:
                if isinstance(got, _Queued):  # before the first result: the note; after it: the result's status
                    if item is None:
                        request = RequestState(Phase.WAITING)
                    yield Update(None if item is None else _with_status(item, got.note), request, got.note)
                    continue
                item = got
                request = RequestState(Phase.RUNNING)
                yield Update(item, request)
        if item is None:
            raise InputError(empty)
    except Exception as e:
        message = getattr(e, "message", None) or str(e)
        note = f"Stopped before the first token: {markdown_text(message)}" if item is None else ""
        yield Update(None, dataclasses.replace(request, error=message), note)
        raise
    yield Update(item, RequestState(Phase.DONE))


async def explain_updates(
    bundle: ModelBundle, request: ExplainRequest, progress: Callable[..., Any]
) -> AsyncIterator[Update[Attribution]]:
    """The explain request of both tabs (`requests.text_request`, `requests.image_request`, the contrast
    accordion's): `stream_request` driven by `run_stream`.

    Args:
        bundle: the text or vision-language bundle.
        request: the request; a given answer raises its `max_new_tokens` to fit (the library's rule,
            `request.fit_answer`).
        progress: Gradio's progress tracker (post-hoc methods report through it).
    """
    request = fit_answer(bundle, request)

    def start(cancel: CancelToken) -> WorkerStream[Attribution]:
        return stream_request(bundle, request, progress=lambda f, message: progress(f, desc=message), cancel=cancel)

    async with aclosing(run_stream(bundle, start, NO_TOKENS)) as updates:
        async for update in updates:
            yield update


def finished(attr: Any) -> bool:
    """Whether a streamed result is complete (its methods all ran)."""
    return isinstance(attr, Attribution) and attr.meta.get("status") == "done"


# Events that follow the step slider (its change, or the result's) or another event (the views and downloads chained
# after a request) take their inputs unprocessed: a new request shrinks the slider while such events, sent by the page
# before that update arrived, still carry the old step, and Gradio's bounds check refused them with "Value 12 is
# greater than maximum value 2" error toasts after every Cancel or long answer. The views clamp every step
# (`explainer.result.steps.clamp_step`); such events read only States, sliders, checkboxes, radios and dropdowns, whose
# raw values are their values.
FOLLOWS_STEP = {"preprocess": False}


def step_slider(attr: Attribution, live: bool, value: int | None = None) -> dict:
    """A step slider's update for a result: locked to the newest step while live; a finished answer opens on its
    last content token (`steps.last_content_step`), or on `value` (1-based, clamped to the steps) when given. With
    one step it stays locked (Gradio needs maximum > minimum; the views clamp step 2 to 1 anyway). Every update sets
    the value with the bounds it fits, so no update, however late it arrives, leaves a value past its maximum."""
    steps = max(attr.num_steps, 1)
    if value is None:
        value = steps if live else (last_content_step(attr) or 0) + 1
    value = min(max(int(value), 1), steps)
    return gr.update(minimum=1, maximum=max(steps, 2), value=value, interactive=not live and steps > 1)


def status_line(attr: Attribution, live: bool) -> str:
    """The status line of a result: the library's progress while live, then what was done and how long it took."""
    if live:
        return markdown_text(attr.meta.get("status") or f"Generating… {attr.num_steps} tokens")
    timings = ", ".join(f"{markdown_text(name)} {scores.seconds:.2f} s" for name, scores in attr.methods.items())
    given = " of the given answer (teacher-forced)" if attr.meta.get("answer") == "given" else ""
    done = f"Done: {attr.num_steps} tokens{given}. Time per method: {timings or 'n/a'}."
    return done + " Move the slider to explain any token."


@dataclass(frozen=True)
class Stopped:
    """What the handler run after an explain request shows when the request stopped in flight."""

    request: RequestState  # the settled state
    status: str | None  # the status line; None when the request had in fact finished
    partial: bool  # a partial answer is shown: its sliders are freed


def stopped(request: Any, attr: Attribution | None) -> Stopped | None:
    """For the handler Gradio runs after every explain request, however it ended: None when the request finished
    (or the state is not a request's); else where it stopped, and whether it was cancelled or failed."""
    if not isinstance(request, RequestState) or not request.in_flight:
        return None
    if request.phase is Phase.RUNNING and finished(attr):  # stopped between its last update and the end
        return Stopped(RequestState(Phase.DONE), None, False)
    why = "failed with the message shown" if request.error else "cancelled"
    if request.phase is Phase.WAITING:
        why = why if request.error else "cancelled while waiting for the model"
        return Stopped(
            request.settled(), f"Stopped before it started ({why}); the views show the previous result.", False
        )
    if request.phase is Phase.STARTING or attr is None or not attr.num_steps:
        note = f"Stopped before the first token ({why}); the views show the previous result."
        return Stopped(request.settled(), note, False)
    what = "given answer's tokens" if attr.meta.get("answer") == "given" else "tokens"
    note = (
        f"Stopped after {attr.num_steps} {what} ({why}); the model is free again. Move the slider to explain any of "
        "them."
    )
    return Stopped(request.settled(), note, True)
