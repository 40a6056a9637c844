"""The machine's facts from the environment (`zero_gpu`, `env_flag`), and optional ZeroGPU support for the app's
handlers: `on_gpu(handler)`.

On a Hugging Face Space with ZeroGPU hardware, a GPU is attached only while a function decorated with `spaces.GPU`
runs; the `spaces` package provides the decorator (and is absent elsewhere). `on_gpu` applies it when `spaces` can be
imported and returns the handler itself when it cannot, so nothing changes outside a Space.

`spaces.GPU` (checked against spaces 0.51) runs the function in a forked worker that holds the GPU and sends its
results back pickled. It takes plain and generator functions, raises NotImplementedError for coroutine functions,
and treats an async generator function as a plain one, whose return value, an async generator object, cannot be
pickled. The app's streaming handlers are async generators, so on ZeroGPU (`zero_gpu`: SPACES_ZERO_GPU set, which
`spaces` reads too) they are first turned into plain generators by `sync_generator`. Elsewhere `spaces.GPU` returns
its argument unchanged, and the async handler is passed as it is, keeping Gradio's cancellation of async handlers.

This module does not import gradio; `spaces` imports it, which only happens in the app.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .precision import cpu_has_native_bf16

ZERO_GPU_SECONDS = 120  # GPU time asked for per call when no estimate is given
GPU_SECONDS_BOUNDS = (20, 300)  # a call asks for at least / at most this (ZeroGPU quotas are counted in asked time)


def gpu_duration(estimated_seconds: float | None) -> int:
    """Seconds to ask ZeroGPU for a call estimated at `estimated_seconds`: 1.5x plus 10 s of margin, within
    `GPU_SECONDS_BOUNDS`; `ZERO_GPU_SECONDS` when there is no estimate."""
    if estimated_seconds is None:
        return ZERO_GPU_SECONDS
    low, high = GPU_SECONDS_BOUNDS
    return int(min(high, max(low, 1.5 * estimated_seconds + 10)))


ZERO_GPU_ENV = "SPACES_ZERO_GPU"  # set on a ZeroGPU Space (`spaces` reads it too); read here only
TRUE_WORDS = ("1", "t", "true", "yes", "on")  # the values a flag variable counts as set with, in any case


def env_flag(name: str) -> bool:
    """Whether the environment variable `name` is set to one of `TRUE_WORDS` (case and spaces ignored)."""
    return os.environ.get(name, "").strip().lower() in TRUE_WORDS


def zero_gpu() -> bool:
    """Whether this process runs on ZeroGPU hardware: `ZERO_GPU_ENV` is set (`env_flag`). The one place that reads
    it: the default models, the memory figures, the app's preload and `on_gpu` all ask here."""
    return env_flag(ZERO_GPU_ENV)


def hardware_name() -> str:
    """What runs the models, for the start-up log: "ZeroGPU", "GPU (<name>)", "CPU with native bf16" or "CPU
    without native bf16". On ZeroGPU nothing is asked of CUDA (its main process must not initialise it)."""
    if zero_gpu():
        return "ZeroGPU"
    import torch

    if torch.cuda.is_available():
        return f"GPU ({torch.cuda.get_device_name(0)})"
    return f"CPU {'with' if cpu_has_native_bf16() else 'without'} native bf16"


def sync_generator(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., Iterator[Any]]:
    """A generator function that runs the async generator function `fn` on an event loop of its own.

    Each `next()` runs the loop until `fn` yields; when the consumer stops early (or fails), the async generator is
    closed on that loop, so its `finally` blocks run (the app's cancel the library's work there). The signature,
    name and docstring are `fn`'s (`functools.wraps`), so Gradio still sees the handler's parameters.
    """

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Iterator[Any]:
        loop = asyncio.new_event_loop()
        agen = fn(*args, **kwargs)
        try:
            while True:
                try:
                    item = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            try:
                loop.run_until_complete(agen.aclose())
            finally:
                loop.close()

    return run


def on_gpu(fn: Callable[..., Any], seconds: int | Callable[..., int] = ZERO_GPU_SECONDS) -> Callable[..., Any]:
    """`spaces.GPU(fn, duration=seconds)` when the `spaces` package is importable, else `fn` itself.

    `seconds` is a number or, as `spaces` accepts, a function of the handler's arguments that returns one (the
    app's come from the time estimates, `gpu_duration`). On ZeroGPU an async generator function is passed through
    `sync_generator` first (see the module docstring).
    """
    try:
        import spaces
    except ImportError:
        return fn
    if zero_gpu() and inspect.isasyncgenfunction(fn):
        fn = sync_generator(fn)
    return spaces.GPU(fn, duration=seconds)
