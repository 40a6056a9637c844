"""The one decorator through which the library's typed errors reach the visitor: `ExplainerError` -> `gr.Error`.

A user error (bad input, a file the gate refuses, a model that cannot load...) is the visitor's to fix, not a fault
of the server: it is logged as one INFO line on the `explainer.ui` logger (shown with `EXPLAINER_LOG=INFO`) and
Gradio is told not to print its traceback (`print_exception=False`). Any other exception is a real fault: it passes
through unchanged, and Gradio prints its traceback. The toast's text is escaped (`markup.html_text`): Gradio draws a
toast as HTML, and the message may quote what the visitor typed.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import gradio as gr

from explainer.errors import ExplainerError

from .markup import html_text

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("explainer.ui")


def user_error(e: ExplainerError, where: str = "") -> gr.Error:
    """The toast of a user error, its message escaped, logged as one INFO line and without Gradio's traceback."""
    log.info("user error%s: %s: %r", f" in {where}" if where else "", type(e).__name__, str(e))
    return gr.Error(html_text(e), print_exception=False)


def wrap_handler(fn: Callable[..., Any], convert: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """`fn` wrapped for Gradio: every result or yielded update passed through `convert` (None: as it is), and an
    `ExplainerError` (bad input, a model that cannot load, an unknown method...) raised as `gr.Error` with its message.

    The wrapper is of `fn`'s kind (plain, coroutine, generator or async generator function), because Gradio runs each
    kind differently, and carries `fn`'s signature (`functools.wraps`), from which Gradio injects `gr.Progress`. A
    wrapped generator that is closed early (the visitor cancelled or left) closes `fn`'s generator at once, so its
    `finally` cancels the library's work.
    """
    out = convert or (lambda item: item)
    name = getattr(fn, "__name__", "")
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            gen = fn(*args, **kwargs)
            try:
                async for item in gen:
                    yield out(item)
            except ExplainerError as e:
                raise user_error(e, name) from e
            finally:
                await gen.aclose()

    elif inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            gen = fn(*args, **kwargs)
            try:
                for item in gen:
                    yield out(item)
            except ExplainerError as e:
                raise user_error(e, name) from e
            finally:
                gen.close()

    elif inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return out(await fn(*args, **kwargs))
            except ExplainerError as e:
                raise user_error(e, name) from e

    else:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return out(fn(*args, **kwargs))
            except ExplainerError as e:
                raise user_error(e, name) from e

    wrapper.maps_library_errors = True  # copied onto outer `functools.wraps` wrappers: tests find it on every event
    return wrapper


def user_errors(fn: F) -> F:
    """Decorator for every handler: the library's typed errors become `gr.Error` (see `wrap_handler`)."""
    return wrap_handler(fn)  # type: ignore[return-value]
