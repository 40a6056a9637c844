"""ZeroGPU emulated on a CPU, after `spaces` 0.51.3 (`spaces/zero/torch/patching.py`, `spaces/zero/decorator.py`,
`spaces/zero/wrappers.py`).

The real package cannot be imported with a CPU build of torch (it reads `torch.version.cuda` and checks for a bad
CUDA fork in a subprocess), so its effects on torch are reproduced by hand:

- `torch.cuda.is_available()` returns True in the whole process, `device_count()` 1, and the device's name,
  capability and properties are answered without CUDA, as the package does from its configuration;
- CUDA initialisation raises, as in ZeroGPU's main process: `spaces` replaces `torch._C._cuda_init`, which
  `torch.cuda._lazy_init` calls before any CUDA work (a `.to("cuda")`, a CUDA factory, `torch.cuda.mem_get_info`).
  A CPU build stops earlier in `_lazy_init` ("Torch not compiled with CUDA enabled"), so `_lazy_init` itself is
  replaced here, and raises "CUDA must not be initialized in the main process" (the message of the package's
  `patching_legacy.py`; its `patching.py` says "Low-level CUDA init reached"). Inits outside a GPU call are counted;
- a torch function mode, entered in the thread that imports `spaces` only (modes are per thread), intercepts
  `.to("cuda")`, `.cuda()` and factories with `device="cuda"`: the tensors stay where they are (the real package
  keeps them on the CPU and moves them when a GPU is attached). Elsewhere, `.to("cuda")` reaches `_lazy_init` and
  raises, as on ZeroGPU;
- `spaces.GPU(fn, duration=...)` runs the handler with the mode entered (in the real package a worker forked from
  the main process, with the GPU attached) and records the duration asked for (a number, or a function of the
  handler's arguments, which the real package calls in the main process before it forks).

`install()` applies all of it and returns the record: tensors moved per thread, GPU calls, durations asked for,
CUDA inits outside GPU calls, and whether a GPU call is running (`active`), which a forward hook can check.
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
        self.cuda_inits = 0  # CUDA initialisations tried outside a GPU call (each raised)
        self.cuda_init_threads: list[str] = []  # where they were tried


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
        if record.active == 0:
            record.cuda_inits += 1
            record.cuda_init_threads.append(threading.current_thread().name)
        raise RuntimeError(
            "CUDA must not be initialized in the main process on Spaces with Stateless GPU environment."
            + ("" if record.active == 0 else " (emulation: a GPU call is running, but this CPU build has no CUDA)")
        )

    torch._C._cuda_init = cuda_init_raise
    torch.cuda._lazy_init = cuda_init_raise  # a CUDA build calls `_cuda_init` from here; a CPU build would stop first
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *args: None
    # answered from the package's configuration (its first GPU), without CUDA; `mem_get_info` is not patched
    torch.cuda.get_device_name = lambda *args, **kwargs: "NVIDIA H200"
    torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
    torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=74_625_056_768, multi_processor_count=60
    )
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
