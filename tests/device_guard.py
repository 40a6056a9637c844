"""Guards that catch device defects on a CPU: tensors created without `device=` and `.numpy()` outside `to_numpy`.

On a CPU-only machine a tensor created without `device=` silently lands on the right device, and `.numpy()` works on
every tensor; with the model on a GPU the first fails at its first use beside a device tensor ("Expected all tensors
to be on the same device") and the second raises. Two guards make both fail here:

- `numpy_calls` scans source text with `ast` for `.numpy()` calls and `from torch import <factory>` (which would
  escape the runtime guard);
- `factory_guard` replaces torch's tensor factories, process-wide (so in every thread: the library runs its methods
  in a worker thread, and `torch.set_default_device` is thread-local), by wrappers that send a tensor to the `meta`
  device when the calling frame's file is inside the library and no `device=` was given. Any later mix with a real
  tensor, or a read of its values, then fails at once. `Tensor.numpy` called from the library outside
  `explainer/runtime/host.py` raises too.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

LIBRARY = Path(__file__).resolve().parent.parent / "explainer"
HOST = LIBRARY / "runtime" / "host.py"

# torch factories that create a tensor on the default device unless given `device=`; `*_like` and `Tensor.new_*`
# inherit their argument's device and are not listed.
FACTORIES = (
    "zeros", "ones", "empty", "full", "arange", "range", "tensor", "as_tensor", "rand", "randn", "randint",
    "randperm", "eye", "linspace", "logspace", "empty_strided", "tril_indices", "triu_indices", "from_numpy",
    "scalar_tensor",
)  # fmt: skip


def in_library(filename: str) -> bool:
    """Whether a frame's file is part of `explainer/`."""
    try:
        return Path(filename).resolve().is_relative_to(LIBRARY)
    except (OSError, ValueError):
        return False


def numpy_calls(source: str, filename: str = "<source>") -> list[str]:
    """`file:line` of every `.numpy()` call and every `from torch import <factory>` in Python source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "numpy":
            found.append(f"{filename}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            if any(alias.name in FACTORIES for alias in node.names):
                found.append(f"{filename}:{node.lineno}")
    return found


def library_numpy_calls(root: Path = LIBRARY) -> list[str]:
    """`numpy_calls` over every module of the library except `host.py`, the one allowed conversion."""
    return [
        hit
        for path in sorted(root.rglob("*.py"))
        if path.resolve() != (root / HOST.relative_to(LIBRARY)).resolve()
        for hit in numpy_calls(path.read_text(encoding="utf-8"), str(path.relative_to(root.parent)))
    ]


def _guarded_factory(name: str, original: Callable, inside: Callable[[str], bool], hits: list[str]) -> Callable:
    @functools.wraps(original)
    def factory(*args, **kwargs):
        caller = sys._getframe(1)
        if kwargs.get("device") is None and inside(caller.f_code.co_filename):
            inherits = name == "as_tensor" and args and isinstance(args[0], torch.Tensor)
            if not inherits:
                hits.append(f"torch.{name} at {caller.f_code.co_filename}:{caller.f_lineno}")
                if name == "from_numpy":  # takes no device: its result is always on the CPU
                    return original(*args, **kwargs).to("meta")
                kwargs["device"] = "meta"
        return original(*args, **kwargs)

    return factory


@contextlib.contextmanager
def factory_guard(inside: Callable[[str], bool] = in_library) -> Iterator[list[str]]:
    """While the block runs, tensors that code in files accepted by `inside` creates without `device=` are put on
    the `meta` device, and `Tensor.numpy` called from such code (outside `host.py`) raises.

    Yields:
        The list of violations seen ("torch.zeros at file:line"), filled as they happen.
    """
    hits: list[str] = []
    originals = {name: getattr(torch, name) for name in FACTORIES}
    original_numpy = torch.Tensor.numpy

    def numpy(self, *args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        if inside(caller) and Path(caller).resolve() != HOST:
            hits.append(f"Tensor.numpy at {caller}")
            raise RuntimeError(f"Tensor.numpy() called in {caller}: use explainer.runtime.host.to_numpy")
        return original_numpy(self, *args, **kwargs)

    try:
        for name, original in originals.items():
            setattr(torch, name, _guarded_factory(name, original, inside, hits))
        torch.Tensor.numpy = numpy
        yield hits
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)
        torch.Tensor.numpy = original_numpy
