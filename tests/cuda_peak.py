"""What was live at CUDA's peak: the allocations that made a measured peak, read from the caching allocator's history.

`torch.cuda.memory._record_memory_history` keeps every allocation and free with the Python stack that made it; the
trace of `torch.cuda.memory._snapshot()` replayed in order (`live_at_peak`) gives the blocks live at the moment the
allocated bytes were highest. A failing memory check names them (`allocation_history`), so that one run on a GPU
tells which part of a request its stated bytes leave out (issue #51: every method's CUDA peak was several times its
stated bytes).
The replay is plain Python over the trace's dicts and is tested on a CPU with a trace written by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

FREED = ("free_completed",)  # the allocator's allocated bytes drop when a block's free completes (after its streams)


def live_at_peak(trace: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """Replay a device trace: the highest sum of live allocations, and the allocations live at that moment.

    Args:
        trace: the events of one device, in order; each has "action", "addr" and "size" (and "frames").
    """
    live: dict[int, dict[str, Any]] = {}
    total = peak = 0
    at_peak: list[dict[str, Any]] = []
    for event in trace:
        action = event.get("action")
        if action == "alloc":
            old = live.pop(event["addr"], None)
            total += event["size"] - (old["size"] if old else 0)
            live[event["addr"]] = event
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif action in FREED and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
    return peak, sorted(at_peak, key=lambda e: -e["size"])


def where(event: dict[str, Any], prefer: tuple[str, ...] = ("explainer/", "transformers/")) -> str:
    """The frame that made an allocation: the innermost one in the project, else in transformers, else the first."""
    frames = event.get("frames") or []
    for part in prefer:
        for frame in frames:
            if part in str(frame.get("filename", "")):
                return f"{frame['filename'].split(part, 1)[-1]}:{frame.get('line')} {frame.get('name')}"
    if frames:
        return f"{frames[0].get('filename')}:{frames[0].get('line')} {frames[0].get('name')}"
    return "no stack"


def describe(peak: int, blocks: list[dict[str, Any]], top: int = 8) -> str:
    """The peak and its largest blocks, one line each: size in MB and where it was made."""
    lines = [f"{peak / 1e6:.1f} MB live at the peak, {len(blocks)} blocks; the largest:"]
    lines += [f"  {b['size'] / 1e6:8.2f} MB  {where(b)}" for b in blocks[:top]]
    return "\n".join(lines)


@contextlib.contextmanager
def allocation_history(device: int = 0) -> Iterator[dict[str, str]]:
    """CUDA's allocation history on for the block; afterwards the dict it yields holds "report": what was live at
    the block's peak (`describe`). Blocks made before the block (the weights, workspaces kept from earlier) are not in
    the history and not in the report."""
    import torch  # the helper is imported by tests that run without CUDA too

    memory = torch.cuda.memory
    out: dict[str, str] = {}
    memory._record_memory_history(max_entries=1_000_000)
    try:
        yield out
        torch.cuda.synchronize()
        traces = memory._snapshot().get("device_traces") or [[]]
        out["report"] = describe(*live_at_peak(traces[device] if device < len(traces) else []))
    finally:
        memory._record_memory_history(enabled=None)
