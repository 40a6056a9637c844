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

from ui.errors import user_errors
from ui.events import KEEP, Components, view_updates

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
