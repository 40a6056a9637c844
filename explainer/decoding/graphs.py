"""The one place that records CUDA graphs of a decode step: the single request's static step (`static.py`) and the
batch's fixed-shape step (`batched/fixed.py`) both replay through a `StepGraph`.

A step is recorded once per key (the batch's slot state; one key for a single request) and replayed after:

- one real step runs first on a side stream (it loads every kernel and settles the allocator), then the next step
  is recorded, not run;
- the capture is `thread_local`: other models of the process may run meanwhile;
- an out-of-memory error is raised as it is (the request does not fit; the graph is not at fault);
- any other capture error is remembered for the model (`graph_failure`, which `choice.choose_path` reads: its later
  requests choose the eager fixed-shape step) and this step goes on eagerly.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Hashable

import torch

_failures: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> why its graph capture failed


def graph_failure(model: torch.nn.Module) -> str | None:
    """Why a CUDA graph capture failed on `model`, or None when none did."""
    return _failures.get(model)


class StepGraph:
    """A step's CUDA graph: recorded once per key, replayed, given up for eager steps when a capture fails.

    Attributes:
        enabled: whether the step runs as a graph (False from the start on the eager forms, and after a failure).
        key: what the recorded graph was recorded for (None before the first recording).
    """

    def __init__(self, model: torch.nn.Module, enabled: bool, fallback: str) -> None:
        """`fallback`: the warning's words for what runs after a failed capture, e.g. "decoding without graphs"."""
        self.model, self.enabled, self.fallback = model, enabled, fallback
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: Hashable | None = None

    def replay(self, key: Hashable = None) -> bool:
        """Replay the graph recorded for `key`; False (nothing run) when none is."""
        if self.graph is None or self.key != key:
            return False
        self.graph.replay()
        return True

    def record(
        self,
        device: torch.device,
        warm_up: Callable[[], None],
        step: Callable[[], None],
        key: Callable[[], Hashable] = lambda: None,
    ) -> None:
        """`warm_up()` (one real step) on a side stream, then `step()` recorded, not run, for `key()` (asked after the
        warm-up, which may change it); where the capture fails the model is remembered and `enabled` is False.

        Raises:
            torch.cuda.OutOfMemoryError: the step does not fit (not the graph's fault).
        """
        self.graph = self.key = None
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            warm_up()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other models may run meanwhile
                step()
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as e:  # an op that cannot be captured: the same step, eagerly
            _failures[self.model] = f"{type(e).__name__}: {e}"
            warnings.warn(f"CUDA graph capture failed, {self.fallback}: {e}", RuntimeWarning, stacklevel=3)
            self.enabled = False
            return
        self.graph, self.key = graph, key()
