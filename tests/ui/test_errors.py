"""The one decorator that turns the library's typed errors into `gr.Error`, for every kind of handler."""

from __future__ import annotations

import asyncio
import inspect

import gradio as gr
import pytest

from explainer.errors import InputError, UnknownMethodError
from ui.errors import user_errors, wrap_handler


@user_errors
def plain(x: int, progress: gr.Progress = gr.Progress()) -> int:  # noqa: B008
    """Doc."""
    if x < 0:
        raise InputError("x must not be negative")
    if x == 0:
        raise ValueError("a bug, not the visitor's doing")
    return x


@user_errors
async def coroutine(x: int) -> int:
    if x < 0:
        raise UnknownMethodError("No method 'x'; valid: macs")
    return x


closed = []


@user_errors
def generator(n: int):
    try:
        yield from range(n)
        raise InputError("ran out")
    finally:
        closed.append("generator")


@user_errors
async def agenerator(n: int):
    try:
        for i in range(n):
            yield i
        raise InputError("ran out")
    finally:
        closed.append("agenerator")


def test_each_kind_keeps_its_kind_name_and_signature():
    assert inspect.signature(plain) == inspect.signature(inspect.unwrap(plain)) and plain.__doc__ == "Doc."
    assert not inspect.isgeneratorfunction(plain) and inspect.iscoroutinefunction(coroutine)
    assert inspect.isgeneratorfunction(generator) and inspect.isasyncgenfunction(agenerator)
    assert all(f.maps_library_errors for f in (plain, coroutine, generator, agenerator))


def test_library_errors_become_gr_errors_and_others_pass():
    assert plain(3) == 3
    with pytest.raises(gr.Error, match="x must not be negative"):
        plain(-1)
    with pytest.raises(ValueError, match="a bug"):  # not the library's: Gradio shows its generic error
        plain(0)
    with pytest.raises(gr.Error) as info:
        asyncio.run(coroutine(-1))
    assert info.value.message == "No method 'x'; valid: macs"  # the message as the library wrote it
    with pytest.raises(gr.Error, match="ran out"):
        list(generator(2))

    async def drain():
        return [i async for i in agenerator(2)]

    with pytest.raises(gr.Error, match="ran out"):
        asyncio.run(drain())


def test_closing_a_wrapped_generator_early_closes_the_handler_at_once():
    closed.clear()
    gen = generator(5)
    assert next(gen) == 0
    gen.close()

    async def take_one_and_leave():
        agen = agenerator(5)
        assert await agen.__anext__() == 0
        await agen.aclose()

    asyncio.run(take_one_and_leave())
    assert closed == ["generator", "agenerator"]  # the handlers' finally ran (the app cancels the work there)


def test_results_and_updates_can_be_converted():
    assert wrap_handler(plain, lambda x: x * 10)(2) == 20
    assert next(wrap_handler(generator, str)(2)) == "0"
