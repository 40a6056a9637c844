"""Handlers' views turned into `{component: value}` for Gradio, and the one place a handler is put on the GPU.

A tab keeps its components in a `Components` dict by name. Its handlers return a view dataclass whose field names are
component names; `Components.bind(handler, outputs)` gives an event listener its `fn` and `outputs`: the handler
(on the GPU where `hardware.on_gpu` provides one) with each returned or yielded view turned into a dict over the
named output components. A field left at `KEEP` becomes `gr.skip()`: its component stays as it is. Every event bound
so is private (`api_visibility="private"`): the page's own wiring, not the public API (`ui/api.py`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import gradio as gr
from PIL import Image

from explainer.runtime.hardware import on_gpu

from .downloads import served_image
from .guards import admission
from .guards.errors import wrap_handler
from .guards.markup import markdown_text
from .stream import Phase, RequestState


class _Keep(enum.Enum):
    KEEP = "keep"  # an enum member: survives the pickling ZeroGPU's worker does, unlike object()


KEEP = _Keep.KEEP  # a view field's default: leave that component as it is


def view_updates(view: Any, components: dict[str, Any], outputs: Sequence[str]) -> dict[Any, Any]:
    """{component: value} over the event's `outputs`: the view's value, or `gr.skip()` for a field left at `KEEP`
    (Gradio reads an empty dict as one value, so every output is named). A picture for an image component goes as
    a file written once (`downloads.served_image`), never as a PIL object Gradio would rewrite in place.

    Raises:
        RuntimeError: a field is set that the event does not list in its outputs (a wiring mistake, named).
    """
    out = {components[name]: gr.skip() for name in outputs}
    for f in dataclasses.fields(view):
        value = getattr(view, f.name)
        if value is KEEP:
            continue
        if f.name not in outputs:
            raise RuntimeError(f"{type(view).__name__}.{f.name} is set, but it is not among this event's outputs.")
        component = components[f.name]
        picture = isinstance(value, Image.Image) and isinstance(component, gr.Image)
        out[component] = served_image(value) if picture else value
    return out


def in_turn(group: str) -> dict[str, Any]:
    """An event listener's queue settings for events that write the same widgets: one queue `group`, one event at a
    time, so they finish in the order they arrived. Gradio gives each listener a queue of its own and picks among the
    queues at random (`gradio.queueing.Queue.get_events`), so two listeners that write one view (a step's render,
    and a span's render chained after its controls) could finish out of order and leave the older view on the page.
    Not for a gated event (`Components.bind(gate=...)`): the admission gate orders those."""
    return {"concurrency_id": group, "concurrency_limit": 1}


class Components(dict):
    """A tab's components by name: the fields of its view dataclass and its input widgets."""

    def __call__(self, *names: str) -> list[Any]:
        """The named components, in order (an event's `inputs`)."""
        return [self[name] for name in names]

    def bind(
        self,
        fn: Callable[..., Any],
        outputs: Sequence[str],
        gpu: bool = False,
        duration: Callable[..., int] | None = None,
        gate: str | None = None,
    ) -> dict[str, Any]:
        """An event listener's `fn` and `outputs` for a handler returning (or yielding) views, and its API visibility:
        private, since the page's events take and return widgets and State (the public API is `ui/api.py`).

        Args:
            fn: the handler; its views' set fields must be among `outputs`.
            outputs: names of the components the event may change.
            gpu: the handler runs the model: on ZeroGPU a GPU is attached while it runs (`hardware.on_gpu`).
            duration: with `gpu`, the seconds to ask for as a function of the handler's arguments (`ui.gpu_time`).
            gate: the handler runs a model: its admission group (`admission.TEXT` or `MODEL`); it goes through the
                gate (per-visitor limits, fair turns; outside the GPU wrapper, so a waiting request holds no GPU),
                and Gradio's own queue leaves it to the gate (`concurrency_limit=None`). While it waits, its view
                shows its place in line (`status`) and a waiting request state.
        """
        names = tuple(outputs)
        handler = (on_gpu(fn, duration) if duration is not None else on_gpu(fn)) if gpu else fn
        gated = {}
        if gate is not None:
            handler = admission.gated(handler, gate, self._waiting_view(names))
            gated = {"concurrency_limit": None, "concurrency_id": f"gate_{gate}"}
        return {
            "fn": wrap_handler(handler, self._converter(names)),
            "outputs": self(*names),
            "api_visibility": "private",
            **gated,
        }

    def _converter(self, names: tuple[str, ...]) -> Callable[[Any], dict[Any, Any]]:
        """A handler's view as `{component: value}`; the gate's waiting updates are such dicts already."""
        return lambda view: view if isinstance(view, dict) else view_updates(view, self, names)

    def _waiting_view(self, outputs: tuple[str, ...]) -> Callable[[str], dict[Any, Any]]:
        """The update of a request waiting at the gate: its note on the status line, its state WAITING (so that the
        handler run after it says it was cancelled while waiting), the other outputs as they are."""

        def view(note: str) -> dict[Any, Any]:
            out = {self[name]: gr.skip() for name in outputs}
            out[self["status"]] = markdown_text(note)
            out[self["request"]] = RequestState(Phase.WAITING)
            return out

        return view


def settle(event: Any, **listener: Any) -> Any:
    """`event.then(**listener)`, and the same listener on `event.failure` (its api name + "_after_error"): a handler
    that says how a request ended must run after every ending, and Gradio 6.31's page runs a `then` after a request
    that finished or was cancelled but not after one that raised an error (seen in Chromium). Returns the `then`
    dependency: what is chained to it follows a finished or cancelled request only."""
    api = listener.get("api_name")
    after = event.then(**listener)
    event.failure(**{**listener, "api_name": f"{api}_after_error" if api else None})
    return after
