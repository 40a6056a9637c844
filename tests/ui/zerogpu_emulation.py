"""ZeroGPU emulated on a CPU, after `spaces` 0.51.3 (`spaces/zero/torch/patching.py`, `spaces/zero/decorator.py`).

The real package cannot be imported with a CPU build of torch (it reads `torch.version.cuda` and checks for a bad
CUDA fork in a subprocess), so its effects on torch are reproduced by hand:

- `torch.cuda.is_available()` returns True in the whole process, `device_count()` 1;
- CUDA initialisation (`torch._C._cuda_init`) raises, as in ZeroGPU's main process;
- a torch function mode, entered in the thread that imports `spaces` only (modes are per thread), intercepts
  `.to("cuda")`, `.cuda()` and factories with `device="cuda"`: the tensors stay where they are (the real package
  keeps them on the CPU and moves them when a GPU is attached). Elsewhere, `.to("cuda")` reaches this CPU build of
  torch and fails, as CUDA initialisation fails on ZeroGPU;
- `spaces.GPU(fn, duration=...)` runs the handler with the mode entered (in the real package a forked worker with
  the GPU attached) and records the duration asked for (a number, or a function of the handler's arguments).

`install()` applies all of it and returns the record: tensors moved per thread, GPU calls, durations asked for,
and whether a GPU call is running (`active`), which a forward hook can check.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class Record:
    def __init__(self) -> None:
        self.moved: dict[str, int] = {}  # thread name -> tensors moved to "cuda" (intercepted)
        self.durations: list[int] = []
        self.calls = 0
        self.active = 0  # GPU calls running now
        self.cuda_inits = 0


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)  # a bare index means a CUDA device


class ZeroGPUMode(TorchFunctionMode):
    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record

    def _moved(self) -> None:
        name = threading.current_thread().name
        self.record.moved[name] = self.record.moved.get(name, 0) + 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            self._moved()
            return args[0]
        if func is torch.Tensor.to and len(args) + len(kwargs) > 1:
            copy = kwargs.pop("copy", False)
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and device.type == "cuda":
                self._moved()
                device = None  # stays on the CPU, as the real package keeps it until a GPU is attached
            extra = {} if memory_format is None else {"memory_format": memory_format}
            return func(args[0], device, dtype, non_blocking=non_blocking, copy=copy, **extra)
        if _is_cuda(kwargs.get("device")):
            self._moved()
            kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)


def install() -> Record:
    """Patch torch as `spaces` does on ZeroGPU, enter the mode in this (the importing) thread, and register a fake
    `spaces` module. For a fresh process only: nothing is undone."""
    record = Record()

    def cuda_init_raise() -> None:
        record.cuda_inits += 1
        raise RuntimeError("CUDA must not be initialized in the main process on Spaces with Stateless GPU environment.")

    torch._C._cuda_init = cuda_init_raise
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.synchronize = lambda *args: None
    ZeroGPUMode(record).__enter__()  # this thread only, like the real package's mode

    def gpu(fn: Any = None, duration: Any = 60) -> Any:
        def decorate(f):
            def asked(*a, **k) -> int:
                return int(duration(*a, **k) if callable(duration) else duration)

            def enter(*a, **k) -> ZeroGPUMode:
                record.durations.append(asked(*a, **k))
                record.calls += 1
                record.active += 1
                mode = ZeroGPUMode(record)
                mode.__enter__()
                return mode

            def leave(mode: ZeroGPUMode) -> None:
                mode.__exit__(None, None, None)
                record.active -= 1

            if inspect.iscoroutinefunction(f):
                raise NotImplementedError("spaces.GPU does not take coroutine functions")
            if inspect.isgeneratorfunction(f):

                @functools.wraps(f)
                def gen(*a, **k):
                    mode = enter(*a, **k)
                    try:
                        yield from f(*a, **k)
                    finally:
                        leave(mode)

                return gen

            @functools.wraps(f)
            def call(*a, **k):
                mode = enter(*a, **k)
                try:
                    return f(*a, **k)
                finally:
                    leave(mode)

            return call

        return decorate(fn) if fn is not None else decorate

    spaces = types.ModuleType("spaces")
    spaces.GPU = gpu
    sys.modules["spaces"] = spaces
    return record
